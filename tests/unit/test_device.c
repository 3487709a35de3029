/* The device pool (engine/core/device.c) against a fake CUDA driver: reuse, leaks, stream order, failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buffer_device.h"
#include "cuda_driver.h"
#include "device.h"
#include "shardflow/dlpack.h"
#include "shardflow/stage.h"

/* ---- the fake driver: device memory is malloc'd, copies are memcpy at once, streams are names, and every
 * call that orders work is logged with a sequence number ---- */

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_LAUNCH, OP_SYNC };
typedef struct op {
  int kind;
  uintptr_t stream;
  void *event;
  sf_cu_deviceptr dst;
  size_t size;
} op;

typedef struct fake_event {
  int recorded_at; /* index in the log of its last record, -1 never */
  uintptr_t stream;
} fake_event;

static struct {
  op log[200000];
  int n_log;
  int ctx_depth; /* pushes not popped */
  int host_live, device_live, events_live, streams_live, ctx_retained, modules_live;
  int device_allocs, host_allocs;
  size_t device_bytes_live;
  int fail_device_alloc; /* the next N cuMemAlloc fail with out of memory */
  int fail_host_alloc;
  int fail_module;
  int gpus;
  int wakes;
} fake;

static void fake_reset(void) {
  memset(&fake, 0, sizeof fake);
  fake.gpus = 1;
}

static void log_op(int kind, uintptr_t stream, void *event, sf_cu_deviceptr dst, size_t size) {
  assert_true(fake.n_log < (int)(sizeof fake.log / sizeof fake.log[0]));
  fake.log[fake.n_log++] = (op){kind, stream, event, dst, size};
}

static sf_cu_result f_init(unsigned flags) { return flags ? 1 : 0; }
static sf_cu_result f_device_get_count(int *n) {
  *n = fake.gpus;
  return 0;
}
static sf_cu_result f_device_get(sf_cu_device *d, int ordinal) {
  *d = ordinal;
  return 0;
}
static sf_cu_result f_primary_ctx_retain(sf_cu_context *ctx, sf_cu_device d) {
  (void)d;
  fake.ctx_retained++;
  *ctx = (sf_cu_context)(uintptr_t)0xc0;
  return 0;
}
static sf_cu_result f_primary_ctx_release(sf_cu_device d) {
  (void)d;
  fake.ctx_retained--;
  return 0;
}
static sf_cu_result f_ctx_set_current(sf_cu_context ctx) { return ctx == (sf_cu_context)(uintptr_t)0xc0 ? 0 : 201; }
static sf_cu_result f_ctx_push_current(sf_cu_context ctx) {
  assert_ptr_equal(ctx, (sf_cu_context)(uintptr_t)0xc0);
  fake.ctx_depth++;
  return 0;
}
static sf_cu_result f_ctx_pop_current(sf_cu_context *ctx) {
  assert_true(fake.ctx_depth > 0);
  fake.ctx_depth--;
  *ctx = (sf_cu_context)(uintptr_t)0xc0;
  return 0;
}
static sf_cu_result f_mem_host_alloc(void **p, size_t size, unsigned flags) {
  (void)flags;
  if (fake.fail_host_alloc) {
    fake.fail_host_alloc--;
    return SF_CU_ERROR_OUT_OF_MEMORY;
  }
  *p = malloc(size);
  fake.host_live++;
  fake.host_allocs++;
  return 0;
}
static sf_cu_result f_mem_free_host(void *p) {
  free(p);
  fake.host_live--;
  return 0;
}
/* Device allocations carry their size in front, so that frees can be counted in bytes. */
static sf_cu_result f_mem_alloc(sf_cu_deviceptr *d, size_t size) {
  if (fake.fail_device_alloc) {
    fake.fail_device_alloc--;
    return SF_CU_ERROR_OUT_OF_MEMORY;
  }
  size_t *m = malloc(size + 256);
  *m = size;
  *d = (sf_cu_deviceptr)(uintptr_t)((uint8_t *)m + 256);
  fake.device_live++;
  fake.device_allocs++;
  fake.device_bytes_live += size;
  return 0;
}
static sf_cu_result f_mem_free(sf_cu_deviceptr d) {
  size_t *m = (size_t *)((uint8_t *)(uintptr_t)d - 256);
  fake.device_bytes_live -= *m;
  free(m);
  fake.device_live--;
  return 0;
}
static sf_cu_result f_stream_create(sf_cu_stream *s, unsigned flags) {
  assert_int_equal(flags, SF_CU_STREAM_NON_BLOCKING);
  *s = (sf_cu_stream)malloc(1);
  fake.streams_live++;
  return 0;
}
static sf_cu_result f_stream_destroy(sf_cu_stream s) {
  free(s);
  fake.streams_live--;
  return 0;
}
static sf_cu_result f_memcpy_htod_async(sf_cu_deviceptr dst, const void *src, size_t size, sf_cu_stream s) {
  memcpy((void *)(uintptr_t)dst, src, size);
  log_op(OP_COPY, (uintptr_t)s, NULL, dst, size);
  return 0;
}
static sf_cu_result f_event_create(sf_cu_event *e, unsigned flags) {
  (void)flags;
  fake_event *f = malloc(sizeof *f);
  f->recorded_at = -1;
  *e = (sf_cu_event)f;
  fake.events_live++;
  return 0;
}
static sf_cu_result f_event_destroy(sf_cu_event e) {
  free(e);
  fake.events_live--;
  return 0;
}
static sf_cu_result f_event_record(sf_cu_event e, sf_cu_stream s) {
  fake_event *f = (fake_event *)e;
  f->recorded_at = fake.n_log;
  f->stream = (uintptr_t)s;
  log_op(OP_RECORD, (uintptr_t)s, e, 0, 0);
  return 0;
}
static sf_cu_result f_event_query(sf_cu_event e) {
  (void)e;
  return 0;
}
static sf_cu_result f_event_synchronize(sf_cu_event e) {
  log_op(OP_SYNC, 0, e, 0, 0);
  return 0;
}
static sf_cu_result f_stream_wait_event(sf_cu_stream s, sf_cu_event e, unsigned flags) {
  assert_int_equal(flags, 0);
  assert_true(((fake_event *)e)->recorded_at >= 0); /* waiting for an event never recorded is a bug */
  log_op(OP_WAIT, (uintptr_t)s, e, 0, 0);
  return 0;
}
static sf_cu_result f_get_error_string(sf_cu_result r, const char **text) {
  *text = r == SF_CU_ERROR_OUT_OF_MEMORY ? "out of memory (fake)" : "fake error";
  return 0;
}
static sf_cu_result f_module_load_data(sf_cu_module *m, const void *image) {
  if (fake.fail_module) return 218; /* CUDA_ERROR_INVALID_PTX */
  assert_non_null(strstr(image, ".entry sf_normalize_u8("));
  *m = (sf_cu_module)malloc(1);
  fake.modules_live++;
  return 0;
}
static sf_cu_result f_module_unload(sf_cu_module m) {
  free(m);
  fake.modules_live--;
  return 0;
}
static sf_cu_result f_module_get_function(sf_cu_function *f, sf_cu_module m, const char *name) {
  (void)m;
  assert_string_equal(name, "sf_normalize_u8");
  *f = (sf_cu_function)(uintptr_t)0xf0;
  return 0;
}
/* The kernel, run on the host by the fake: the parameters as device.c packs them (kernel's signature). */
static sf_cu_result f_launch_kernel(sf_cu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared, sf_cu_stream s, void **params, void **extra) {
  assert_int_equal((uintptr_t)f, 0xf0);
  assert_true(gx >= 1 && gy >= 1 && gz == 1 && bx == 256 && by == 1 && bz == 1 && shared == 0 && !extra);
  const uint8_t *src = (const uint8_t *)(uintptr_t) * (sf_cu_deviceptr *)params[0];
  long long sb = *(long long *)params[1], sc = *(long long *)params[2], sy = *(long long *)params[3],
            sx = *(long long *)params[4];
  uint8_t *dst = (uint8_t *)(uintptr_t) * (sf_cu_deviceptr *)params[5];
  const uint8_t *lut = (const uint8_t *)(uintptr_t) * (sf_cu_deviceptr *)params[6];
  unsigned channels = *(unsigned *)params[7], height = *(unsigned *)params[8], width = *(unsigned *)params[9],
           planes = *(unsigned *)params[10], size = *(unsigned *)params[11];
  assert_true(size == 4 || size == 2);
  for (unsigned plane = 0; plane < planes; plane++)
    for (unsigned p = 0; p < height * width; p++) {
      unsigned b = plane / channels, c = plane % channels, y = p / width, x = p % width;
      unsigned v = src[b * sb + c * sc + y * sy + x * sx];
      memcpy(dst + ((size_t)plane * height * width + p) * size, lut + ((size_t)c * 256 + v) * size, size);
    }
  log_op(OP_LAUNCH, (uintptr_t)s, NULL, (sf_cu_deviceptr)(uintptr_t)dst, 0);
  return 0;
}

static const sf_cuda_api fake_api = {
    .init = f_init,
    .device_get_count = f_device_get_count,
    .device_get = f_device_get,
    .primary_ctx_retain = f_primary_ctx_retain,
    .primary_ctx_release = f_primary_ctx_release,
    .ctx_set_current = f_ctx_set_current,
    .ctx_push_current = f_ctx_push_current,
    .ctx_pop_current = f_ctx_pop_current,
    .mem_host_alloc = f_mem_host_alloc,
    .mem_free_host = f_mem_free_host,
    .mem_alloc = f_mem_alloc,
    .mem_free = f_mem_free,
    .stream_create = f_stream_create,
    .stream_destroy = f_stream_destroy,
    .memcpy_htod_async = f_memcpy_htod_async,
    .event_create = f_event_create,
    .event_destroy = f_event_destroy,
    .event_record = f_event_record,
    .event_query = f_event_query,
    .event_synchronize = f_event_synchronize,
    .stream_wait_event = f_stream_wait_event,
    .get_error_string = f_get_error_string,
    .module_load_data = f_module_load_data,
    .module_unload = f_module_unload,
    .module_get_function = f_module_get_function,
    .launch_kernel = f_launch_kernel,
};

/* ---- helpers ---- */

/* A batch as the batch stage makes it: images uint8 [B,H,W,3] (hwc) or float32, labels int64 [B], keys. */
static sf_batch *make_batch(int64_t b, int64_t h, int64_t w, unsigned seed) {
  sf_batch *batch = sf_batch_new(b);
  assert_non_null(batch);
  batch->n_fields = 2;
  snprintf(batch->fields[0].name, sizeof batch->fields[0].name, "jpg");
  int64_t shape[4] = {b, h, w, 3};
  assert_int_equal(sf_tensor_alloc(&batch->fields[0].tensor, SF_DTYPE_UINT8, 4, shape), 0);
  uint8_t *px = sf_tensor_data(&batch->fields[0].tensor);
  for (int64_t i = 0; i < b * h * w * 3; i++)
    px[i] = (uint8_t)(i * 7 + seed);
  snprintf(batch->fields[1].name, sizeof batch->fields[1].name, "cls");
  assert_int_equal(sf_tensor_alloc(&batch->fields[1].tensor, SF_DTYPE_INT64, 1, shape), 0);
  int64_t *cls = sf_tensor_data(&batch->fields[1].tensor);
  for (int64_t i = 0; i < b; i++) {
    cls[i] = (int64_t)(seed * 1000 + i);
    char key[32];
    snprintf(key, sizeof key, "s%u-%lld", seed, (long long)i);
    batch->keys[i] = strdup(key);
  }
  return batch;
}

static void *device_data(const sf_tensor *t) { return (uint8_t *)sf_buffer_data(t->buffer) + t->offset; }

static sf_device_pool *open_pool(void) {
  sf_device_pool *p = NULL;
  sf_error e = {0};
  assert_int_equal(sf_device_pool_new(&p, &fake_api, 0, &e), 0);
  return p;
}

static void assert_nothing_held(void) {
  assert_int_equal(fake.host_live, 0);
  assert_int_equal(fake.device_live, 0);
  assert_int_equal(fake.device_bytes_live, 0);
  assert_int_equal(fake.events_live, 0);
  assert_int_equal(fake.streams_live, 0);
  assert_int_equal(fake.ctx_retained, 0);
  assert_int_equal(fake.modules_live, 0);
  assert_int_equal(fake.ctx_depth, 0);
}

/* ---- tests ---- */

/* Every field reaches device memory with its bytes, dtype and shape; DLPack says kDLCUDA and that memory. */
static void test_move_values(void **state) {
  (void)state;
  fake_reset();
  sf_device_pool *p = open_pool();
  sf_batch *b = make_batch(4, 5, 6, 3), *ref = make_batch(4, 5, 6, 3);
  sf_error e = {0};
  assert_int_equal(sf_device_pool_move(p, b, NULL, &e), 0);
  for (int i = 0; i < 2; i++) {
    const sf_tensor *t = &b->fields[i].tensor, *r = &ref->fields[i].tensor;
    assert_int_equal(t->dtype, r->dtype);
    assert_int_equal(t->ndim, r->ndim);
    assert_memory_equal(t->shape, r->shape, sizeof t->shape[0] * (size_t)t->ndim);
    assert_true(sf_tensor_is_contiguous(t));
    assert_int_equal(t->offset % 256, 0);
    assert_memory_equal(device_data(t), sf_tensor_data(r), sf_tensor_nbytes(r));
    DLManagedTensor *m;
    assert_int_equal(sf_batch_to_dlpack(b, i, &m), 0);
    assert_int_equal(m->dl_tensor.device.device_type, kDLCUDA);
    assert_int_equal(m->dl_tensor.device.device_id, 0);
    assert_ptr_equal((uint8_t *)m->dl_tensor.data + m->dl_tensor.byte_offset, device_data(t));
    m->deleter(m);
  }
  assert_string_equal(sf_batch_key(b, 2), "s3-2"); /* keys stay with the batch */
  sf_batch_destroy(&b);
  sf_batch_destroy(&ref);
  sf_device_pool_destroy(&p);
  assert_nothing_held();
}

/* Batches dropped as they come: one device buffer and one pinned buffer serve all, and all goes at the end. */
static void test_reuse_no_leak(void **state) {
  (void)state;
  fake_reset();
  sf_device_pool *p = open_pool();
  for (unsigned k = 0; k < 2000; k++) {
    sf_batch *b = make_batch(8, 4, 4, k);
    sf_error e = {0};
    assert_int_equal(sf_device_pool_move(p, b, NULL, &e), 0);
    assert_int_equal(((int64_t *)device_data(&b->fields[1].tensor))[7], (int64_t)k * 1000 + 7);
    sf_batch_destroy(&b);
    fake.n_log = 0;
  }
  sf_device_pool_stats st;
  sf_device_pool_stats_get(p, &st);
  assert_int_equal(st.batches, 2000);
  assert_int_equal(st.device_buffers, 1);
  assert_int_equal(st.pinned_buffers, 1);
  assert_int_equal(fake.device_allocs, 1);
  assert_int_equal(fake.host_allocs, 1);
  assert_int_equal(st.device_allocs, 1);
  assert_int_equal(st.pinned_allocs, 1);
  /* the trainer holding three batches at once: three buffers, then reused */
  sf_batch *held[3];
  for (unsigned round = 0; round < 50; round++) {
    for (int i = 0; i < 3; i++) {
      held[i] = make_batch(8, 4, 4, round + (unsigned)i);
      sf_error e = {0};
      assert_int_equal(sf_device_pool_move(p, held[i], NULL, &e), 0);
    }
    for (int i = 0; i < 3; i++)
      sf_batch_destroy(&held[i]);
    fake.n_log = 0;
  }
  assert_int_equal(fake.device_allocs, 3);
  sf_device_pool_destroy(&p);
  assert_nothing_held();
}

static int find(int kind, uintptr_t stream, void *event, int from) {
  for (int i = from; i < fake.n_log; i++)
    if (fake.log[i].kind == kind && (!stream || fake.log[i].stream == stream) && (!event || fake.log[i].event == event))
      return i;
  return -1;
}

/*
 * DLPack's stream contract: the consumer's stream waits for an event recorded after the copy into the
 * tensor's memory; when the consumer drops the tensor an event is recorded on its stream, and the next copy
 * into that memory waits for it first.
 */
static void test_stream_order(void **state) {
  (void)state;
  fake_reset();
  sf_device_pool *p = open_pool();
  sf_batch *b = make_batch(2, 3, 3, 1);
  sf_error e = {0};
  assert_int_equal(sf_device_pool_move(p, b, NULL, &e), 0);
  int copy = find(OP_COPY, 0, NULL, 0);
  assert_true(copy >= 0);
  uintptr_t sink_stream = fake.log[copy].stream;
  sf_cu_deviceptr memory = fake.log[copy].dst;
  assert_true(sink_stream > 2); /* a stream of its own, not a default stream */
  DLManagedTensor *m;
  assert_int_equal(sf_batch_to_dlpack(b, 0, &m), 0);
  const uintptr_t consumer = 0x7777;
  int before = fake.n_log;
  assert_int_equal(sf_dlpack_wait(m, (int64_t)consumer), 0);
  int wait = find(OP_WAIT, consumer, NULL, before);
  assert_true(wait >= 0);
  fake_event *ready = fake.log[wait].event;
  assert_true(ready->recorded_at > copy);       /* recorded after the copy ... */
  assert_int_equal(ready->stream, sink_stream); /* ... on the sink's stream */
  /* stream -1: no ordering asked, nothing queued */
  before = fake.n_log;
  assert_int_equal(sf_dlpack_wait(m, -1), 0);
  assert_int_equal(fake.n_log, before);
  /* legacy default stream: 1 is passed through as CU_STREAM_LEGACY */
  assert_int_equal(sf_dlpack_wait(m, 1), 0);
  assert_true(find(OP_WAIT, 1, ready, before) >= 0);
  assert_int_equal(sf_dlpack_wait(m, (int64_t)consumer), 0); /* the last stream given is the one remembered */
  /* drop everything: the release is recorded on the consumer's stream */
  before = fake.n_log;
  sf_batch_destroy(&b);
  assert_int_equal(find(OP_RECORD, 0, NULL, before), -1); /* the tensor still holds the memory */
  m->deleter(m);
  int released = find(OP_RECORD, consumer, NULL, before);
  assert_true(released >= 0);
  void *release_event = fake.log[released].event;
  /* the next batch reuses the memory, and its copy comes after the consumer's work */
  b = make_batch(2, 3, 3, 2);
  before = fake.n_log;
  assert_int_equal(sf_device_pool_move(p, b, NULL, &e), 0);
  int waited = find(OP_WAIT, sink_stream, release_event, before);
  int copied = find(OP_COPY, sink_stream, NULL, before);
  assert_true(waited >= 0 && copied > waited);
  assert_int_equal(fake.log[copied].dst, memory);
  /* a batch dropped without any consumer stream: reused without a wait */
  sf_batch_destroy(&b);
  b = make_batch(2, 3, 3, 3);
  before = fake.n_log;
  assert_int_equal(sf_device_pool_move(p, b, NULL, &e), 0);
  assert_int_equal(find(OP_WAIT, sink_stream, NULL, before), -1);
  sf_batch_destroy(&b);
  sf_device_pool_destroy(&p);
  assert_nothing_held();
}

static void count_wake(void *arg) {
  assert_int_equal((uintptr_t)arg, 0x99);
  fake.wakes++;
}

/* prefetch: batches moved and not taken; taking (an export) or dropping one wakes the sink. */
static void test_ahead(void **state) {
  (void)state;
  fake_reset();
  sf_device_pool *p = open_pool();
  sf_device_pool_set_wake(p, count_wake, (void *)(uintptr_t)0x99);
  sf_batch *b[3];
  sf_error e = {0};
  for (int i = 0; i < 3; i++) {
    b[i] = make_batch(2, 2, 2, (unsigned)i);
    assert_int_equal(sf_device_pool_move(p, b[i], NULL, &e), 0);
    assert_int_equal(sf_device_pool_ahead(p), i + 1);
  }
  DLManagedTensor *m0, *m1;
  assert_int_equal(sf_batch_to_dlpack(b[0], 0, &m0), 0);
  assert_int_equal(sf_device_pool_ahead(p), 2);
  assert_int_equal(fake.wakes, 1);
  assert_int_equal(sf_batch_to_dlpack(b[0], 1, &m1), 0); /* the same batch again: no change */
  assert_int_equal(sf_device_pool_ahead(p), 2);
  assert_int_equal(fake.wakes, 1);
  sf_batch_destroy(&b[1]); /* dropped untaken */
  assert_int_equal(sf_device_pool_ahead(p), 1);
  assert_int_equal(fake.wakes, 2);
  /* the owner goes first: its wake stops, the tensors and the batch still out keep the pool */
  sf_device_pool_destroy(&p);
  sf_batch_destroy(&b[0]);
  assert_true(fake.device_live > 0);
  m0->deleter(m0);
  m1->deleter(m1);
  sf_batch_destroy(&b[2]);
  assert_int_equal(fake.wakes, 2);
  assert_nothing_held();
}

/* Normalising on the device gives augment's table values, [B,C,H,W], from [B,H,W,C] or [B,C,H,W] bytes. */
static void test_normalize(void **state) {
  (void)state;
  fake_reset();
  sf_device_pool *p = open_pool();
  const double mean[3] = {0.4914, 0.4822, 0.4465}, std[3] = {0.2023, 0.1994, 0.2010};
  float f32[3][256];
  uint16_t bf16[3][256];
  for (int c = 0; c < 3; c++)
    for (int x = 0; x < 256; x++) {
      f32[c][x] = (float)((x / 255.0 - mean[c]) / std[c]); /* augment's formula (docs/stages.md) */
      uint32_t bits;
      memcpy(&bits, &f32[c][x], 4);
      bf16[c][x] = (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
  for (int hwc = 0; hwc < 2; hwc++)
    for (int bf = 0; bf < 2; bf++) {
      const int64_t B = 3, H = 5, W = 7, C = 3;
      sf_batch *b = make_batch(B, H, W, 11);
      if (!hwc) { /* the same bytes read as [B,C,H,W] */
        sf_tensor *t = &b->fields[0].tensor;
        int64_t shape[4] = {B, C, H, W};
        sf_buffer *buf = sf_buffer_ref(t->buffer);
        sf_tensor_clear(t);
        assert_int_equal(sf_tensor_view(t, SF_DTYPE_UINT8, 4, shape, buf, 0), 0);
      }
      sf_tensor src;
      sf_tensor_ref(&src, &b->fields[0].tensor);
      sf_device_normalize nm = {.field = 0,
                                .hwc = hwc,
                                .dtype = bf ? SF_DTYPE_BFLOAT16 : SF_DTYPE_FLOAT32,
                                .tables = bf ? (const void *)bf16 : (const void *)f32};
      sf_error e = {0};
      assert_int_equal(sf_device_pool_move(p, b, &nm, &e), 0);
      const sf_tensor *t = &b->fields[0].tensor;
      assert_int_equal(t->dtype, nm.dtype);
      assert_int_equal(t->ndim, 4);
      int64_t want[4] = {B, C, H, W};
      assert_memory_equal(t->shape, want, sizeof want);
      const uint8_t *in = sf_tensor_data(&src), *out = device_data(t);
      for (int64_t i = 0; i < B; i++)
        for (int64_t c = 0; c < C; c++)
          for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
              uint8_t v = hwc ? in[((i * H + y) * W + x) * C + c] : in[((i * C + c) * H + y) * W + x];
              size_t at = (size_t)(((i * C + c) * H + y) * W + x);
              if (bf)
                assert_memory_equal(out + at * 2, &bf16[c][v], 2);
              else
                assert_memory_equal(out + at * 4, &f32[c][v], 4);
            }
      /* the labels still arrive */
      assert_int_equal(((int64_t *)device_data(&b->fields[1].tensor))[2], 11 * 1000 + 2);
      sf_tensor_clear(&src);
      sf_batch_destroy(&b);
    }
  sf_device_pool_destroy(&p);
  assert_nothing_held();
}

/* Out of device or pinned memory, or a kernel that does not load: a clean error, the batch untouched. */
static void test_failures(void **state) {
  (void)state;
  fake_reset();
  sf_device_pool *p = open_pool();
  sf_batch *b = make_batch(2, 3, 3, 5), *ref = make_batch(2, 3, 3, 5);
  sf_error e = {0};
  fake.fail_device_alloc = 1;
  assert_int_equal(sf_device_pool_move(p, b, NULL, &e), SF_ENOMEM);
  assert_non_null(strstr(e.message, "cannot allocate"));
  assert_non_null(strstr(e.message, "out of memory (fake)"));
  assert_non_null(strstr(e.message, "lower batch_size"));
  assert_null(sf_buffer_device_of(b->fields[0].tensor.buffer, NULL) ? "moved" : NULL);
  assert_memory_equal(sf_tensor_data(&b->fields[0].tensor), sf_tensor_data(&ref->fields[0].tensor), 54);
  /* out of memory with idle buffers: they are freed and the allocation tried again */
  sf_batch *small = make_batch(1, 1, 1, 1);
  assert_int_equal(sf_device_pool_move(p, small, NULL, &e), 0);
  sf_batch_destroy(&small);
  fake.fail_device_alloc = 1;
  sf_batch *big = make_batch(64, 8, 8, 1);
  assert_int_equal(sf_device_pool_move(p, big, NULL, &e), 0);
  sf_batch_destroy(&big);
  fake.fail_host_alloc = 1;
  sf_device_pool *q = open_pool();
  e = (sf_error){0};
  assert_int_equal(sf_device_pool_move(q, b, NULL, &e), SF_ENOMEM);
  assert_non_null(strstr(e.message, "cannot pin"));
  fake.fail_module = 1;
  const float tables[3][256] = {{0}};
  sf_device_normalize nm = {.field = 0, .hwc = true, .dtype = SF_DTYPE_FLOAT32, .tables = tables};
  e = (sf_error){0};
  assert_int_equal(sf_device_pool_move(q, b, &nm, &e), SF_EUNSUPPORTED);
  assert_non_null(strstr(e.message, "normalise kernel does not load"));
  fake.fail_module = 0;
  nm.field = 1; /* int64 labels cannot be normalised */
  assert_int_equal(sf_device_pool_move(q, b, &nm, &e), SF_ESHAPE);
  assert_non_null(strstr(e.message, "'cls'"));
  assert_memory_equal(sf_tensor_data(&b->fields[0].tensor), sf_tensor_data(&ref->fields[0].tensor), 54);
  sf_batch_destroy(&b);
  sf_batch_destroy(&ref);
  sf_device_pool_destroy(&p);
  sf_device_pool_destroy(&q);
  assert_nothing_held();
}

static void test_no_such_gpu(void **state) {
  (void)state;
  fake_reset();
  fake.gpus = 2;
  sf_device_pool *p = NULL;
  sf_error e = {0};
  assert_int_equal(sf_device_pool_new(&p, &fake_api, 2, &e), SF_EOPTION);
  assert_null(p);
  assert_non_null(strstr(e.message, "cuda:2: there is no such GPU: this machine shows 2 (cuda:0 to cuda:1"));
  assert_nothing_held();
}

/* No driver: the loader says so with dlopen's words (SF_CUDA_LIBRARY points at a file that is not there). */
static void test_no_driver(void **state) {
  (void)state;
  setenv("SF_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  const sf_cuda_api *api = (const sf_cuda_api *)1;
  sf_error e = {0};
  assert_int_equal(sf_cuda_load(&api, &e), SF_EUNSUPPORTED);
  assert_null(api);
  assert_non_null(strstr(e.message, "no CUDA driver on this machine: cannot load /nonexistent/libcuda.so.1"));
  assert_non_null(strstr(e.message, "/nonexistent/libcuda.so.1: cannot open shared object file")); /* dlerror */
  e = (sf_error){0};
  assert_int_equal(sf_cuda_load(&api, &e), SF_EUNSUPPORTED); /* every later call says the same */
  assert_non_null(strstr(e.message, "no CUDA driver on this machine"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_move_values), cmocka_unit_test(test_reuse_no_leak), cmocka_unit_test(test_stream_order),
      cmocka_unit_test(test_ahead),       cmocka_unit_test(test_normalize),     cmocka_unit_test(test_failures),
      cmocka_unit_test(test_no_such_gpu), cmocka_unit_test(test_no_driver),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
