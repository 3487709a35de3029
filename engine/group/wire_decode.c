/* The wire's decoding (wire.c): a header frame checked field by field against its frames, then a message built. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "wire_codec.h"

/* Bytes protobuf-c may allocate while unpacking one header (it has no limits of its own). */
enum { DECODE_BUDGET = 64 << 20 };

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
  size_t klen = strnlen(s->key, SF_WIRE_KEY_MAX + 1);
  if (klen > SF_WIRE_KEY_MAX)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message: sample %zu has a key longer than %d bytes",
                        tname, i, SF_WIRE_KEY_MAX);
  if (strnlen(s->url, SF_WIRE_URL_MAX + 1) > SF_WIRE_URL_MAX)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                        "wire: %s message: sample %zu has a URL longer than %d bytes", tname, i, SF_WIRE_URL_MAX);
  if (s->same_url && (i == 0 || s->url[0]))
    return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key), "wire: %s message: sample %zu says same_url but %s",
                        tname, i, i == 0 ? "it is the first sample" : "also carries a URL");
  if (s->n_fields > SF_MAX_FIELDS)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                        "wire: %s message: sample %zu has %zu fields; at most %d are allowed", tname, i, s->n_fields,
                        SF_MAX_FIELDS);
  for (size_t j = 0; j < s->n_fields; j++) {
    const SfWire__FieldMeta *f = s->fields[j];
    if (strnlen(f->name, SF_WIRE_NAME_MAX + 1) > SF_WIRE_NAME_MAX)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.key = s->key),
                          "wire: %s message: sample %zu field %zu has a name longer than %d bytes", tname, i, j,
                          SF_WIRE_NAME_MAX);
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

/* A WELCOME's run settings: rank within the world, the error policy, heartbeat times, the stages. */
static int check_welcome(const SfWire__Welcome *w, sf_error *error) {
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
  return check_stages(w, error);
}

/* Which parts a message of this type may carry, and how many of each. */
static int check_parts(const SfWire__Header *h, int type, const char *tname, sf_error *error) {
  if (h->n_samples && !sf_wire_carries_samples(type))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message carries samples; only UNIT and RESULT do",
                        tname);
  if (h->n_samples > SF_WIRE_MAX_SAMPLES)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message has %zu samples; at most %d are allowed",
                        tname, h->n_samples, SF_WIRE_MAX_SAMPLES);
  if (h->n_errors && !sf_wire_carries_errors(type))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: %s message carries error records; only RESULT and ERROR do", tname);
  if (h->n_errors > SF_WIRE_MAX_ERRORS)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message has %zu error records; at most %d are allowed",
                        tname, h->n_errors, SF_WIRE_MAX_ERRORS);
  if (h->n_stats && !sf_wire_carries_stats(type))
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
  return 0;
}

/* The strings of the error records and stage statistics fit the structs they are copied into. */
static int check_records(const SfWire__Header *h, int type, const char *tname, sf_error *error) {
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
  int r;
  if (h->text[0] && !sf_wire_carries_text(type))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message carries text; only HELLO, WELCOME and BYE do",
                        tname);
  if (strnlen(h->text, SF_WIRE_MAX_TEXT + 1) > SF_WIRE_MAX_TEXT)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message: text longer than %d bytes", tname,
                        SF_WIRE_MAX_TEXT);
  if ((h->welcome != NULL) != (type == SF_WIRE_WELCOME))
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "wire: %s message %s run settings", tname,
                        type == SF_WIRE_WELCOME ? "without" : "with");
  if (h->welcome && (r = check_welcome(h->welcome, error)) < 0) return r;
  if ((r = check_parts(h, type, tname, error)) < 0 || (r = check_records(h, type, tname, error)) < 0) return r;
  for (size_t i = 0; i < h->n_samples; i++) {
    r = check_sample(h->samples[i], i, type, n_frames, used, error);
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
      sf_wire_count_copied(false, bytes);
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
  if (sf_wire_carries_text(type)) {
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

int sf_wire_decode_from(const uint8_t *header, size_t header_len, sf_buffer *const *frames, int n_frames,
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
  return sf_wire_decode_from(header, header_len, frames, n_frames, NULL, msg, error);
}
