/* Wire protocol: every message type round-trips over real zmq sockets, payloads are not copied, bad headers are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "wire.h"
#include "shardflow/stage.h"
#include "wire.pb-c.h"

static void *ctx;
/* Every socket a test opens; closed after each test, so that a failed assertion cannot leave
 * zmq_ctx_term waiting forever on a socket the test never reached the close of. */
static void *sockets[16];
static int n_sockets;

static int setup(void **state) {
  ctx = zmq_ctx_new();
  return ctx ? 0 : -1;
}

static int teardown(void **state) {
  zmq_ctx_term(ctx);
  return 0;
}

static int close_sockets(void **state) {
  for (int i = 0; i < n_sockets; i++) zmq_close(sockets[i]);
  n_sockets = 0;
  return 0;
}

static void *socket_new(int type) {
  void *s = zmq_socket(ctx, type);
  assert_non_null(s);
  assert_true(n_sockets < 16);
  sockets[n_sockets++] = s;
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  return s;
}

static void *socket_bound(int type, const char *endpoint) {
  void *s = socket_new(type);
  assert_int_equal(zmq_bind(s, endpoint), 0);
  return s;
}

static void *socket_connected(int type, const char *endpoint, const char *routing_id) {
  void *s = socket_new(type);
  if (routing_id) zmq_setsockopt(s, ZMQ_ROUTING_ID, routing_id, strlen(routing_id));
  assert_int_equal(zmq_connect(s, endpoint), 0);
  return s;
}

/* Receives one message, waiting up to 5 s. */
static int recv_wait(void *s, bool routed, sf_wire_message *msg, sf_error *error) {
  zmq_pollitem_t item = {.socket = s, .events = ZMQ_POLLIN};
  if (zmq_poll(&item, 1, 5000) != 1) return SF_ETIMEDOUT;
  return sf_wire_recv(s, routed, msg, ZMQ_DONTWAIT, error);
}

static void send_ok(void *s, const sf_wire_message *msg) {
  sf_error e = {0};
  int r = sf_wire_send(s, msg, 0, &e);
  if (r != 0) fail_msg("sf_wire_send: %s: %s", sf_err_name(r), e.message);
}

static void recv_ok(void *s, bool routed, sf_wire_message *msg) {
  sf_error e = {0};
  int r = recv_wait(s, routed, msg, &e);
  if (r != 0) fail_msg("sf_wire_recv: %s: %s", sf_err_name(r), e.message);
}

static sf_buffer *url_buffer(const char *url) {
  sf_buffer *b = sf_buffer_new(strlen(url) + 1);
  memcpy(sf_buffer_data(b), url, strlen(url) + 1);
  return b;
}

/* Polls until the buffer holds one reference again (libzmq's I/O thread drops ours after sending). */
static bool wait_writable(const sf_buffer *b) {
  for (int i = 0; i < 5000; i++) {
    if (sf_buffer_is_writable(b)) return true;
    usleep(1000);
  }
  return false;
}

/* ---- control messages ---------------------------------------------------------------------- */

static void test_control_messages(void **state) {
  void *head = socket_bound(ZMQ_ROUTER, "inproc://control");
  void *worker = socket_connected(ZMQ_DEALER, "inproc://control", "worker-7");

  sf_wire_message m = {.type = SF_WIRE_HELLO, .text = "host-a/1234", .pid = 1234, .threads = 2};
  send_ok(worker, &m);
  sf_wire_message r;
  recv_ok(head, true, &r);
  assert_int_equal(r.type, SF_WIRE_HELLO);
  assert_string_equal(r.text, "host-a/1234");
  assert_int_equal(r.pid, 1234);
  assert_int_equal(r.threads, 2);
  assert_int_equal(r.peer.len, 8);
  assert_memory_equal(r.peer.id, "worker-7", 8);
  sf_wire_peer peer = r.peer;
  sf_wire_message_clear(&r);

  /* The group's stages travel as graph nodes, each option with its line in the head's file. */
  sf_graph *stages = sf_graph_new_empty("train.yaml");
  sf_graph_node *n = sf_graph_add_node(stages, "decode", "decode", 12);
  n->replicas = 2;
  n->replicas_line = 13;
  n = sf_graph_add_node(stages, "aug", "augment", 14);
  sf_graph_node_set(n, "size", "32", 15);
  sf_graph_node_set(n, "mean", "[0.5, 0.25, \"x\"]", 16);
  m = (sf_wire_message){.type = SF_WIRE_WELCOME, .peer = peer, .stages = stages, .threads = 3, .seed = 0xfeedfacecafebeefull,
                        .epochs = 3, .rank = 1, .world_size = 4, .error_policy = 1, .heartbeat_interval = 0.5,
                        .heartbeat_timeout = 5.0};
  send_ok(head, &m);
  recv_ok(worker, false, &r);
  assert_int_equal(r.type, SF_WIRE_WELCOME);
  assert_non_null(r.stages);
  assert_string_equal(r.stages->path, "train.yaml");
  assert_int_equal(r.stages->n_nodes, 2);
  for (int i = 0; i < 2; i++) {
    const sf_graph_node *a = &stages->nodes[i], *b = &r.stages->nodes[i];
    assert_string_equal(a->name, b->name);
    assert_string_equal(a->type, b->type);
    assert_int_equal(a->line, b->line);
    assert_int_equal(a->replicas, b->replicas);
    assert_int_equal(a->replicas_line, b->replicas_line);
    assert_int_equal(a->n_values, b->n_values);
    for (int j = 0; j < a->n_values; j++) {
      assert_string_equal(a->values[j].key, b->values[j].key);
      assert_string_equal(a->values[j].value, b->values[j].value);
      assert_int_equal(a->values[j].line, b->values[j].line);
    }
  }
  sf_graph_destroy(&stages);
  assert_true(r.seed == 0xfeedfacecafebeefull);
  assert_int_equal(r.epochs, 3);
  assert_int_equal(r.rank, 1);
  assert_int_equal(r.world_size, 4);
  assert_int_equal(r.error_policy, 1);
  assert_true(r.heartbeat_interval == 0.5 && r.heartbeat_timeout == 5.0);
  assert_int_equal(r.threads, 3);
  assert_int_equal(r.peer.len, 0);
  sf_wire_message_clear(&r);

  m = (sf_wire_message){.type = SF_WIRE_CREDIT, .credits = 17};
  send_ok(worker, &m);
  recv_ok(head, true, &r);
  assert_int_equal(r.type, SF_WIRE_CREDIT);
  assert_int_equal(r.credits, 17);
  sf_wire_message_clear(&r);

  sf_wire_stage_stats stats[2] = {{"decode", 100, 1 << 20, 5000000, 7000, 1}, {"augment", 99, 2 << 20, 3, 4, 0}};
  m = (sf_wire_message){.type = SF_WIRE_HEARTBEAT, .sequence = 1ull << 40, .stats = stats, .n_stats = 2};
  send_ok(worker, &m);
  recv_ok(head, true, &r);
  assert_int_equal(r.type, SF_WIRE_HEARTBEAT);
  assert_true(r.sequence == 1ull << 40);
  assert_int_equal(r.n_stats, 2);
  assert_memory_equal(r.stats, stats, sizeof stats);
  sf_wire_message_clear(&r);

  sf_error errs[2];
  sf_error_set(&errs[0], SF_EFORMAT,
               SF_AT(.stage = "decode", .url = "http://h/a.tar", .key = "k/000001", .offset = 1536),
               "corrupt JPEG at byte %d", 7);
  sf_error_set(&errs[1], SF_ENET, SF_AT(.stage = "", .url = "", .key = "", .line = 12), "no route");
  m = (sf_wire_message){.type = SF_WIRE_ERROR, .errors = errs, .n_errors = 2};
  send_ok(worker, &m);
  recv_ok(head, true, &r);
  assert_int_equal(r.type, SF_WIRE_ERROR);
  assert_int_equal(r.n_errors, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(r.errors[i].code, errs[i].code);
    assert_string_equal(r.errors[i].stage, errs[i].stage);
    assert_string_equal(r.errors[i].url, errs[i].url);
    assert_string_equal(r.errors[i].key, errs[i].key);
    assert_string_equal(r.errors[i].message, errs[i].message);
    assert_int_equal(r.errors[i].offset, errs[i].offset);
    assert_int_equal(r.errors[i].line, errs[i].line);
  }
  sf_wire_message_clear(&r);

  m = (sf_wire_message){.type = SF_WIRE_EPOCH_END, .peer = peer, .epoch = 5};
  send_ok(head, &m);
  recv_ok(worker, false, &r);
  assert_int_equal(r.type, SF_WIRE_EPOCH_END);
  assert_int_equal(r.epoch, 5);
  sf_wire_message_clear(&r);

  m = (sf_wire_message){.type = SF_WIRE_BYE, .text = "SIGTERM"};
  send_ok(worker, &m);
  recv_ok(head, true, &r);
  assert_int_equal(r.type, SF_WIRE_BYE);
  assert_string_equal(r.text, "SIGTERM");
  sf_wire_message_clear(&r);

  m = (sf_wire_message){.type = SF_WIRE_BYE, .peer = peer}; /* no reason: text "" */
  send_ok(head, &m);
  recv_ok(worker, false, &r);
  assert_int_equal(r.type, SF_WIRE_BYE);
  assert_string_equal(r.text, "");
  sf_wire_message_clear(&r);

  assert_string_equal(sf_wire_type_name(SF_WIRE_EPOCH_END), "EPOCH_END");
  assert_string_equal(sf_wire_type_name((sf_wire_type)42), "?");
}

/* ---- samples --------------------------------------------------------------------------------- */

/* A deferred field's recipe: value i is (seed + i) as float32. */
typedef struct ramp_recipe {
  sf_field_recipe base;
  float seed;
  int64_t n;
  int *writes;
} ramp_recipe;

static void ramp_write(const sf_field_recipe *r, void *dst) {
  const ramp_recipe *rr = (const ramp_recipe *)r;
  float *f = dst;
  for (int64_t i = 0; i < rr->n; i++) f[i] = rr->seed + (float)i;
  (*rr->writes)++;
}

static void ramp_destroy(sf_field_recipe *r) { free(r); }

static sf_tensor tensor_filled(sf_dtype dtype, int ndim, const int64_t *shape, unsigned seed) {
  sf_tensor t;
  assert_int_equal(sf_tensor_alloc(&t, dtype, ndim, shape), 0);
  uint8_t *p = sf_tensor_data(&t);
  for (size_t i = 0; i < sf_tensor_nbytes(&t); i++) p[i] = (uint8_t)(i * 31 + seed);
  return t;
}

typedef struct sample_set {
  sf_sample *s[3];
  sf_buffer *jpg, *hwc, *chw, *base; /* the senders' payload buffers (borrowed) */
  int writes;
} sample_set;

/*
 * Three samples: encoded JPEG bytes + int64 label; a uint8 HWC image + float32 CHW tensor + a deferred
 * float32 field + an empty (header-only) field; a strided (transposed) view.  Samples 0 and 1 share a URL.
 */
static void make_samples(sample_set *set) {
  memset(set, 0, sizeof *set);
  sf_buffer *url = url_buffer("http://127.0.0.1:8750/cifar/train-000007.tar");
  for (int i = 0; i < 3; i++) {
    sf_sample *s = set->s[i] = sf_sample_new();
    char key[400];
    snprintf(key, sizeof key, "train/%06d", 100 + i);
    if (i == 2) memset(key + strlen(key), 'k', 300), key[312] = '\0'; /* keys have no 127-byte limit */
    assert_int_equal(sf_sample_set_key(s, key, strlen(key)), 0);
    s->url = i < 2 ? sf_buffer_ref(url) : url_buffer("file:///data/other.tar");
    s->epoch = 2;
    s->shard_index = 7;
    s->index = (uint64_t)i;
    s->pass = 1;
    s->offset = 512 * (i + 1);
  }
  sf_buffer_unref(&url);

  int64_t n[1] = {2777};
  sf_tensor t = tensor_filled(SF_DTYPE_UINT8, 1, n, 1);
  set->jpg = t.buffer;
  sf_sample_add_field(set->s[0], "jpg", true, &t);
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_INT64, 0, NULL), 0);
  *(int64_t *)sf_tensor_data(&t) = -42;
  sf_sample_add_field(set->s[0], "cls", false, &t);

  int64_t hwc[3] = {32, 32, 3}, chw[3] = {3, 32, 32};
  t = tensor_filled(SF_DTYPE_UINT8, 3, hwc, 2);
  set->hwc = t.buffer;
  sf_sample_add_field(set->s[1], "png", false, &t);
  t = tensor_filled(SF_DTYPE_FLOAT32, 3, chw, 3);
  float *fp = sf_tensor_data(&t);
  for (int i = 0; i < 3 * 32 * 32; i++) fp[i] = (float)i * 0.25f - 100.0f;
  set->chw = t.buffer;
  sf_sample_add_field(set->s[1], "image", false, &t);
  memset(&t, 0, sizeof t);
  sf_field *d = sf_sample_add_field(set->s[1], "deferred", false, &t);
  ramp_recipe *rr = calloc(1, sizeof *rr);
  rr->base.write = ramp_write;
  rr->base.destroy = ramp_destroy;
  rr->seed = 1000.0f;
  rr->n = 2 * 5;
  rr->writes = &set->writes;
  int64_t dshape[2] = {2, 5};
  assert_int_equal(sf_field_defer(d, SF_DTYPE_FLOAT32, 2, dshape, &rr->base), 0);
  int64_t eshape[2] = {4, 4};
  assert_int_equal(sf_tensor_set_shape(&t, SF_DTYPE_INT32, 2, eshape), 0);
  sf_sample_add_field(set->s[1], "empty", false, &t);

  /* A [3, 4] int32 view of a [4, 3] buffer, transposed: strides (1, 3). */
  int64_t base_shape[2] = {4, 3};
  sf_tensor base = tensor_filled(SF_DTYPE_INT32, 2, base_shape, 4);
  int32_t *bp = sf_tensor_data(&base);
  for (int i = 0; i < 12; i++) bp[i] = i * 10 + 1;
  set->base = base.buffer;
  t = base;
  t.shape[0] = 3;
  t.shape[1] = 4;
  t.strides[0] = 1;
  t.strides[1] = 3;
  assert_false(sf_tensor_is_contiguous(&t));
  sf_sample_add_field(set->s[2], "transposed", false, &t);
}

static void free_samples(sample_set *set) {
  for (int i = 0; i < 3; i++) sf_sample_destroy(&set->s[i]);
}

/* Checks the received samples against the sent ones, value by value. */
static void check_samples(sf_wire_message *r, sample_set *set) {
  assert_int_equal(r->n_samples, 3);
  for (int i = 0; i < 3; i++) {
    sf_sample *a = set->s[i], *b = r->samples[i];
    assert_string_equal(a->key, b->key);
    assert_string_equal(sf_sample_url(a), sf_sample_url(b));
    assert_int_equal(a->epoch, b->epoch);
    assert_int_equal(a->shard_index, b->shard_index);
    assert_int_equal(a->index, b->index);
    assert_int_equal(a->pass, b->pass);
    assert_int_equal(a->offset, b->offset);
    assert_int_equal(a->n_fields, b->n_fields);
    for (int j = 0; j < a->n_fields; j++) {
      sf_field *fa = &a->fields[j], *fb = &b->fields[j];
      assert_string_equal(fa->name, fb->name);
      assert_int_equal(fa->encoded, fb->encoded);
      assert_int_equal(fa->tensor.dtype, fb->tensor.dtype);
      assert_int_equal(fa->tensor.ndim, fb->tensor.ndim);
      for (int d = 0; d < fa->tensor.ndim; d++) assert_int_equal(fa->tensor.shape[d], fb->tensor.shape[d]);
      assert_null(fb->recipe);
      assert_true(sf_tensor_is_contiguous(&fb->tensor));
    }
  }
  /* samples 0 and 1 share one URL buffer on the receiving side too */
  assert_ptr_equal(r->samples[0]->url, r->samples[1]->url);
  assert_memory_equal(sf_tensor_data(&r->samples[0]->fields[0].tensor), sf_buffer_data(set->jpg), 2777);
  assert_int_equal(*(int64_t *)sf_tensor_data(&r->samples[0]->fields[1].tensor), -42);
  assert_memory_equal(sf_tensor_data(&r->samples[1]->fields[0].tensor), sf_buffer_data(set->hwc), 32 * 32 * 3);
  const float *chw = sf_tensor_data(&r->samples[1]->fields[1].tensor);
  for (int i = 0; i < 3 * 32 * 32; i++) assert_true(chw[i] == (float)i * 0.25f - 100.0f);
  const float *ramp = sf_tensor_data(&r->samples[1]->fields[2].tensor);
  for (int i = 0; i < 10; i++) assert_true(ramp[i] == 1000.0f + (float)i);
  assert_null(r->samples[1]->fields[3].tensor.buffer); /* the empty field stays a header */
  assert_int_equal(r->samples[1]->fields[3].tensor.shape[1], 4);
  /* transposed: out[i][j] = base[j][i] = j * 3 + i -> value (j*3+i)*10+1 */
  const int32_t *tr = sf_tensor_data(&r->samples[2]->fields[0].tensor);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) assert_int_equal(tr[i * 4 + j], (j * 3 + i) * 10 + 1);
}

static void test_unit_inproc_zero_copy(void **state) {
  void *head = socket_bound(ZMQ_ROUTER, "inproc://unit");
  void *worker = socket_connected(ZMQ_DEALER, "inproc://unit", "w");
  sf_wire_message m = {.type = SF_WIRE_HELLO};
  send_ok(worker, &m);
  sf_wire_message r;
  recv_ok(head, true, &r);
  sf_wire_peer peer = r.peer;
  sf_wire_message_clear(&r);

  sample_set set;
  make_samples(&set);
  uint64_t sent0, recv0, sent1, recv1;
  sf_wire_copy_stats(&sent0, &recv0);
  m = (sf_wire_message){.type = SF_WIRE_UNIT, .peer = peer, .unit = 99, .epoch = 2, .samples = set.s, .n_samples = 3};
  send_ok(head, &m);
  assert_int_equal(set.writes, 1);            /* the deferred field was written once */
  assert_non_null(set.s[1]->fields[2].recipe); /* and the sender's sample is unchanged */
  recv_ok(worker, false, &r);
  sf_wire_copy_stats(&sent1, &recv1);
  assert_int_equal(r.type, SF_WIRE_UNIT);
  assert_int_equal(r.unit, 99);
  assert_int_equal(r.epoch, 2);
  check_samples(&r, &set);
  assert_int_equal(sent1 - sent0, 12 * 4); /* only the strided view was copied */
  assert_int_equal(recv1 - recv0, 0);
  /* inproc hands libzmq's message over as is: the receiver's fields point at the sender's memory */
  assert_ptr_equal(sf_tensor_data(&r.samples[0]->fields[0].tensor), sf_buffer_data(set.jpg));
  assert_ptr_equal(sf_tensor_data(&r.samples[1]->fields[0].tensor), sf_buffer_data(set.hwc));
  assert_ptr_equal(sf_tensor_data(&r.samples[1]->fields[1].tensor), sf_buffer_data(set.chw));
  assert_false(sf_buffer_is_writable(set.jpg)); /* the received field holds the sender's reference */
  assert_false(sf_buffer_is_writable(set.chw));
  /* a caller may take a sample out of the message */
  sf_sample *taken = r.samples[1];
  r.samples[1] = NULL;
  sf_wire_message_clear(&r);
  assert_true(sf_buffer_is_writable(set.jpg));
  assert_false(sf_buffer_is_writable(set.chw));
  sf_sample_destroy(&taken);
  assert_true(sf_buffer_is_writable(set.chw));
  assert_true(sf_buffer_is_writable(set.hwc));
  assert_true(sf_buffer_is_writable(set.base));
  free_samples(&set);
}

/* The head's resolver in the tests: one ring for every peer. */
static sf_shm_ring *the_ring(void *opaque, const sf_wire_peer *peer) {
  (void)peer;
  return opaque ? sf_shm_ring_ref(opaque) : NULL;
}

/* A RESULT through a shared-memory ring: the payloads of 256 bytes or more are written into the worker's
 * mapping, the head's fields view its own mapping of the same memfd, values equal; a ring too small for a
 * payload sends it as a frame; extents from a peer without a ring are refused. */
static void test_result_ring(void **state) {
  void *head = socket_bound(ZMQ_ROUTER, "inproc://ring");
  void *worker = socket_connected(ZMQ_DEALER, "inproc://ring", "local-0");
  sf_shm_ring *head_ring, *worker_ring;
  int fd;
  sf_error e;
  assert_int_equal(sf_shm_ring_new(65536, &head_ring, &fd, &e), 0);
  assert_int_equal(sf_shm_ring_attach(fd, &worker_ring, &e), 0);
  for (int pass = 0; pass < 3; pass++) {
    sample_set set;
    make_samples(&set);
    sf_wire_message m = {.type = SF_WIRE_RESULT, .unit = 7, .samples = set.s, .n_samples = 3, .samples_in = 3,
                         .shm = worker_ring};
    send_ok(worker, &m);
    zmq_pollitem_t item = {.socket = head, .events = ZMQ_POLLIN};
    assert_int_equal(zmq_poll(&item, 1, 5000), 1);
    sf_wire_message r;
    int rc = sf_wire_recv_ring(head, true, the_ring, pass == 2 ? NULL : head_ring, &r, ZMQ_DONTWAIT, &e);
    if (pass == 2) { /* no ring for this peer: the message is refused whole, its extents released */
      assert_int_equal(rc, SF_EFORMAT);
      assert_non_null(strstr(e.message, "without a ring"));
      free_samples(&set);
      break;
    }
    assert_int_equal(rc, 0);
    check_samples(&r, &set);
    /* jpg (2777 B), png (3072 B) and the float32 image (12288 B) went through the ring; the label, the
     * ramp and the transposed view (8 + 40 + 48 B) as frames */
    assert_int_equal(r.ring_bytes, 2777 + 3072 + 12288);
    assert_int_equal(r.frame_bytes, 8 + 40 + 48);
    assert_int_equal((uintptr_t)sf_tensor_data(&sf_sample_field(r.samples[1], "image")->tensor) % 64, 0);
    sf_wire_message_clear(&r); /* releases the extents: the ring is free again */
    sf_shm_ring_set_freed(worker_ring, sf_shm_ring_freed(head_ring));
    assert_int_equal(sf_shm_ring_freed(head_ring), sf_shm_ring_mark(worker_ring));
    free_samples(&set);
  }
  sf_shm_ring_unref(&worker_ring);
  sf_shm_ring_unref(&head_ring);

  /* a ring of one page: the 12 KiB image does not fit and goes as a frame, the others still fit */
  assert_int_equal(sf_shm_ring_new(4096, &head_ring, &fd, &e), 0);
  assert_int_equal(sf_shm_ring_attach(fd, &worker_ring, &e), 0);
  sample_set set;
  make_samples(&set);
  sf_wire_message m = {.type = SF_WIRE_RESULT, .unit = 8, .samples = set.s, .n_samples = 3, .samples_in = 3,
                       .shm = worker_ring};
  send_ok(worker, &m);
  zmq_pollitem_t item = {.socket = head, .events = ZMQ_POLLIN};
  assert_int_equal(zmq_poll(&item, 1, 5000), 1);
  sf_wire_message r;
  assert_int_equal(sf_wire_recv_ring(head, true, the_ring, head_ring, &r, ZMQ_DONTWAIT, &e), 0);
  check_samples(&r, &set);
  assert_int_equal(r.ring_bytes, 2777); /* the png (3072 B) no longer fits after it in 4096 */
  assert_int_equal(r.frame_bytes, 3072 + 12288 + 8 + 40 + 48);
  sf_wire_message_clear(&r);
  free_samples(&set);
  sf_shm_ring_unref(&worker_ring);
  sf_shm_ring_unref(&head_ring);
}

static void test_result_ipc(void **state) {
  char endpoint[128];
  snprintf(endpoint, sizeof endpoint, "ipc:///tmp/sf-test-wire-%d.sock", (int)getpid());
  void *head = socket_bound(ZMQ_ROUTER, endpoint);
  void *worker = socket_connected(ZMQ_DEALER, endpoint, NULL);

  sample_set set;
  make_samples(&set);
  /* a large float32 tensor too: libzmq receives it into a buffer of its own (not its 8 KiB batch) */
  int64_t big_shape[3] = {3, 64, 64};
  sf_tensor big = tensor_filled(SF_DTYPE_FLOAT32, 3, big_shape, 9);
  sf_buffer *big_buffer = sf_buffer_ref(big.buffer); /* ours, to watch libzmq drop its reference */
  sf_sample_add_field(set.s[2], "big", false, &big);
  sf_error errs[1];
  sf_error_set(&errs[0], SF_EFORMAT, SF_AT(.stage = "decode", .url = "http://h/x.tar", .key = "k9", .offset = 1024),
               "bad PNG");
  sf_wire_stage_stats stats[1] = {{"decode", 3, 4, 5, 6, 1}};
  uint64_t recv0, recv1;
  sf_wire_copy_stats(NULL, &recv0);
  sf_wire_message m = {.type = SF_WIRE_RESULT, .unit = 12345678901ull, .epoch = 2, .samples = set.s, .n_samples = 3,
                       .samples_in = 4, .skipped = 1, .errors = errs, .n_errors = 1, .stats = stats, .n_stats = 1};
  send_ok(worker, &m);
  sf_wire_message r;
  recv_ok(head, true, &r);
  sf_wire_copy_stats(NULL, &recv1);
  assert_int_equal(r.type, SF_WIRE_RESULT);
  assert_true(r.unit == 12345678901ull);
  assert_int_equal(r.samples_in, 4);
  assert_int_equal(r.skipped, 1);
  assert_int_equal(r.n_errors, 1);
  assert_string_equal(r.errors[0].message, "bad PNG");
  assert_int_equal(r.errors[0].offset, 1024);
  assert_int_equal(r.n_stats, 1);
  assert_string_equal(r.stats[0].name, "decode");
  assert_true(r.peer.len > 0);
  sf_sample *s2 = r.samples[2];
  sf_field *bf = sf_sample_field(s2, "big");
  assert_non_null(bf);
  assert_memory_equal(sf_tensor_data(&bf->tensor), sf_buffer_data(big_buffer), 3 * 64 * 64 * 4);
  assert_int_equal((uintptr_t)sf_tensor_data(&bf->tensor) % 4, 0);
  sf_sample_remove_field(s2, s2->n_fields - 1);
  sf_sample_remove_field(set.s[2], set.s[2]->n_fields - 1);
  check_samples(&r, &set);
  /* Small typed frames may sit unaligned in libzmq's receive batch and are then copied (at most the
   * label, the CHW image, the ramp and the transposed view); the big frame never is. */
  assert_true(recv1 - recv0 <= 8 + 3 * 32 * 32 * 4 + 40 + 48);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < r.samples[i]->n_fields; j++) {
      const sf_tensor *t = &r.samples[i]->fields[j].tensor;
      if (t->buffer) assert_int_equal((uintptr_t)sf_tensor_data(t) % sf_dtype_size(t->dtype), 0);
    }
  /* once libzmq has written the frames, the sender's references are gone */
  assert_true(wait_writable(set.jpg));
  assert_true(wait_writable(set.hwc));
  assert_true(wait_writable(set.chw));
  assert_true(wait_writable(big_buffer));
  sf_buffer_unref(&big_buffer);
  sf_wire_message_clear(&r);
  free_samples(&set);
  unlink(endpoint + strlen("ipc://"));
}

static void test_routing(void **state) {
  void *head = socket_bound(ZMQ_ROUTER, "inproc://routing");
  int mandatory = 1;
  zmq_setsockopt(head, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
  void *w1 = socket_connected(ZMQ_DEALER, "inproc://routing", "w1");
  void *w2 = socket_connected(ZMQ_DEALER, "inproc://routing", "worker-two");
  sf_wire_message m = {.type = SF_WIRE_CREDIT, .credits = 1};
  send_ok(w1, &m);
  m.credits = 2;
  send_ok(w2, &m);
  sf_wire_peer peers[3];
  for (int i = 0; i < 2; i++) {
    sf_wire_message r;
    recv_ok(head, true, &r);
    peers[r.credits] = r.peer;
    sf_wire_message_clear(&r);
  }
  assert_int_equal(peers[1].len, 2);
  assert_memory_equal(peers[1].id, "w1", 2);
  assert_int_equal(peers[2].len, 10);
  assert_memory_equal(peers[2].id, "worker-two", 10);
  /* replies go to the worker named, and only there */
  for (int i = 2; i >= 1; i--) {
    m = (sf_wire_message){.type = SF_WIRE_EPOCH_END, .peer = peers[i], .epoch = (uint64_t)i};
    send_ok(head, &m);
  }
  sf_wire_message r;
  recv_ok(w1, false, &r);
  assert_int_equal(r.epoch, 1);
  sf_wire_message_clear(&r);
  recv_ok(w2, false, &r);
  assert_int_equal(r.epoch, 2);
  sf_wire_message_clear(&r);
  sf_error e;
  assert_int_equal(sf_wire_recv(w1, false, &r, ZMQ_DONTWAIT, &e), SF_EAGAIN);
  /* an unknown peer (it left): SF_ENET with a message, and the payload references are dropped */
  sample_set set;
  make_samples(&set);
  m = (sf_wire_message){.type = SF_WIRE_UNIT, .samples = set.s, .n_samples = 3};
  memcpy(m.peer.id, "gone", 4);
  m.peer.len = 4;
  assert_int_equal(sf_wire_send(head, &m, 0, &e), SF_ENET);
  assert_non_null(strstr(e.message, "routing id"));
  assert_true(sf_buffer_is_writable(set.jpg));
  assert_true(sf_buffer_is_writable(set.chw));
  free_samples(&set);
}

static void test_send_backpressure(void **state) {
  /* a DEALER with no peer cannot queue: DONTWAIT gives SF_EAGAIN and nothing is held */
  void *lonely = socket_new(ZMQ_DEALER);
  sample_set set;
  make_samples(&set);
  sf_wire_message m = {.type = SF_WIRE_RESULT, .samples = set.s, .n_samples = 3};
  sf_error e;
  assert_int_equal(sf_wire_send(lonely, &m, ZMQ_DONTWAIT, &e), SF_EAGAIN);
  assert_true(sf_buffer_is_writable(set.jpg));
  assert_true(sf_buffer_is_writable(set.hwc));
  /* what a receiver would refuse is refused on the sending side already */
  m = (sf_wire_message){.type = SF_WIRE_CREDIT, .samples = set.s, .n_samples = 3};
  assert_int_equal(sf_wire_send(lonely, &m, ZMQ_DONTWAIT, &e), SF_EINVAL);
  m = (sf_wire_message){.type = (sf_wire_type)0};
  assert_int_equal(sf_wire_send(lonely, &m, ZMQ_DONTWAIT, &e), SF_EINVAL);
  free_samples(&set);
}

/* ---- malformed input ------------------------------------------------------------------------ */

/* A valid UNIT header with one sample of one uint8 [10] field in frame 0; cases break one rule each. */
typedef struct craft {
  SfWire__Header h;
  SfWire__SampleMeta sample, *samples[1];
  SfWire__FieldMeta field, field2, *fields[2];
  SfWire__Welcome welcome;
  SfWire__ErrorRecord err, *errs[1];
  int64_t shape[8];
  size_t frame_sizes[4];
  int n_frames;
  char big[70000];
} craft;

static void craft_init(craft *c) {
  memset(c, 0, sizeof *c);
  sf_wire__header__init(&c->h);
  sf_wire__sample_meta__init(&c->sample);
  sf_wire__field_meta__init(&c->field);
  sf_wire__field_meta__init(&c->field2);
  sf_wire__welcome__init(&c->welcome);
  sf_wire__error_record__init(&c->err);
  c->h.version = SF_WIRE_VERSION;
  c->h.type = SF_WIRE__MESSAGE_TYPE__UNIT;
  c->samples[0] = &c->sample;
  c->h.samples = c->samples;
  c->h.n_samples = 1;
  c->sample.key = "k";
  c->fields[0] = &c->field;
  c->fields[1] = &c->field2;
  c->sample.fields = c->fields;
  c->sample.n_fields = 1;
  c->field.name = "bin";
  c->field.shape = c->shape;
  c->field.n_shape = 1;
  c->shape[0] = 10;
  c->field2.name = "bin2";
  c->field2.shape = c->shape;
  c->field2.n_shape = 1;
  c->field2.frame = 1;
  c->frame_sizes[0] = 10;
  c->n_frames = 1;
  memset(c->big, 'x', sizeof c->big - 1);
  c->errs[0] = &c->err;
}

typedef struct bad_case {
  const char *what;
  int code;
  void (*mutate)(craft *c);
} bad_case;

static void m_version(craft *c) { c->h.version = SF_WIRE_VERSION + 1; }
static void m_type0(craft *c) { c->h.type = 0; }
static void m_type99(craft *c) { c->h.type = 99; }
static void m_samples_in_credit(craft *c) { c->h.type = SF_WIRE__MESSAGE_TYPE__CREDIT; }
static void m_text_in_unit(craft *c) { c->h.text = "hello"; }
static void m_key_long(craft *c) { c->big[65536] = '\0'; c->sample.key = c->big; }
static void m_url_long(craft *c) { c->big[4096] = '\0'; c->sample.url = c->big; }
static void m_name_long(craft *c) { c->big[32] = '\0'; c->field.name = c->big; }
static void m_dtype(craft *c) { c->field.dtype = SF_DTYPE_COUNT_; }
static void m_ndim(craft *c) {
  c->field.n_shape = SF_TENSOR_MAX_DIMS + 1;
  for (int i = 0; i < SF_TENSOR_MAX_DIMS + 1; i++) c->shape[i] = 1;
  c->shape[0] = 10;
}
static void m_negative(craft *c) { c->field.n_shape = 2; c->shape[0] = -2; c->shape[1] = -5; }
static void m_overflow(craft *c) {
  c->field.n_shape = 3;
  c->field.dtype = SF_DTYPE_FLOAT32;
  c->shape[0] = 1ll << 31;
  c->shape[1] = 1ll << 31;
  c->shape[2] = 1ll << 31;
}
static void m_overflow_dtype(craft *c) { c->field.dtype = SF_DTYPE_INT64; c->shape[0] = INT64_MAX / 4; }
static void m_size_short(craft *c) { c->frame_sizes[0] = 9; }
static void m_size_long(craft *c) { c->frame_sizes[0] = 11; }
static void m_size_dtype(craft *c) { c->field.dtype = SF_DTYPE_FLOAT32; c->field.encoded = false; }
static void m_frame_range(craft *c) { c->field.frame = 1; }
static void m_frame_twice(craft *c) {
  c->sample.n_fields = 2;
  c->field2.frame = 0;
  c->frame_sizes[1] = 10;
  c->n_frames = 2;
}
static void m_frame_unused(craft *c) { c->frame_sizes[1] = 3; c->n_frames = 2; }
static void m_no_frames(craft *c) { c->n_frames = 0; }
static void m_encoded_float(craft *c) {
  c->field.encoded = true;
  c->field.dtype = SF_DTYPE_FLOAT32;
  c->frame_sizes[0] = 40;
}
static void m_encoded_2d(craft *c) {
  c->field.encoded = true;
  c->field.n_shape = 2;
  c->shape[1] = 1;
}
static void m_dup_name(craft *c) {
  c->sample.n_fields = 2;
  c->field2.name = "bin";
  c->frame_sizes[1] = 10;
  c->n_frames = 2;
}
static void m_same_url_first(craft *c) { c->sample.same_url = true; }
static void m_no_data_frame(craft *c) { c->field.no_data = true; c->field.frame = 3; c->n_frames = 0; }
static void m_too_many_fields(craft *c) {
  static SfWire__FieldMeta many[SF_MAX_FIELDS + 1];
  static SfWire__FieldMeta *ptrs[SF_MAX_FIELDS + 1];
  static char names[SF_MAX_FIELDS + 1][8];
  for (int i = 0; i <= SF_MAX_FIELDS; i++) {
    sf_wire__field_meta__init(&many[i]);
    snprintf(names[i], sizeof names[i], "f%d", i);
    many[i].name = names[i];
    many[i].no_data = true;
    ptrs[i] = &many[i];
  }
  c->sample.fields = ptrs;
  c->sample.n_fields = SF_MAX_FIELDS + 1;
  c->n_frames = 0;
}
static void m_welcome_missing(craft *c) { c->h.type = SF_WIRE__MESSAGE_TYPE__WELCOME; c->h.n_samples = 0; c->n_frames = 0; }
static void m_welcome_rank(craft *c) {
  m_welcome_missing(c);
  c->h.welcome = &c->welcome;
  c->welcome.rank = 4;
  c->welcome.world_size = 4;
}
static void m_welcome_nan(craft *c) {
  m_welcome_missing(c);
  c->h.welcome = &c->welcome;
  c->welcome.world_size = 1;
  c->welcome.heartbeat_timeout = -1.0;
}
static void m_welcome_in_unit(craft *c) { c->h.welcome = &c->welcome; c->welcome.world_size = 1; }
static void m_error_code(craft *c) {
  c->h.type = SF_WIRE__MESSAGE_TYPE__ERROR;
  c->h.n_samples = 0;
  c->n_frames = 0;
  c->h.errors = c->errs;
  c->h.n_errors = 1;
  c->err.code = 3;
}
static void m_error_message_long(craft *c) {
  m_error_code(c);
  c->err.code = SF_EIO;
  c->big[512] = '\0';
  c->err.message = c->big;
}
static void m_errors_in_unit(craft *c) { c->h.errors = c->errs; c->h.n_errors = 1; c->err.code = SF_EIO; }

static const bad_case bad_cases[] = {
    {"wire version", SF_EFORMAT, m_version},
    {"unknown message type 0", SF_EFORMAT, m_type0},
    {"unknown message type 99", SF_EFORMAT, m_type99},
    {"carries samples", SF_EFORMAT, m_samples_in_credit},
    {"carries text", SF_EFORMAT, m_text_in_unit},
    {"key longer", SF_EFORMAT, m_key_long},
    {"URL longer", SF_EFORMAT, m_url_long},
    {"name longer", SF_EFORMAT, m_name_long},
    {"known dtypes are", SF_EFORMAT, m_dtype}, /* dtype SF_DTYPE_COUNT_ */
    {"7 dimensions", SF_EFORMAT, m_ndim},
    {"negative dimension", SF_EFORMAT, m_negative},
    {"overflows", SF_EFORMAT, m_overflow},
    {"overflows", SF_EFORMAT, m_overflow_dtype},
    {"needs 10 bytes but its frame 0 has 9", SF_EFORMAT, m_size_short},
    {"needs 10 bytes but its frame 0 has 11", SF_EFORMAT, m_size_long},
    {"needs 40 bytes", SF_EFORMAT, m_size_dtype},
    {"names frame 1; the message has 1", SF_EFORMAT, m_frame_range},
    {"which another field uses", SF_EFORMAT, m_frame_twice},
    {"frame 1 of 2 belongs to no field", SF_EFORMAT, m_frame_unused},
    {"the message has 0", SF_EFORMAT, m_no_frames},
    {"encoded but not uint8", SF_EFORMAT, m_encoded_float},
    {"encoded but not uint8", SF_EFORMAT, m_encoded_2d},
    {"two fields named 'bin'", SF_EFORMAT, m_dup_name},
    {"same_url but it is the first", SF_EFORMAT, m_same_url_first},
    {"has no data but names a frame", SF_EFORMAT, m_no_data_frame},
    {"17 fields", SF_EFORMAT, m_too_many_fields},
    {"WELCOME message without run settings", SF_EFORMAT, m_welcome_missing},
    {"rank 4 of world size 4", SF_EFORMAT, m_welcome_rank},
    {"heartbeat", SF_EFORMAT, m_welcome_nan},
    {"UNIT message with run settings", SF_EFORMAT, m_welcome_in_unit},
    {"codes are negative", SF_EFORMAT, m_error_code},
    {"error record's message is longer", SF_EFORMAT, m_error_message_long},
    {"carries error records", SF_EFORMAT, m_errors_in_unit},
};

/* Sends raw frames (header bytes + payload frames of the given sizes) from a plain DEALER. */
static void send_raw(void *s, const uint8_t *header, size_t header_len, const size_t *sizes, int n) {
  assert_int_equal(zmq_send(s, header, header_len, n ? ZMQ_SNDMORE : 0), (int)header_len);
  for (int i = 0; i < n; i++) {
    uint8_t *p = calloc(sizes[i] + 1, 1);
    assert_int_equal(zmq_send(s, p, sizes[i], i + 1 < n ? ZMQ_SNDMORE : 0), (int)sizes[i]);
    free(p);
  }
}

/* After a rejected message the next one must come through intact (the bad one was consumed whole). */
static void expect_next_ok(void *head, void *attacker, uint32_t credits) {
  sf_wire_message m = {.type = SF_WIRE_CREDIT, .credits = credits}, r;
  send_ok(attacker, &m);
  recv_ok(head, true, &r);
  assert_int_equal(r.type, SF_WIRE_CREDIT);
  assert_int_equal(r.credits, credits);
  sf_wire_message_clear(&r);
}

static void test_malformed(void **state) {
  void *head = socket_bound(ZMQ_ROUTER, "inproc://malformed");
  void *attacker = socket_connected(ZMQ_DEALER, "inproc://malformed", "mallory");
  /* the base case is valid */
  craft c;
  craft_init(&c);
  static uint8_t packed[1 << 17]; /* room for a header with a key over the 64 KiB limit */
  size_t n = sf_wire__header__pack(&c.h, packed);
  send_raw(attacker, packed, n, c.frame_sizes, c.n_frames);
  sf_wire_message r;
  recv_ok(head, true, &r);
  assert_int_equal(r.n_samples, 1);
  sf_wire_message_clear(&r);

  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    craft_init(&c);
    bad_cases[i].mutate(&c);
    n = sf_wire__header__get_packed_size(&c.h);
    assert_true(n <= sizeof packed);
    sf_wire__header__pack(&c.h, packed);
    send_raw(attacker, packed, n, c.frame_sizes, c.n_frames);
    sf_error e = {0};
    int rc = recv_wait(head, true, &r, &e);
    if (rc != bad_cases[i].code || !strstr(e.message, bad_cases[i].what))
      fail_msg("case %zu (%s): got %s: %s", i, bad_cases[i].what, sf_err_name(rc), e.message);
    assert_int_equal(r.peer.len, 7); /* who sent it is still known */
    assert_memory_equal(r.peer.id, "mallory", 7);
    assert_int_equal(r.n_samples, 0);
    assert_null(r.samples);
    assert_string_equal(e.url, "inproc://malformed");
    expect_next_ok(head, attacker, (uint32_t)i + 1);
  }

  /* not protobuf at all */
  uint8_t garbage[64];
  for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (uint8_t)(0xff - i);
  size_t sizes[2] = {5, 6};
  send_raw(attacker, garbage, sizeof garbage, sizes, 2);
  sf_error e;
  assert_int_equal(recv_wait(head, true, &r, &e), SF_EFORMAT);
  assert_non_null(strstr(e.message, "not a valid sf_wire.Header"));
  expect_next_ok(head, attacker, 1000);

  /* an empty header frame decodes to version 0 */
  send_raw(attacker, garbage, 0, NULL, 0);
  assert_int_equal(recv_wait(head, true, &r, &e), SF_EFORMAT);
  expect_next_ok(head, attacker, 1001);

  /* too many samples (empty ones, each a few bytes) */
  craft_init(&c);
  c.n_frames = 0;
  enum { MANY = SF_WIRE_MAX_SAMPLES + 1 };
  SfWire__SampleMeta *many = calloc(MANY, sizeof *many);
  SfWire__SampleMeta **ptrs = calloc(MANY, sizeof *ptrs);
  for (int i = 0; i < MANY; i++) {
    sf_wire__sample_meta__init(&many[i]);
    ptrs[i] = &many[i];
  }
  c.h.samples = ptrs;
  c.h.n_samples = MANY;
  n = sf_wire__header__get_packed_size(&c.h);
  uint8_t *big = malloc(n);
  sf_wire__header__pack(&c.h, big);
  send_raw(attacker, big, n, NULL, 0);
  free(big);
  free(many);
  free(ptrs);
  assert_int_equal(recv_wait(head, true, &r, &e), SF_ETOOBIG);
  assert_non_null(strstr(e.message, "4097 samples"));
  expect_next_ok(head, attacker, 1002);

  /* a header frame over the limit */
  size_t huge = (size_t)SF_WIRE_MAX_HEADER + 1;
  big = calloc(huge, 1);
  send_raw(attacker, big, huge, NULL, 0);
  free(big);
  assert_int_equal(recv_wait(head, true, &r, &e), SF_ETOOBIG);
  expect_next_ok(head, attacker, 1003);

  /* more payload frames than allowed: all consumed, then refused */
  craft_init(&c);
  n = sf_wire__header__pack(&c.h, packed);
  assert_int_equal(zmq_send(attacker, packed, n, ZMQ_SNDMORE), (int)n);
  for (int i = 0; i <= SF_WIRE_MAX_FRAMES; i++)
    assert_int_equal(zmq_send(attacker, "", 0, i < SF_WIRE_MAX_FRAMES ? ZMQ_SNDMORE : 0), 0);
  assert_int_equal(recv_wait(head, true, &r, &e), SF_ETOOBIG);
  assert_non_null(strstr(e.message, "65537 payload frames"));
  expect_next_ok(head, attacker, 1004);

  /* a routing id and nothing else can only come from a raw ROUTER peer: decode sees no header */
  assert_int_equal(sf_wire_decode(NULL, 0, NULL, 0, &r, &e), SF_EFORMAT);
  assert_int_equal(sf_wire_decode(packed, n, NULL, -1, &r, &e), SF_ETOOBIG);
}

/* Another wire version: only a BYE (its reason) is read; anything else is refused naming both versions. */
static void test_version(void **state) {
  SfWire__Header h = SF_WIRE__HEADER__INIT;
  h.version = SF_WIRE_VERSION + 1;
  h.type = SF_WIRE__MESSAGE_TYPE__BYE;
  h.text = "wire version mismatch";
  uint8_t packed[128];
  size_t n = sf_wire__header__pack(&h, packed);
  sf_wire_message r = {0};
  sf_error e;
  assert_int_equal(sf_wire_decode(packed, n, NULL, 0, &r, &e), 0);
  assert_int_equal(r.type, SF_WIRE_BYE);
  assert_string_equal(r.text, "wire version mismatch");
  sf_wire_message_clear(&r);
  h.type = SF_WIRE__MESSAGE_TYPE__HELLO;
  h.text = "w";
  n = sf_wire__header__pack(&h, packed);
  assert_int_equal(sf_wire_decode(packed, n, NULL, 0, &r, &e), SF_EFORMAT);
  char expect[64];
  snprintf(expect, sizeof expect, "wire version %d, this shardflow %d", SF_WIRE_VERSION + 1, SF_WIRE_VERSION);
  assert_non_null(strstr(e.message, expect));
}

/* Decoding straight from bytes, as the fuzz target does: frames are borrowed, fields take references. */
static void test_decode_borrowed_frames(void **state) {
  craft c;
  craft_init(&c);
  c.field.dtype = SF_DTYPE_INT32;
  c.shape[0] = 2;
  uint8_t packed[256];
  size_t n = sf_wire__header__pack(&c.h, packed);
  sf_buffer *frame = sf_buffer_new(8);
  int32_t values[2] = {-7, 123456};
  memcpy(sf_buffer_data(frame), values, 8);
  sf_wire_message r = {0};
  sf_error e;
  assert_int_equal(sf_wire_decode(packed, n, &frame, 1, &r, &e), 0);
  assert_ptr_equal(r.samples[0]->fields[0].tensor.buffer, frame);
  assert_false(sf_buffer_is_writable(frame));
  sf_buffer_unref(&frame);
  const int32_t *v = sf_tensor_data(&r.samples[0]->fields[0].tensor);
  assert_int_equal(v[0], -7);
  assert_int_equal(v[1], 123456);
  sf_wire_message_clear(&r);

  /* a misaligned frame is copied into aligned memory */
  _Alignas(8) uint8_t raw[16] = {0};
  memcpy(raw + 1, values, 8);
  frame = sf_buffer_wrap(raw + 1, 8, NULL, NULL);
  assert_int_equal(sf_wire_decode(packed, n, &frame, 1, &r, &e), 0);
  assert_ptr_not_equal(sf_tensor_data(&r.samples[0]->fields[0].tensor), raw + 1);
  assert_int_equal(((const int32_t *)sf_tensor_data(&r.samples[0]->fields[0].tensor))[1], 123456);
  assert_true(sf_buffer_is_writable(frame));
  sf_buffer_unref(&frame);
  sf_wire_message_clear(&r);
}

/* ---- the fuzz target's seed corpus ----------------------------------------------------------- */

/* Appends a u32 LE. */
static void put_u32(uint8_t **p, uint32_t v) {
  for (int i = 0; i < 4; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}

/*
 * Sends msg through sf_wire_send to a raw ROUTER, receives its frames as bytes, and writes them in
 * fuzz_wire.c's input format to $SF_WIRE_CORPUS/name (when set).  Checks that sf_wire_decode accepts
 * the captured frames, so every corpus entry is a valid message.
 */
static void capture(void *raw, void *dealer, const sf_wire_message *msg, const char *name, bool odd) {
  send_ok(dealer, msg);
  zmq_pollitem_t item = {.socket = raw, .events = ZMQ_POLLIN};
  assert_int_equal(zmq_poll(&item, 1, 5000), 1);
  zmq_msg_t parts[64];
  int n = 0, more = 1;
  size_t total = 4;
  while (more) {
    assert_true(n < 64);
    zmq_msg_init(&parts[n]);
    assert_true(zmq_msg_recv(&parts[n], raw, 0) >= 0);
    more = zmq_msg_more(&parts[n]);
    total += zmq_msg_size(&parts[n]) + 4;
    n++;
  }
  /* parts[0] is the routing id, parts[1] the header, then the payload frames */
  uint8_t *buf = malloc(total), *p = buf;
  put_u32(&p, (uint32_t)zmq_msg_size(&parts[1]) | (odd ? 0x80000000u : 0));
  memcpy(p, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]));
  p += zmq_msg_size(&parts[1]);
  sf_buffer *frames[64];
  for (int i = 2; i < n; i++) {
    put_u32(&p, (uint32_t)zmq_msg_size(&parts[i]));
    memcpy(p, zmq_msg_data(&parts[i]), zmq_msg_size(&parts[i]));
    p += zmq_msg_size(&parts[i]);
    frames[i - 2] = sf_buffer_new(zmq_msg_size(&parts[i]));
    memcpy(sf_buffer_data(frames[i - 2]), zmq_msg_data(&parts[i]), zmq_msg_size(&parts[i]));
  }
  sf_wire_message r = {0};
  sf_error e;
  int rc = sf_wire_decode(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), frames, n - 2, &r, &e);
  if (rc != 0) fail_msg("%s: %s", name, e.message);
  assert_int_equal(r.type, msg->type);
  assert_int_equal(r.n_samples, msg->n_samples);
  sf_wire_message_clear(&r);
  for (int i = 2; i < n; i++) sf_buffer_unref(&frames[i - 2]);
  const char *dir = getenv("SF_WIRE_CORPUS");
  if (dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, (size_t)(p - buf), f), (size_t)(p - buf));
    fclose(f);
  }
  free(buf);
  for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
}

static void test_corpus(void **state) {
  void *raw = socket_bound(ZMQ_ROUTER, "inproc://corpus");
  void *dealer = socket_connected(ZMQ_DEALER, "inproc://corpus", NULL);
  sf_wire_message m = {.type = SF_WIRE_HELLO, .text = "worker-a", .pid = 4242, .threads = 2};
  capture(raw, dealer, &m, "hello", false);
  sf_graph *stages = sf_graph_new_empty("g.yaml");
  sf_graph_node_set(sf_graph_add_node(stages, "decode", "decode", 3), "mode", "rgb", 4);
  m = (sf_wire_message){.type = SF_WIRE_WELCOME, .stages = stages, .seed = 7, .epochs = 2,
                        .rank = 0, .world_size = 2, .error_policy = 0, .heartbeat_interval = 1, .heartbeat_timeout = 10};
  capture(raw, dealer, &m, "welcome", false);
  sf_graph_destroy(&stages);
  m = (sf_wire_message){.type = SF_WIRE_CREDIT, .credits = 4};
  capture(raw, dealer, &m, "credit", false);
  sf_wire_stage_stats stats[2] = {{"decode", 1, 2, 3, 4, 5}, {"augment", 6, 7, 8, 9, 0}};
  m = (sf_wire_message){.type = SF_WIRE_HEARTBEAT, .sequence = 9, .stats = stats, .n_stats = 2};
  capture(raw, dealer, &m, "heartbeat", false);
  sf_error errs[1];
  sf_error_set(&errs[0], SF_EFORMAT, SF_AT(.stage = "decode", .url = "http://h/s.tar", .key = "key1", .offset = 2048),
               "bad JPEG");
  m = (sf_wire_message){.type = SF_WIRE_ERROR, .errors = errs, .n_errors = 1};
  capture(raw, dealer, &m, "error", false);
  m = (sf_wire_message){.type = SF_WIRE_BYE, .text = "version mismatch"};
  capture(raw, dealer, &m, "bye", false);
  m = (sf_wire_message){.type = SF_WIRE_EPOCH_END, .epoch = 3};
  capture(raw, dealer, &m, "epoch_end", false);
  sample_set set;
  make_samples(&set);
  m = (sf_wire_message){.type = SF_WIRE_UNIT, .unit = 1, .epoch = 2, .samples = set.s, .n_samples = 3};
  capture(raw, dealer, &m, "unit", false);
  capture(raw, dealer, &m, "unit_odd", true);
  m = (sf_wire_message){.type = SF_WIRE_RESULT, .unit = 1, .epoch = 2, .samples = set.s + 1, .n_samples = 2,
                        .samples_in = 3, .skipped = 1, .errors = errs, .n_errors = 1, .stats = stats, .n_stats = 1};
  capture(raw, dealer, &m, "result", false);
  free_samples(&set);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_control_messages, close_sockets),
      cmocka_unit_test_teardown(test_unit_inproc_zero_copy, close_sockets),
      cmocka_unit_test_teardown(test_result_ipc, close_sockets),
      cmocka_unit_test_teardown(test_result_ring, close_sockets),
      cmocka_unit_test_teardown(test_routing, close_sockets),
      cmocka_unit_test_teardown(test_send_backpressure, close_sockets),
      cmocka_unit_test_teardown(test_malformed, close_sockets),
      cmocka_unit_test_teardown(test_decode_borrowed_frames, close_sockets),
      cmocka_unit_test_teardown(test_version, close_sockets),
      cmocka_unit_test_teardown(test_corpus, close_sockets),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
