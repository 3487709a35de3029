/* The head/worker wire protocol: protobuf-c header frames, zero-copy payload frames, strict decoding. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>
#include <zmq.h>

#include "lazy.h"
#include "wire.h"
#include "wire.pb-c.h"

/* Bytes protobuf-c may allocate while unpacking one header (it has no limits of its own). */
enum { DECODE_BUDGET = 64 << 20 };
/* String limits (bytes, excluding the NUL). */
/* Keys have no limit of their own (tar paths); this one only bounds what a peer may send. */
enum { KEY_MAX = 65535, NAME_MAX_ = SF_FIELD_NAME_MAX - 1, URL_MAX = 4095 };

_Static_assert((int)SF_WIRE_HELLO == (int)SF_WIRE__MESSAGE_TYPE__HELLO &&
                   (int)SF_WIRE_EPOCH_END == (int)SF_WIRE__MESSAGE_TYPE__EPOCH_END,
               "sf_wire_type and wire.proto's MessageType must agree");

static atomic_uint_fast64_t copied_sent, copied_received;

const char *sf_wire_type_name(sf_wire_type type) {
  switch (type) {
  case SF_WIRE_HELLO: return "HELLO";
  case SF_WIRE_WELCOME: return "WELCOME";
  case SF_WIRE_CREDIT: return "CREDIT";
  case SF_WIRE_UNIT: return "UNIT";
  case SF_WIRE_RESULT: return "RESULT";
  case SF_WIRE_HEARTBEAT: return "HEARTBEAT";
  case SF_WIRE_ERROR: return "ERROR";
  case SF_WIRE_BYE: return "BYE";
  case SF_WIRE_EPOCH_END: return "EPOCH_END";
  }
  return "?";
}

void sf_wire_copy_stats(uint64_t *sent, uint64_t *received) {
  if (sent) *sent = atomic_load(&copied_sent);
  if (received) *received = atomic_load(&copied_received);
}

void sf_wire_message_clear(sf_wire_message *msg) {
  if (!msg) return;
  for (int i = 0; msg->samples && i < msg->n_samples; i++) sf_sample_destroy(&msg->samples[i]);
  free(msg->samples);
  free(msg->text);
  free(msg->errors);
  free(msg->stats);
  sf_graph_destroy(&msg->stages);
  memset(msg, 0, sizeof *msg);
}

static bool carries_samples(int type) { return type == SF_WIRE_UNIT || type == SF_WIRE_RESULT; }
static bool carries_errors(int type) { return type == SF_WIRE_RESULT || type == SF_WIRE_ERROR; }
static bool carries_stats(int type) { return type == SF_WIRE_HEARTBEAT || type == SF_WIRE_RESULT; }
static bool carries_text(int type) { return type == SF_WIRE_HELLO || type == SF_WIRE_WELCOME || type == SF_WIRE_BYE; }

/* Byte size of a C-contiguous tensor of this dtype and shape; false when it does not fit in int64/size_t. */
static bool shape_bytes(sf_dtype dtype, int ndim, const int64_t *shape, uint64_t *bytes) {
  uint64_t n = sf_dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return false;
    if (shape[i] > 0 && n > (uint64_t)INT64_MAX / (uint64_t)shape[i]) return false;
    n *= (uint64_t)shape[i];
  }
  if (n > SIZE_MAX) return false;
  *bytes = n;
  return true;
}

/* ------------------------------------------------------------------------------------------------ */
/* Decoding                                                                                         */

/* A protobuf-c allocator that refuses to go past a fixed total: a hostile header cannot make it allocate gigabytes. */
typedef struct budget {
  size_t used, limit;
  bool exceeded;
} budget;

static void *budget_alloc(void *data, size_t size) {
  budget *b = data;
  if (size > b->limit - b->used) {
    b->exceeded = true;
    return NULL;
  }
  void *p = malloc(size);
  if (p) b->used += size;
  return p;
}

static void budget_free(void *data, void *p) { free(p); }

static int check_string(const char *s, size_t max, const char *what, int type, sf_error *error) {
  size_t n = strnlen(s, max + 1);
  if (n > max)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: %s message: %s is longer than %zu bytes; a peer of another version or not shardflow",
                        sf_wire_type_name(type), what, max);
  return 0;
}

/* Checks one sample's metadata against the limits and marks the frames it uses in `used`. */
static int check_sample(const SfWire__SampleMeta *s, size_t i, int type, int n_frames, uint8_t *used, sf_error *error) {
  const char *tname = sf_wire_type_name(type);
  size_t klen = strnlen(s->key, KEY_MAX + 1);
  if (klen > KEY_MAX)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message: sample %zu has a key longer than %d bytes",
                        tname, i, KEY_MAX);
  if (strnlen(s->url, URL_MAX + 1) > URL_MAX)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                        "wire: %s message: sample %zu has a URL longer than %d bytes", tname, i, URL_MAX);
  if (s->same_url && (i == 0 || s->url[0]))
    return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key), "wire: %s message: sample %zu says same_url but %s",
                        tname, i, i == 0 ? "it is the first sample" : "also carries a URL");
  if (s->n_fields > SF_MAX_FIELDS)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                        "wire: %s message: sample %zu has %zu fields; at most %d are allowed", tname, i, s->n_fields,
                        SF_MAX_FIELDS);
  for (size_t j = 0; j < s->n_fields; j++) {
    const SfWire__FieldMeta *f = s->fields[j];
    if (strnlen(f->name, NAME_MAX_ + 1) > NAME_MAX_)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field %zu has a name longer than %d bytes", tname, i, j,
                          NAME_MAX_);
    for (size_t k = 0; k < j; k++)
      if (strcmp(s->fields[k]->name, f->name) == 0)
        return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                            "wire: %s message: sample %zu has two fields named '%s'", tname, i, f->name);
    if (f->dtype >= SF_DTYPE_COUNT_)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field '%s' has dtype %u; known dtypes are 0..%d", tname, i,
                          f->name, f->dtype, SF_DTYPE_COUNT_ - 1);
    if (f->n_shape > SF_TENSOR_MAX_DIMS)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field '%s' has %zu dimensions; at most %d", tname, i, f->name,
                          f->n_shape, SF_TENSOR_MAX_DIMS);
    uint64_t bytes;
    for (size_t d = 0; d < f->n_shape; d++)
      if (f->shape[d] < 0)
        return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                            "wire: %s message: sample %zu field '%s' has a negative dimension (%lld)", tname, i,
                            f->name, (long long)f->shape[d]);
    if (!shape_bytes((sf_dtype)f->dtype, (int)f->n_shape, f->shape, &bytes))
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field '%s': the byte size of its shape overflows", tname, i,
                          f->name);
    if (f->encoded && (f->dtype != SF_DTYPE_UINT8 || f->n_shape != 1))
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field '%s' is encoded but not uint8 with one dimension", tname,
                          i, f->name);
    if (f->no_data) {
      if (f->encoded || f->frame != 0)
        return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                            "wire: %s message: sample %zu field '%s' has no data but %s", tname, i, f->name,
                            f->encoded ? "is marked encoded" : "names a frame");
      continue;
    }
    if (f->frame >= (uint32_t)n_frames)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field '%s' names frame %u; the message has %d", tname, i,
                          f->name, f->frame, n_frames);
    if (used[f->frame])
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field '%s' names frame %u, which another field uses", tname, i,
                          f->name, f->frame);
    used[f->frame] = 1;
  }
  return 0;
}

/* WELCOME's stages: counts and string lengths within the limits, replicas positive. */
static int check_stages(const SfWire__Welcome *w, sf_error *error) {
  if (w->n_stages > SF_WIRE_MAX_STAGES)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: WELCOME message has %zu stages; at most %d are allowed",
                        w->n_stages, SF_WIRE_MAX_STAGES);
  if (strnlen(w->graph_path, 4096) >= 4096)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: WELCOME message: graph path of 4096 bytes or more");
  if (w->n_plugins > SF_WIRE_MAX_STAGES)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: WELCOME message has %zu plugins; at most %d are allowed",
                        w->n_plugins, SF_WIRE_MAX_STAGES);
  for (size_t i = 0; i < w->n_plugins; i++)
    if (!w->plugins[i]->name[0] || strnlen(w->plugins[i]->name, 4096) >= 4096 ||
        strnlen(w->plugins[i]->build_id, 4096) >= 4096)
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                          "wire: WELCOME message: plugin %zu has an empty name, or a name or build_id of 4096 bytes or more", i);
  for (size_t i = 0; i < w->n_stages; i++) {
    const SfWire__StageNode *s = w->stages[i];
    if (strnlen(s->type, SF_WIRE_MAX_NAME) >= SF_WIRE_MAX_NAME || strnlen(s->name, SF_WIRE_MAX_NAME) >= SF_WIRE_MAX_NAME ||
        !s->type[0] || !s->name[0])
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                          "wire: WELCOME message: stage %zu has an empty type or name, or one of %d bytes or more", i,
                          SF_WIRE_MAX_NAME);
    if (s->replicas < 1 || s->replicas > 1024)
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: WELCOME message: stage %zu has %lld replicas", i,
                          (long long)s->replicas);
    if (s->n_options > SF_WIRE_MAX_OPTIONS)
      return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: WELCOME message: stage %zu has %zu options; at most %d",
                          i, s->n_options, SF_WIRE_MAX_OPTIONS);
    for (size_t j = 0; j < s->n_options; j++)
      if (strnlen(s->options[j]->key, SF_WIRE_MAX_NAME) >= SF_WIRE_MAX_NAME || !s->options[j]->key[0] ||
          strnlen(s->options[j]->value, SF_WIRE_MAX_TEXT + 1) > SF_WIRE_MAX_TEXT)
        return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                            "wire: WELCOME message: stage %zu option %zu has an empty or over-long key or value", i, j);
  }
  return 0;
}

/* Everything about a header that can be checked without the frames' sizes. */
static int check_header(const SfWire__Header *h, int n_frames, uint8_t *used, sf_error *error) {
  int type = (int)h->type;
  /* A BYE reads across versions (fields 1, 2 and 7 never change): a head can tell an old worker why it is refused. */
  if (h->version != SF_WIRE_VERSION && type != SF_WIRE_BYE)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: the peer speaks wire version %u, this shardflow %d: run the same shardflow "
                        "version on the head and its workers",
                        h->version, SF_WIRE_VERSION);
  if (type < SF_WIRE_HELLO || type > SF_WIRE_EPOCH_END)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: unknown message type %d", type);
  const char *tname = sf_wire_type_name(type);
  if (h->text[0] && !carries_text(type))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message carries text; only HELLO, WELCOME and BYE do",
                        tname);
  if (strnlen(h->text, SF_WIRE_MAX_TEXT + 1) > SF_WIRE_MAX_TEXT)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message: text longer than %d bytes", tname,
                        SF_WIRE_MAX_TEXT);
  if ((h->welcome != NULL) != (type == SF_WIRE_WELCOME))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message %s run settings", tname,
                        type == SF_WIRE_WELCOME ? "without" : "with");
  if (h->welcome) {
    const SfWire__Welcome *w = h->welcome;
    if (w->world_size < 1 || w->rank < 0 || w->rank >= w->world_size)
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                          "wire: WELCOME message: rank %d of world size %d is out of range", (int)w->rank,
                          (int)w->world_size);
    if (w->error_policy < 0)
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: WELCOME message: error policy %d is out of range",
                          (int)w->error_policy);
    if (!isfinite(w->heartbeat_interval) || !isfinite(w->heartbeat_timeout) || w->heartbeat_interval < 0 ||
        w->heartbeat_timeout < 0)
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                          "wire: WELCOME message: heartbeat interval %g s / timeout %g s are not "
                          "non-negative numbers",
                          w->heartbeat_interval, w->heartbeat_timeout);
    int r = check_stages(w, error);
    if (r < 0) return r;
  }
  if (h->n_samples && !carries_samples(type))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message carries samples; only UNIT and RESULT do",
                        tname);
  if (h->n_samples > SF_WIRE_MAX_SAMPLES)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message has %zu samples; at most %d are allowed",
                        tname, h->n_samples, SF_WIRE_MAX_SAMPLES);
  if (h->n_errors && !carries_errors(type))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: %s message carries error records; only RESULT and ERROR do", tname);
  if (h->n_errors > SF_WIRE_MAX_ERRORS)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message has %zu error records; at most %d are allowed",
                        tname, h->n_errors, SF_WIRE_MAX_ERRORS);
  if (h->n_stats && !carries_stats(type))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: %s message carries stage statistics; only HEARTBEAT and RESULT do", tname);
  if (h->n_stats > SF_WIRE_MAX_STATS)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE,
                        "wire: %s message has %zu stage statistics; at most %d are allowed", tname, h->n_stats,
                        SF_WIRE_MAX_STATS);
  if (h->n_shm && type != SF_WIRE_RESULT)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: %s message carries shared-memory extents; only RESULT does", tname);
  if (h->shm_freed && type != SF_WIRE_UNIT && type != SF_WIRE_HEARTBEAT)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: %s message releases shared memory; only UNIT and HEARTBEAT do", tname);
  sf_error tmp;
  for (size_t i = 0; i < h->n_errors; i++) {
    const SfWire__ErrorRecord *e = h->errors[i];
    if (e->code >= 0)
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                          "wire: %s message: error record %zu has code %d; codes are negative", tname, i, (int)e->code);
    int r;
    if ((r = check_string(e->stage, sizeof tmp.stage - 1, "an error record's stage", type, error)) < 0 ||
        (r = check_string(e->url, sizeof tmp.url - 1, "an error record's URL", type, error)) < 0 ||
        (r = check_string(e->key, sizeof tmp.key - 1, "an error record's key", type, error)) < 0 ||
        (r = check_string(e->message, sizeof tmp.message - 1, "an error record's message", type, error)) < 0)
      return r;
  }
  for (size_t i = 0; i < h->n_stats; i++) {
    int r = check_string(h->stats[i]->name, sizeof(((sf_wire_stage_stats *)0)->name) - 1, "a stage name", type, error);
    if (r < 0) return r;
  }
  for (size_t i = 0; i < h->n_samples; i++) {
    int r = check_sample(h->samples[i], i, type, n_frames, used, error);
    if (r < 0) return r;
  }
  for (int i = 0; i < n_frames; i++)
    if (!used[i])
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message: payload frame %d of %d belongs to no field",
                          tname, i, n_frames);
  return 0;
}

/* Checks a field's frame size against its shape and builds its tensor (a view of the frame, or an aligned copy). */
static int build_field(sf_sample *out, const SfWire__FieldMeta *f, size_t i, int type, sf_buffer *const *frames,
                       sf_error *error) {
  sf_tensor t;
  int64_t shape[SF_TENSOR_MAX_DIMS];
  for (size_t d = 0; d < f->n_shape; d++) shape[d] = f->shape[d];
  sf_dtype dtype = (sf_dtype)f->dtype;
  int ndim = (int)f->n_shape;
  if (f->no_data) {
    if (sf_tensor_set_shape(&t, dtype, ndim, shape) < 0)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = out->key), "wire: sample %zu field '%s': bad shape", i,
                          f->name);
  } else {
    sf_buffer *frame = frames[f->frame];
    uint64_t bytes = 0;
    shape_bytes(dtype, ndim, shape, &bytes);
    if (bytes != sf_buffer_size(frame))
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = out->key),
                          "wire: %s message: sample %zu field '%s' (%s, %d dimensions) needs %llu "
                          "bytes but its frame %u has %zu",
                          sf_wire_type_name(type), i, f->name, sf_dtype_name(dtype), ndim, (unsigned long long)bytes,
                          f->frame, sf_buffer_size(frame));
    sf_buffer *b;
    size_t align = sf_dtype_size(dtype);
    if ((uintptr_t)sf_buffer_data(frame) % align == 0) {
      b = sf_buffer_ref(frame);
    } else {
      /* libzmq stores small received frames inside its 8 KiB receive batch at any offset; typed loads need alignment. */
      b = sf_buffer_new(bytes);
      if (!b)
        return sf_error_set(error, SF_ENOMEM, SF_AT(.key = out->key), "wire: out of memory copying field '%s'",
                            f->name);
      memcpy(sf_buffer_data(b), sf_buffer_data(frame), bytes);
      atomic_fetch_add(&copied_received, bytes);
    }
    int r = sf_tensor_view(&t, dtype, ndim, shape, b, 0);
    if (r < 0)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = out->key), "wire: sample %zu field '%s': bad shape", i,
                          f->name);
  }
  if (!sf_sample_add_field(out, f->name, f->encoded, &t))
    return sf_error_set(error, SF_EINTERNAL, SF_AT(.key = out->key), "wire: sample %zu: cannot add field '%s'", i,
                        f->name);
  return 0;
}

static int build_sample(sf_wire_message *msg, const SfWire__SampleMeta *s, size_t i, int type,
                        sf_buffer *const *frames, sf_error *error) {
  sf_sample *out = sf_sample_new();
  if (!out) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory decoding sample %zu", i);
  msg->samples[msg->n_samples++] = out;
  if (sf_sample_set_key(out, s->key, strlen(s->key)) < 0)
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory decoding sample %zu", i);
  out->epoch = s->epoch;
  out->shard_index = s->shard_index;
  out->index = s->index;
  out->pass = s->pass;
  out->offset = s->offset;
  if (s->same_url) {
    out->url = sf_buffer_ref(msg->samples[i - 1]->url);
  } else if (s->url[0]) {
    size_t n = strlen(s->url);
    out->url = sf_buffer_new(n + 1);
    if (!out->url)
      return sf_error_set(error, SF_ENOMEM, SF_AT(.key = s->key), "wire: out of memory decoding sample %zu", i);
    memcpy(sf_buffer_data(out->url), s->url, n + 1);
  }
  for (size_t j = 0; j < s->n_fields; j++) {
    int r = build_field(out, s->fields[j], i, type, frames, error);
    if (r < 0) return r;
  }
  return 0;
}

/* WELCOME's stages as a graph of their own: the nodes as the head read them, with its file and lines. */
static sf_graph *stages_graph(const SfWire__Welcome *w) {
  sf_graph *g = sf_graph_new_empty(w->graph_path[0] ? w->graph_path : NULL);
  for (size_t i = 0; g && i < w->n_stages; i++) {
    const SfWire__StageNode *s = w->stages[i];
    sf_graph_node *n = sf_graph_add_node(g, s->name, s->type, s->line);
    if (!n) {
      sf_graph_destroy(&g);
      break;
    }
    n->replicas = s->replicas;
    n->replicas_line = s->replicas_line;
    for (size_t j = 0; j < s->n_options; j++)
      if (sf_graph_node_set(n, s->options[j]->key, s->options[j]->value, s->options[j]->line) < 0) {
        sf_graph_destroy(&g);
        break;
      }
  }
  for (size_t i = 0; g && i < w->n_plugins; i++)
    if (sf_graph_add_plugin(g, w->plugins[i]->name, w->plugins[i]->line) < 0 ||
        !(g->plugins[g->n_plugins - 1].build_id = strdup(w->plugins[i]->build_id)))
      sf_graph_destroy(&g);
  return g;
}

static int build_message(const SfWire__Header *h, sf_buffer *const *frames, sf_wire_message *msg, sf_error *error) {
  msg->type = (sf_wire_type)h->type;
  int type = (int)h->type;
  if (carries_text(type)) {
    msg->text = strdup(h->text);
    if (!msg->text) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
  }
  switch (type) {
  case SF_WIRE_HELLO:
    msg->pid = h->pid;
    msg->threads = h->threads;
    break;
  case SF_WIRE_WELCOME:
    msg->threads = h->threads;
    msg->seed = h->welcome->seed;
    msg->epochs = h->welcome->epochs;
    msg->rank = h->welcome->rank;
    msg->world_size = h->welcome->world_size;
    msg->error_policy = h->welcome->error_policy;
    msg->heartbeat_interval = h->welcome->heartbeat_interval;
    msg->heartbeat_timeout = h->welcome->heartbeat_timeout;
    if (!(msg->stages = stages_graph(h->welcome)))
      return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
    break;
  case SF_WIRE_CREDIT: msg->credits = h->credits; break;
  case SF_WIRE_UNIT: msg->unit = h->unit; msg->epoch = h->epoch; msg->shm_freed = h->shm_freed; break;
  case SF_WIRE_RESULT:
    msg->unit = h->unit;
    msg->epoch = h->epoch;
    msg->samples_in = h->samples_in;
    msg->skipped = h->skipped;
    msg->filtered = h->filtered;
    break;
  case SF_WIRE_HEARTBEAT: msg->sequence = h->sequence; msg->shm_freed = h->shm_freed; break;
  case SF_WIRE_EPOCH_END: msg->epoch = h->epoch; break;
  default: break;
  }
  if (h->n_errors) {
    msg->errors = calloc(h->n_errors, sizeof *msg->errors);
    if (!msg->errors) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
    for (size_t i = 0; i < h->n_errors; i++) {
      const SfWire__ErrorRecord *e = h->errors[i];
      sf_error *d = &msg->errors[i];
      d->code = e->code;
      d->offset = e->offset;
      d->line = e->line;
      memcpy(d->stage, e->stage, strlen(e->stage) + 1);
      memcpy(d->url, e->url, strlen(e->url) + 1);
      memcpy(d->key, e->key, strlen(e->key) + 1);
      memcpy(d->message, e->message, strlen(e->message) + 1);
    }
    msg->n_errors = (int)h->n_errors;
  }
  if (h->n_stats) {
    msg->stats = calloc(h->n_stats, sizeof *msg->stats);
    if (!msg->stats) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
    for (size_t i = 0; i < h->n_stats; i++) {
      const SfWire__StageStats *s = h->stats[i];
      sf_wire_stage_stats *d = &msg->stats[i];
      memcpy(d->name, s->name, strlen(s->name) + 1);
      d->items = s->items;
      d->bytes = s->bytes;
      d->busy_ns = s->busy_ns;
      d->wait_ns = s->wait_ns;
      d->errors = s->errors;
    }
    msg->n_stats = (int)h->n_stats;
  }
  if (h->n_samples) {
    msg->samples = calloc(h->n_samples, sizeof *msg->samples);
    if (!msg->samples) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
    for (size_t i = 0; i < h->n_samples; i++) {
      int r = build_sample(msg, h->samples[i], i, type, frames, error);
      if (r < 0) return r;
    }
  }
  return 0;
}

/* Appends views of the header's shared-memory extents to frames[0 .. n_frames): the fields name both alike. */
static int ring_frames(const SfWire__Header *h, sf_shm_ring *ring, sf_buffer *const *frames, int n_frames,
                       sf_buffer ***all, sf_error *error) {
  if (!ring)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: a message with shared-memory extents from a peer without a ring");
  if (h->n_shm > (size_t)(SF_WIRE_MAX_FRAMES - n_frames))
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %d payload frames and %zu extents; at most %d in all",
                        n_frames, h->n_shm, SF_WIRE_MAX_FRAMES);
  sf_buffer **a = calloc((size_t)n_frames + h->n_shm, sizeof *a);
  if (!a) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
  *all = a;
  for (int i = 0; i < n_frames; i++) a[i] = frames[i];
  for (size_t i = 0; i < h->n_shm; i++) {
    int r = sf_shm_ring_view(ring, h->shm[i]->position, h->shm[i]->length, &a[n_frames + i], error);
    if (r < 0) return r;
  }
  return 0;
}

/* sf_wire_decode, with the ring of the peer that sent it (NULL: none; extents are refused). */
static int decode(const uint8_t *header, size_t header_len, sf_buffer *const *frames, int n_frames,
                  sf_shm_ring *ring, sf_wire_message *msg, sf_error *error) {
  sf_wire_peer peer = msg->peer; /* sf_wire_recv has filled it in already */
  memset(msg, 0, sizeof *msg);
  msg->peer = peer;
  if (header_len > SF_WIRE_MAX_HEADER)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: header frame of %zu bytes; at most %d are allowed",
                        header_len, SF_WIRE_MAX_HEADER);
  if (n_frames < 0 || n_frames > SF_WIRE_MAX_FRAMES)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %d payload frames; at most %d are allowed", n_frames,
                        SF_WIRE_MAX_FRAMES);
  if (!header && header_len) return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "wire: no header");
  budget b = {.limit = DECODE_BUDGET};
  ProtobufCAllocator allocator = {.alloc = budget_alloc, .free = budget_free, .allocator_data = &b};
  SfWire__Header *h = sf_wire__header__unpack(&allocator, header_len, header);
  if (!h) {
    if (b.exceeded)
      return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE,
                          "wire: the header frame (%zu bytes) would need more than %d MiB to decode", header_len,
                          DECODE_BUDGET >> 20);
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: the header frame (%zu bytes) is not a valid sf_wire.Header; is the peer "
                        "a shardflow of the same version?",
                        header_len);
  }
  sf_buffer **all = NULL;
  int r = 0;
  if (h->n_shm) {
    r = ring_frames(h, ring, frames, n_frames, &all, error);
    frames = all;
    n_frames += (int)h->n_shm;
  }
  uint8_t *used = r == 0 ? calloc(n_frames ? (size_t)n_frames : 1, 1) : NULL;
  if (r == 0)
    r = used ? check_header(h, n_frames, used, error)
             : sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
  if (r == 0) r = build_message(h, frames, msg, error);
  for (int i = 0; r == 0 && i < n_frames; i++)
    *(i < n_frames - (int)h->n_shm ? &msg->frame_bytes : &msg->ring_bytes) += sf_buffer_size(frames[i]);
  free(used);
  if (all) { /* the fields hold references of their own to the views they use */
    for (size_t i = 0; i < h->n_shm; i++) sf_buffer_unref(&all[n_frames - (int)h->n_shm + (int)i]);
    free(all);
  }
  sf_wire__header__free_unpacked(h, &allocator);
  if (r < 0) {
    sf_wire_message_clear(msg);
    msg->peer = peer;
  }
  return r;
}

int sf_wire_decode(const uint8_t *header, size_t header_len, sf_buffer *const *frames, int n_frames,
                   sf_wire_message *msg, sf_error *error) {
  return decode(header, header_len, frames, n_frames, NULL, msg, error);
}

/* ------------------------------------------------------------------------------------------------ */
/* Receiving                                                                                        */

/* The endpoint a socket was last bound or connected to, for error messages. */
static void socket_endpoint(void *socket, char *buf, size_t size) {
  buf[0] = '\0';
  size_t n = size;
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &n) != 0) buf[0] = '\0';
  buf[size - 1] = '\0';
}

static int zmq_failure(void *socket, const char *what, sf_error *error) {
  int e = zmq_errno();
  char endpoint[256];
  socket_endpoint(socket, endpoint, sizeof endpoint);
  return sf_error_set(error, SF_ENET, SF_AT(.url = endpoint), "wire: %s failed: %s", what, zmq_strerror(e));
}

/* sf_buffer free function of a received frame: closes and frees its heap zmq_msg_t. */
static void free_frame(void *opaque, uint8_t *data) {
  zmq_msg_t *m = opaque;
  zmq_msg_close(m);
  free(m);
}

/* Receives and discards the rest of a multipart message. */
static void drain(void *socket, bool more) {
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, socket, 0) < 0) {
      zmq_msg_close(&m);
      return;
    }
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
}

int sf_wire_recv(void *socket, bool routed, sf_wire_message *msg, int flags, sf_error *error) {
  return sf_wire_recv_ring(socket, routed, NULL, NULL, msg, flags, error);
}

int sf_wire_recv_ring(void *socket, bool routed, sf_wire_ring_fn ring_of, void *opaque, sf_wire_message *msg,
                      int flags, sf_error *error) {
  memset(msg, 0, sizeof *msg);
  zmq_msg_t part;
  zmq_msg_init(&part);
  if (zmq_msg_recv(&part, socket, flags) < 0) {
    zmq_msg_close(&part);
    if (zmq_errno() == EAGAIN) return SF_EAGAIN;
    return zmq_failure(socket, "receiving a message", error);
  }
  bool more = zmq_msg_more(&part);
  if (routed) {
    size_t n = zmq_msg_size(&part);
    if (n > sizeof msg->peer.id) n = sizeof msg->peer.id;
    memcpy(msg->peer.id, zmq_msg_data(&part), n);
    msg->peer.len = n;
    zmq_msg_close(&part);
    zmq_msg_init(&part);
    /* The other parts of a multipart message arrive together with the first: no wait. */
    if (!more || zmq_msg_recv(&part, socket, 0) < 0) {
      zmq_msg_close(&part);
      if (!more) {
        char endpoint[256];
        socket_endpoint(socket, endpoint, sizeof endpoint);
        return sf_error_set(error, SF_EFORMAT, SF_AT(.url = endpoint), "wire: a message with no header frame");
      }
      return zmq_failure(socket, "receiving a message", error);
    }
    more = zmq_msg_more(&part);
  }
  /* The header frame in `part`; the payload frames follow, each kept in its own heap zmq_msg_t. */
  sf_buffer **frames = NULL;
  int n_frames = 0, capacity = 0, r = 0;
  long long extra = 0;
  while (more) {
    zmq_msg_t *m = malloc(sizeof *m);
    if (!m || (n_frames == capacity && n_frames < SF_WIRE_MAX_FRAMES)) {
      int cap = capacity ? capacity * 2 : 16;
      if (cap > SF_WIRE_MAX_FRAMES) cap = SF_WIRE_MAX_FRAMES;
      sf_buffer **grown = m ? realloc(frames, (size_t)cap * sizeof *frames) : NULL;
      if (!grown) {
        free(m);
        drain(socket, more);
        r = SF_ENOMEM;
        break;
      }
      frames = grown;
      capacity = cap;
    }
    zmq_msg_init(m);
    if (zmq_msg_recv(m, socket, 0) < 0) {
      zmq_msg_close(m);
      free(m);
      r = zmq_failure(socket, "receiving a message", error);
      break;
    }
    more = zmq_msg_more(m);
    if (n_frames >= SF_WIRE_MAX_FRAMES) { /* count and drop: the message is rejected whole below */
      extra++;
      zmq_msg_close(m);
      free(m);
      continue;
    }
    frames[n_frames] = sf_buffer_wrap(zmq_msg_data(m), zmq_msg_size(m), free_frame, m);
    if (!frames[n_frames]) {
      zmq_msg_close(m);
      free(m);
      drain(socket, more);
      r = SF_ENOMEM;
      break;
    }
    n_frames++;
  }
  if (r == SF_ENOMEM) {
    sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory receiving a message");
  } else if (r == 0 && extra) {
    char endpoint[256];
    socket_endpoint(socket, endpoint, sizeof endpoint);
    r = sf_error_set(error, SF_ETOOBIG, SF_AT(.url = endpoint),
                     "wire: a message with %lld payload frames; at most %d are allowed", n_frames + extra,
                     SF_WIRE_MAX_FRAMES);
  } else if (r == 0) {
    sf_shm_ring *ring = ring_of ? ring_of(opaque, &msg->peer) : NULL;
    r = decode(zmq_msg_data(&part), zmq_msg_size(&part), frames, n_frames, ring, msg, error);
    sf_shm_ring_unref(&ring);
    if (r < 0 && error && !error->url[0]) socket_endpoint(socket, error->url, sizeof error->url);
  }
  zmq_msg_close(&part);
  for (int i = 0; i < n_frames; i++) sf_buffer_unref(&frames[i]); /* fields hold references of their own */
  free(frames);
  return r;
}

/* ------------------------------------------------------------------------------------------------ */
/* Sending                                                                                          */

/* libzmq's free callback of a sent payload frame (runs on its I/O thread): drops the frame's buffer reference. */
static void release_frame(void *data, void *hint) {
  sf_buffer *b = hint;
  sf_buffer_unref(&b);
}

/* Makes *m a payload frame holding field f's values: zero-copy when contiguous, else written or copied. */
static int frame_for_field(zmq_msg_t *m, const sf_field *f, const char *key, sf_error *error) {
  const sf_tensor *t = &f->tensor;
  size_t bytes = sf_tensor_nbytes(t);
  sf_buffer *b = NULL;
  uint8_t *data;
  if (bytes == 0) {
    zmq_msg_init(m);
    return 0;
  }
  if (!f->recipe && sf_tensor_is_contiguous(t)) {
    b = sf_buffer_ref(t->buffer);
    data = sf_tensor_data(t);
  } else { /* a deferred field written by its recipe, or a strided one copied (counted) */
    b = sf_buffer_new(bytes);
    if (!b) return sf_error_set(error, SF_ENOMEM, SF_AT(.key = key), "wire: out of memory for field '%s'", f->name);
    sf_lazy_write_field(f, sf_buffer_data(b));
    data = sf_buffer_data(b);
    if (!f->recipe) atomic_fetch_add(&copied_sent, bytes);
  }
  if (zmq_msg_init_data(m, data, bytes, release_frame, b) != 0) {
    sf_buffer_unref(&b); /* libzmq does not call the free function when init fails */
    return sf_error_set(error, SF_ENOMEM, SF_AT(.key = key), "wire: out of memory for field '%s'", f->name);
  }
  return 0;
}

/* Checks what a message to send carries against the limits a receiver enforces. */
static int check_outgoing(const sf_wire_message *msg, size_t *n_fields, sf_error *error) {
  int type = (int)msg->type;
  if (type < SF_WIRE_HELLO || type > SF_WIRE_EPOCH_END)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "wire: cannot send message type %d", type);
  const char *tname = sf_wire_type_name(type);
  if (msg->n_samples < 0 || msg->n_samples > SF_WIRE_MAX_SAMPLES || msg->n_errors < 0 ||
      msg->n_errors > SF_WIRE_MAX_ERRORS || msg->n_stats < 0 || msg->n_stats > SF_WIRE_MAX_STATS)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE,
                        "wire: %s message with %d samples, %d error records, %d stage statistics; at most %d, %d, %d",
                        tname, msg->n_samples, msg->n_errors, msg->n_stats, SF_WIRE_MAX_SAMPLES, SF_WIRE_MAX_ERRORS,
                        SF_WIRE_MAX_STATS);
  if ((msg->n_samples && !carries_samples(type)) || (msg->n_errors && !carries_errors(type)) ||
      (msg->n_stats && !carries_stats(type)) || (msg->text && msg->text[0] && !carries_text(type)))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                        "wire: a %s message cannot carry samples, errors, stats or text the type does not have", tname);
  if (msg->text && strnlen(msg->text, SF_WIRE_MAX_TEXT + 1) > SF_WIRE_MAX_TEXT)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message text longer than %d bytes", tname,
                        SF_WIRE_MAX_TEXT);
  size_t total = 0;
  for (int i = 0; i < msg->n_samples; i++) {
    const sf_sample *s = msg->samples[i];
    if (!s) return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "wire: sample %d is NULL", i);
    if (strnlen(sf_sample_url(s), URL_MAX + 1) > URL_MAX)
      return sf_error_set(error, SF_ETOOBIG, SF_AT(.url = sf_sample_url(s), .key = s->key),
                          "wire: the sample's URL is longer than %d bytes", URL_MAX);
    if (strnlen(s->key, KEY_MAX + 1) > KEY_MAX)
      return sf_error_set(error, SF_ETOOBIG, SF_AT(.url = sf_sample_url(s), .key = s->key),
                          "wire: the sample's key is longer than %d bytes; shorten the member paths", KEY_MAX);
    for (int j = 0; j < s->n_fields; j++) {
      const sf_field *f = &s->fields[j];
      const sf_tensor *t = &f->tensor;
      if ((unsigned)t->dtype >= SF_DTYPE_COUNT_ || t->ndim < 0 || t->ndim > SF_TENSOR_MAX_DIMS ||
          (f->encoded && (t->dtype != SF_DTYPE_UINT8 || t->ndim != 1)))
        return sf_error_set(error, SF_EINVAL, SF_AT(.url = sf_sample_url(s), .key = s->key),
                            "wire: field '%s' has a dtype or shape the wire cannot carry", f->name);
      if (t->buffer || f->recipe) total++;
    }
  }
  if (total > SF_WIRE_MAX_FRAMES)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message with %zu payload frames; at most %d", tname,
                        total, SF_WIRE_MAX_FRAMES);
  *n_fields = total;
  return 0;
}

/* WELCOME's stages, packed from the graph's nodes (borrowing their strings); freed with free_stages. */
typedef struct packed_stages {
  SfWire__StageNode *nodes, **node_ptrs;
  SfWire__StageOption *options, **option_ptrs;
  SfWire__Plugin *plugins, **plugin_ptrs;
} packed_stages;

static void free_stages(packed_stages *p) {
  free(p->plugins);
  free(p->plugin_ptrs);
  free(p->nodes);
  free(p->node_ptrs);
  free(p->options);
  free(p->option_ptrs);
}

static int pack_stages(const sf_graph *g, SfWire__Welcome *w, packed_stages *p) {
  size_t n = g ? (size_t)g->n_nodes : 0, n_options = 0;
  for (size_t i = 0; i < n; i++) n_options += (size_t)g->nodes[i].n_values;
  p->nodes = calloc(n + 1, sizeof *p->nodes);
  p->node_ptrs = calloc(n + 1, sizeof *p->node_ptrs);
  p->options = calloc(n_options + 1, sizeof *p->options);
  p->option_ptrs = calloc(n_options + 1, sizeof *p->option_ptrs);
  if (!p->nodes || !p->node_ptrs || !p->options || !p->option_ptrs) return SF_ENOMEM;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const sf_graph_node *gn = &g->nodes[i];
    SfWire__StageNode *s = &p->nodes[i];
    sf_wire__stage_node__init(s);
    p->node_ptrs[i] = s;
    s->type = gn->type;
    s->name = gn->name;
    s->replicas = gn->replicas;
    s->line = gn->line;
    s->replicas_line = gn->replicas_line;
    s->options = &p->option_ptrs[k];
    s->n_options = (size_t)gn->n_values;
    for (int j = 0; j < gn->n_values; j++, k++) {
      sf_wire__stage_option__init(&p->options[k]);
      p->option_ptrs[k] = &p->options[k];
      p->options[k].key = gn->values[j].key;
      p->options[k].value = gn->values[j].value;
      p->options[k].line = gn->values[j].line;
    }
  }
  w->stages = p->node_ptrs;
  w->n_stages = n;
  size_t n_plugins = g ? (size_t)g->n_plugins : 0;
  p->plugins = calloc(n_plugins + 1, sizeof *p->plugins);
  p->plugin_ptrs = calloc(n_plugins + 1, sizeof *p->plugin_ptrs);
  if (!p->plugins || !p->plugin_ptrs) return SF_ENOMEM;
  for (size_t i = 0; i < n_plugins; i++) {
    sf_wire__plugin__init(&p->plugins[i]);
    p->plugin_ptrs[i] = &p->plugins[i];
    p->plugins[i].name = g->plugins[i].name;
    p->plugins[i].build_id = g->plugins[i].build_id ? g->plugins[i].build_id : (char *)"";
    p->plugins[i].line = g->plugins[i].line;
  }
  w->plugins = p->plugin_ptrs;
  w->n_plugins = n_plugins;
  w->graph_path = g && g->path ? g->path : (char *)"";
  return 0;
}

/* Every allocation one outgoing message needs, made before the first byte goes out so that a failure
 * never leaves a half-sent multipart message on the socket. */
typedef struct outgoing {
  SfWire__SampleMeta *samples;
  SfWire__SampleMeta **sample_ptrs;
  SfWire__FieldMeta *fields;
  SfWire__FieldMeta **field_ptrs;
  SfWire__ErrorRecord *errors;
  SfWire__ErrorRecord **error_ptrs;
  SfWire__StageStats *stats;
  SfWire__StageStats **stat_ptrs;
  zmq_msg_t *parts; /* routing id, header, payload frames */
  size_t n_parts;
  sf_shm_ring *ring; /* RESULT payloads of SF_SHM_MIN_BYTES or more go here when set */
  SfWire__ShmExtent *extents;
  SfWire__ShmExtent **extent_ptrs;
  size_t n_extents;
  uint8_t *in_ring; /* per field: 1 when its payload went to the ring rather than a frame */
  packed_stages stages;
} outgoing;

static bool outgoing_alloc(outgoing *o, const sf_wire_message *msg, size_t n_frames, size_t n_meta) {
  o->samples = calloc((size_t)msg->n_samples + 1, sizeof *o->samples);
  o->sample_ptrs = calloc((size_t)msg->n_samples + 1, sizeof *o->sample_ptrs);
  o->fields = calloc(n_meta + 1, sizeof *o->fields);
  o->field_ptrs = calloc(n_meta + 1, sizeof *o->field_ptrs);
  o->errors = calloc((size_t)msg->n_errors + 1, sizeof *o->errors);
  o->error_ptrs = calloc((size_t)msg->n_errors + 1, sizeof *o->error_ptrs);
  o->stats = calloc((size_t)msg->n_stats + 1, sizeof *o->stats);
  o->stat_ptrs = calloc((size_t)msg->n_stats + 1, sizeof *o->stat_ptrs);
  o->parts = calloc(n_frames + 2, sizeof *o->parts);
  o->extents = o->ring ? calloc(n_frames + 1, sizeof *o->extents) : NULL;
  o->extent_ptrs = o->ring ? calloc(n_frames + 1, sizeof *o->extent_ptrs) : NULL;
  o->in_ring = o->ring ? calloc(n_meta + 1, 1) : NULL;
  return o->samples && o->sample_ptrs && o->fields && o->field_ptrs && o->errors && o->error_ptrs && o->stats &&
         o->stat_ptrs && o->parts && (!o->ring || (o->extents && o->extent_ptrs && o->in_ring));
}

static void outgoing_free(outgoing *o) {
  if (o->parts)
    for (size_t i = 0; i < o->n_parts; i++) zmq_msg_close(&o->parts[i]);
  free(o->parts);
  free(o->extents);
  free(o->extent_ptrs);
  free(o->in_ring);
  free(o->samples);
  free(o->sample_ptrs);
  free(o->fields);
  free(o->field_ptrs);
  free(o->errors);
  free(o->error_ptrs);
  free(o->stats);
  free(o->stat_ptrs);
  free_stages(&o->stages);
}

static void encode_header_scalars(SfWire__Header *h, const sf_wire_message *msg) {
  h->version = SF_WIRE_VERSION;
  h->type = (SfWire__MessageType)msg->type;
  h->unit = msg->unit;
  h->epoch = msg->epoch;
  h->credits = msg->credits;
  h->sequence = msg->sequence;
  h->text = msg->text ? msg->text : (char *)"";
  h->pid = msg->pid;
  h->threads = msg->threads;
  h->samples_in = msg->samples_in;
  h->skipped = msg->skipped;
  h->filtered = msg->filtered;
  h->shm_freed = msg->shm_freed;
}

static int encode_welcome(SfWire__Header *h, SfWire__Welcome *welcome, const sf_wire_message *msg,
                          packed_stages *stages, sf_error *error) {
  welcome->seed = msg->seed;
  welcome->epochs = msg->epochs;
  welcome->rank = msg->rank;
  welcome->world_size = msg->world_size;
  welcome->error_policy = msg->error_policy;
  welcome->heartbeat_interval = msg->heartbeat_interval;
  welcome->heartbeat_timeout = msg->heartbeat_timeout;
  h->welcome = welcome;
  if (pack_stages(msg->stages, welcome, stages) < 0)
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory sending a WELCOME message");
  return 0;
}

/* One field's metadata; its payload goes to the shm ring when there is room there, else to a frame of its
 * own. Ring extents are numbered from 0 here and shifted past the socket's frames once all are known. */
static int encode_field(outgoing *o, size_t fi, const sf_field *f, const char *key, uint32_t *frame,
                        sf_error *error) {
  SfWire__FieldMeta *fm = &o->fields[fi];
  sf_wire__field_meta__init(fm);
  o->field_ptrs[fi] = fm;
  fm->name = (char *)f->name;
  fm->encoded = f->encoded;
  fm->dtype = (uint32_t)f->tensor.dtype;
  fm->n_shape = (size_t)f->tensor.ndim;
  fm->shape = (int64_t *)f->tensor.shape;
  if (!f->tensor.buffer && !f->recipe) {
    fm->no_data = true;
    return 0;
  }
  size_t bytes = sf_tensor_nbytes(&f->tensor);
  uint64_t position;
  uint8_t *dst = o->ring && bytes >= SF_SHM_MIN_BYTES ? sf_shm_ring_reserve(o->ring, bytes, &position) : NULL;
  if (dst) {
    sf_lazy_write_field(f, dst);
    SfWire__ShmExtent *x = &o->extents[o->n_extents];
    sf_wire__shm_extent__init(x);
    x->position = position;
    x->length = bytes;
    o->extent_ptrs[o->n_extents] = x;
    fm->frame = (uint32_t)o->n_extents++;
    o->in_ring[fi] = 1;
    return 0;
  }
  fm->frame = (*frame)++;
  int r = frame_for_field(&o->parts[o->n_parts], f, key, error);
  if (r < 0) return r;
  o->n_parts++;
  return 0;
}

static int encode_samples(outgoing *o, SfWire__Header *h, const sf_wire_message *msg, sf_error *error) {
  size_t fi = 0;
  uint32_t frame = 0;
  const char *prev_url = NULL;
  for (int i = 0; i < msg->n_samples; i++) {
    const sf_sample *s = msg->samples[i];
    SfWire__SampleMeta *sm = &o->samples[i];
    sf_wire__sample_meta__init(sm);
    o->sample_ptrs[i] = sm;
    sm->key = (char *)s->key;
    const char *url = sf_sample_url(s);
    if (prev_url && strcmp(prev_url, url) == 0) { /* consecutive samples mostly share a shard */
      sm->same_url = true;
    } else {
      sm->url = (char *)url;
    }
    prev_url = url;
    sm->epoch = s->epoch;
    sm->shard_index = s->shard_index;
    sm->index = s->index;
    sm->pass = s->pass;
    sm->offset = s->offset;
    sm->fields = &o->field_ptrs[fi];
    sm->n_fields = (size_t)s->n_fields;
    for (int j = 0; j < s->n_fields; j++, fi++) {
      int r = encode_field(o, fi, &s->fields[j], s->key, &frame, error);
      if (r < 0) return r;
    }
  }
  for (size_t i = 0; o->n_extents && i < fi; i++)
    if (o->in_ring[i]) o->fields[i].frame += frame;
  h->shm = o->extent_ptrs;
  h->n_shm = o->n_extents;
  h->samples = o->sample_ptrs;
  h->n_samples = (size_t)msg->n_samples;
  return 0;
}

static void encode_errors(outgoing *o, SfWire__Header *h, const sf_wire_message *msg) {
  for (int i = 0; i < msg->n_errors; i++) {
    const sf_error *e = &msg->errors[i];
    SfWire__ErrorRecord *er = &o->errors[i];
    sf_wire__error_record__init(er);
    o->error_ptrs[i] = er;
    er->code = e->code;
    er->stage = (char *)e->stage;
    er->url = (char *)e->url;
    er->key = (char *)e->key;
    er->offset = e->offset;
    er->line = e->line;
    er->message = (char *)e->message;
  }
  h->errors = o->error_ptrs;
  h->n_errors = (size_t)msg->n_errors;
}

static void encode_stats(outgoing *o, SfWire__Header *h, const sf_wire_message *msg) {
  for (int i = 0; i < msg->n_stats; i++) {
    const sf_wire_stage_stats *st = &msg->stats[i];
    SfWire__StageStats *ss = &o->stats[i];
    sf_wire__stage_stats__init(ss);
    o->stat_ptrs[i] = ss;
    ss->name = (char *)st->name;
    ss->items = st->items;
    ss->bytes = st->bytes;
    ss->busy_ns = st->busy_ns;
    ss->wait_ns = st->wait_ns;
    ss->errors = st->errors;
  }
  h->stats = o->stat_ptrs;
  h->n_stats = (size_t)msg->n_stats;
}

/* Packs the header into its part, which was left empty so that the payload frames could be made first. */
static int pack_header(zmq_msg_t *part, const SfWire__Header *h, sf_wire_type type, sf_error *error) {
  size_t packed = sf_wire__header__get_packed_size(h);
  if (packed > SF_WIRE_MAX_HEADER)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s header of %zu bytes; at most %d",
                        sf_wire_type_name(type), packed, SF_WIRE_MAX_HEADER);
  zmq_msg_close(part);
  if (zmq_msg_init_size(part, packed) != 0) {
    zmq_msg_init(part);
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
  }
  sf_wire__header__pack(h, zmq_msg_data(part));
  return 0;
}

/* The frame writer: sends the parts as one multipart message. SF_EAGAIN only when nothing went out (a
 * non-blocking send to a full peer), so the caller may retry the whole message; any later failure is SF_ENET. */
static int write_frames(void *socket, zmq_msg_t *parts, size_t n_parts, int flags, sf_wire_type type,
                        sf_error *error) {
  for (size_t sent = 0; sent < n_parts; sent++) {
    int part_flags = flags | (sent + 1 < n_parts ? ZMQ_SNDMORE : 0);
    if (zmq_msg_send(&parts[sent], socket, part_flags) < 0) {
      int e = zmq_errno();
      if (sent == 0 && e == EAGAIN) return SF_EAGAIN;
      char endpoint[256];
      socket_endpoint(socket, endpoint, sizeof endpoint);
      return sf_error_set(error, SF_ENET, SF_AT(.url = endpoint),
                          "wire: sending a %s message (part %zu of %zu) "
                          "failed: %s%s",
                          sf_wire_type_name(type), sent + 1, n_parts, zmq_strerror(e),
                          e == EHOSTUNREACH ? " (no peer with that routing id: it left)" : "");
    }
  }
  return 0;
}

int sf_wire_send(void *socket, const sf_wire_message *msg, int flags, sf_error *error) {
  size_t n_frames = 0;
  int r = check_outgoing(msg, &n_frames, error);
  if (r < 0) return r;
  size_t n_meta = 0;
  for (int i = 0; i < msg->n_samples; i++) n_meta += (size_t)msg->samples[i]->n_fields;

  SfWire__Header h = SF_WIRE__HEADER__INIT;
  SfWire__Welcome welcome = SF_WIRE__WELCOME__INIT;
  outgoing o = {.ring = msg->type == SF_WIRE_RESULT ? msg->shm : NULL};
  uint64_t ring_mark = o.ring ? sf_shm_ring_mark(o.ring) : 0;
  encode_header_scalars(&h, msg);
  if (msg->type == SF_WIRE_WELCOME) {
    r = encode_welcome(&h, &welcome, msg, &o.stages, error);
    if (r < 0) {
      free_stages(&o.stages);
      return r;
    }
  }
  if (!outgoing_alloc(&o, msg, n_frames, n_meta)) {
    r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory sending a %s message",
                     sf_wire_type_name(msg->type));
    goto done;
  }
  if (msg->peer.len) {
    if (zmq_msg_init_size(&o.parts[0], msg->peer.len) != 0) {
      r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
      goto done;
    }
    memcpy(zmq_msg_data(&o.parts[0]), msg->peer.id, msg->peer.len);
    o.n_parts = 1;
  }
  size_t header_part = o.n_parts++;
  zmq_msg_init(&o.parts[header_part]); /* filled in once packed */
  r = encode_samples(&o, &h, msg, error);
  if (r < 0) goto done;
  encode_errors(&o, &h, msg);
  encode_stats(&o, &h, msg);
  r = pack_header(&o.parts[header_part], &h, msg->type, error);
  if (r < 0) goto done;
  r = write_frames(socket, o.parts, o.n_parts, flags, msg->type, error);
  /* zmq_msg_send left the sent parts empty; closing them is a no-op, the others drop their references. */
done:
  if (o.ring && r < 0) sf_shm_ring_rollback(o.ring, ring_mark); /* the head never heard of those extents */
  outgoing_free(&o);
  return r;
}
