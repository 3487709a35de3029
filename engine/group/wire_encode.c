/* The wire's encoding (wire.c): one encoder per part of a message, one frame writer. */
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>
#include <zmq.h>

#include "lazy.h"
#include "wire_codec.h"

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
    if (!f->recipe) sf_wire_count_copied(true, bytes);
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
  if ((msg->n_samples && !sf_wire_carries_samples(type)) || (msg->n_errors && !sf_wire_carries_errors(type)) ||
      (msg->n_stats && !sf_wire_carries_stats(type)) || (msg->text && msg->text[0] && !sf_wire_carries_text(type)))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                        "wire: a %s message cannot carry samples, errors, stats or text the type does not have", tname);
  if (msg->text && strnlen(msg->text, SF_WIRE_MAX_TEXT + 1) > SF_WIRE_MAX_TEXT)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "wire: %s message text longer than %d bytes", tname,
                        SF_WIRE_MAX_TEXT);
  size_t total = 0;
  for (int i = 0; i < msg->n_samples; i++) {
    const sf_sample *s = msg->samples[i];
    if (!s) return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "wire: sample %d is NULL", i);
    if (strnlen(sf_sample_url(s), SF_WIRE_URL_MAX + 1) > SF_WIRE_URL_MAX)
      return sf_error_set(error, SF_ETOOBIG, SF_AT(.url = sf_sample_url(s), .key = s->key),
                          "wire: the sample's URL is longer than %d bytes", SF_WIRE_URL_MAX);
    if (strnlen(s->key, SF_WIRE_KEY_MAX + 1) > SF_WIRE_KEY_MAX)
      return sf_error_set(error, SF_ETOOBIG, SF_AT(.url = sf_sample_url(s), .key = s->key),
                          "wire: the sample's key is longer than %d bytes; shorten the member paths", SF_WIRE_KEY_MAX);
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
      sf_wire_socket_endpoint(socket, endpoint, sizeof endpoint);
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
