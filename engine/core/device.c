/* The device pool: batches packed into pinned buffers, copied asynchronously to reused GPU buffers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

#include "buffer_device.h"
#include "device.h"
#include "log.h"

/* Field offsets in a batch's buffers: what cuMemAlloc guarantees, and more than any dtype needs. */
enum { ALIGN = 256 };
/* Pinned staging buffers: one per copy in flight; more only waits for the oldest (a copy is quick). */
enum { MAX_STAGING = 4 };
/* Idle device buffers kept beyond those the trainer and the queue hold (a shorter last batch, an epoch's end). */
enum { MAX_IDLE = 8 };

#include "device_kernels_ptx.h"

typedef struct staging {
  void *host; /* cuMemHostAlloc'd */
  size_t size;
  sf_cu_event done; /* recorded after the last copy out of it */
} staging;

typedef struct slot {
  sf_device_pool *pool;
  sf_cu_deviceptr ptr;
  size_t size;
  sf_cu_event ready;    /* recorded after the batch's copy (and kernel): what consumers wait for */
  sf_cu_event released; /* recorded on the consumer's stream when the batch was dropped */
  bool release_pending; /* the next copy into it waits for `released` */
  bool has_stream;      /* a consumer gave its stream (sf_dlpack_wait) */
  int64_t stream;
  bool claimed;      /* the trainer took the batch, or dropped it */
  struct slot *next; /* on the free list */
} slot;

struct sf_device_pool {
  atomic_size_t refs; /* the owner's, and one per device buffer out */
  const sf_cuda_api *cu;
  int ordinal;
  sf_cu_device device;
  sf_cu_context ctx;
  sf_cu_stream stream;
  sf_buffer_device where;
  pthread_mutex_t lock; /* the free list, the counts, the slots' consumer state, wake */
  slot *free_list;
  size_t n_idle, n_slots, device_bytes;
  int ahead;
  void (*wake)(void *);
  void *wake_arg;
  /* only the owner's thread (sf_device_pool_move) touches these */
  staging stage[MAX_STAGING];
  int n_stage, next_stage;
  sf_cu_module module;
  sf_cu_function normalize;
  uint64_t batches, pinned_allocs;
  uint64_t device_allocs; /* under the lock */
};

/* A driver call that failed, as *error: what was asked and the driver's words. */
static int cu_fail(sf_device_pool *p, sf_error *error, int code, sf_cu_result r, const char *what) {
  return sf_error_set(error, code, SF_NOWHERE, "cuda:%d: %s: %s", p->ordinal, what, sf_cuda_error_text(p->cu, r));
}

static void slot_free(sf_device_pool *p, slot *s) {
  p->cu->mem_free(s->ptr);
  p->cu->event_destroy(s->ready);
  p->cu->event_destroy(s->released);
  p->device_bytes -= s->size;
  p->n_slots--;
  free(s);
}

static void pool_free(sf_device_pool *p) {
  /* Any thread (the last tensor's release): its current context is left as it was. */
  bool pushed = p->ctx && p->cu->ctx_push_current(p->ctx) == SF_CU_SUCCESS;
  for (int i = 0; i < p->n_stage; i++) {
    p->cu->event_synchronize(p->stage[i].done); /* its copy reads the host memory until done */
    p->cu->mem_free_host(p->stage[i].host);
    p->cu->event_destroy(p->stage[i].done);
  }
  for (slot *s = p->free_list, *next; s; s = next) {
    next = s->next;
    if (s->release_pending) p->cu->event_synchronize(s->released);
    slot_free(p, s);
  }
  if (p->module) p->cu->module_unload(p->module);
  if (p->stream) p->cu->stream_destroy(p->stream);
  if (pushed) {
    sf_cu_context popped;
    p->cu->ctx_pop_current(&popped);
  }
  if (p->ctx) p->cu->primary_ctx_release(p->device);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

static void pool_unref(sf_device_pool *p) {
  if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1) pool_free(p);
}

/* The trainer took or dropped the batch: one fewer ahead. Under the lock. */
static void claim(sf_device_pool *p, slot *s) {
  if (s->claimed) return;
  s->claimed = true;
  p->ahead--;
  if (p->wake) p->wake(p->wake_arg);
}

static void exported(void *opaque) {
  slot *s = opaque;
  pthread_mutex_lock(&s->pool->lock);
  claim(s->pool, s);
  pthread_mutex_unlock(&s->pool->lock);
}

static int wait_on(void *opaque, int64_t stream) {
  slot *s = opaque;
  sf_device_pool *p = s->pool;
  int rc = 0;
  pthread_mutex_lock(&p->lock);
  claim(p, s);
  if (stream != -1) {
    /* 0 is not a valid DLPack stream for CUDA (ambiguous); it means the legacy default stream here. */
    sf_cu_stream consumer = stream == 0 ? SF_CU_STREAM_LEGACY : (sf_cu_stream)(uintptr_t)stream;
    /* The trainer's thread: its current context (the same primary context, as a rule) is left as it was. */
    sf_cu_result r = p->cu->ctx_push_current(p->ctx);
    if (r == SF_CU_SUCCESS) {
      r = p->cu->stream_wait_event(consumer, s->ready, 0);
      sf_cu_context popped;
      p->cu->ctx_pop_current(&popped);
    }
    if (r != SF_CU_SUCCESS) {
      sf_log(SF_LOG_ERROR, NULL, "cuda:%d: the consumer's stream 0x%llx cannot wait for the batch's copy: %s",
             p->ordinal, (unsigned long long)stream, sf_cuda_error_text(p->cu, r));
      rc = SF_EUNSUPPORTED;
    } else {
      s->has_stream = true;
      s->stream = stream == 0 ? 1 : stream;
    }
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

/* The last reference to a batch's device buffer went: back to the free list, after the consumer's work. */
static void give_back(void *opaque, uint8_t *data) {
  (void)data;
  slot *s = opaque;
  sf_device_pool *p = s->pool;
  pthread_mutex_lock(&p->lock);
  claim(p, s);
  if (s->has_stream) {
    /* Kernels the consumer queued before dropping the tensor may still read it: the next copy into
       this buffer waits for them. Without the event, a failure: wait for the work now. */
    sf_cu_result r = p->cu->ctx_push_current(p->ctx); /* any thread: its context is left as it was */
    if (r == SF_CU_SUCCESS) {
      r = p->cu->event_record(s->released, (sf_cu_stream)(uintptr_t)s->stream);
      sf_cu_context popped;
      p->cu->ctx_pop_current(&popped);
    }
    if (r == SF_CU_SUCCESS)
      s->release_pending = true;
    else
      sf_log(SF_LOG_ERROR, NULL, "cuda:%d: cannot order a released batch after its consumer's stream: %s", p->ordinal,
             sf_cuda_error_text(p->cu, r));
    s->has_stream = false;
  }
  s->next = p->free_list;
  p->free_list = s;
  p->n_idle++;
  pthread_mutex_unlock(&p->lock);
  pool_unref(p);
}

int sf_device_pool_new(sf_device_pool **out, const sf_cuda_api *cu, int ordinal, sf_error *error) {
  *out = NULL;
  int count = 0;
  sf_cu_result r = cu->device_get_count(&count);
  if (r != SF_CU_SUCCESS)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "cuda: cannot count the GPUs: %s",
                        sf_cuda_error_text(cu, r));
  if (ordinal < 0 || ordinal >= count)
    return sf_error_set(error, SF_EOPTION, SF_NOWHERE,
                        "cuda:%d: there is no such GPU: this machine shows %d (cuda:0 to cuda:%d; "
                        "CUDA_VISIBLE_DEVICES may hide some)",
                        ordinal, count, count - 1);
  sf_device_pool *p = calloc(1, sizeof *p);
  if (!p) return SF_ENOMEM;
  atomic_init(&p->refs, 1);
  pthread_mutex_init(&p->lock, NULL);
  p->cu = cu;
  p->ordinal = ordinal;
  p->where = (sf_buffer_device){.type = kDLCUDA, .id = ordinal, .exported = exported, .wait = wait_on};
  const char *what = "cuDeviceGet";
  r = cu->device_get(&p->device, ordinal);
  if (r == SF_CU_SUCCESS) what = "cuDevicePrimaryCtxRetain", r = cu->primary_ctx_retain(&p->ctx, p->device);
  if (r == SF_CU_SUCCESS) what = "cuCtxSetCurrent", r = cu->ctx_set_current(p->ctx);
  if (r == SF_CU_SUCCESS) what = "cuStreamCreate", r = cu->stream_create(&p->stream, SF_CU_STREAM_NON_BLOCKING);
  if (r != SF_CU_SUCCESS) {
    int e = cu_fail(p, error, SF_EUNSUPPORTED, r, what);
    pool_free(p);
    return e;
  }
  *out = p;
  return 0;
}

int sf_device_pool_open(sf_device_pool **pool, int ordinal, sf_error *error) {
  *pool = NULL;
  const sf_cuda_api *cu;
  sf_error e = {0};
  /* No driver, or one that does not start: this machine has no such device, as no GPU `ordinal` says. */
  if (sf_cuda_load(&cu, &e) < 0) return sf_error_set(error, SF_EOPTION, SF_NOWHERE, "%s", e.message);
  return sf_device_pool_new(pool, cu, ordinal, error);
}

void sf_device_pool_destroy(sf_device_pool **pp) {
  if (!pp || !*pp) return;
  sf_device_pool *p = *pp;
  *pp = NULL;
  sf_device_pool_set_wake(p, NULL, NULL);
  pool_unref(p);
}

void sf_device_pool_set_wake(sf_device_pool *p, void (*wake)(void *), void *arg) {
  pthread_mutex_lock(&p->lock);
  p->wake = wake;
  p->wake_arg = arg;
  pthread_mutex_unlock(&p->lock);
}

int sf_device_pool_ahead(sf_device_pool *p) {
  pthread_mutex_lock(&p->lock);
  int n = p->ahead;
  pthread_mutex_unlock(&p->lock);
  return n;
}

void sf_device_pool_stats_get(sf_device_pool *p, sf_device_pool_stats *st) {
  memset(st, 0, sizeof *st);
  pthread_mutex_lock(&p->lock);
  st->device_buffers = p->n_slots;
  st->device_bytes = p->device_bytes;
  st->idle_buffers = p->n_idle;
  st->device_allocs = p->device_allocs;
  pthread_mutex_unlock(&p->lock);
  st->pinned_buffers = (size_t)p->n_stage;
  for (int i = 0; i < p->n_stage; i++)
    st->pinned_bytes += p->stage[i].size;
  st->batches = p->batches;
  st->pinned_allocs = p->pinned_allocs;
}

static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* A pinned buffer of at least size bytes whose last copy is done. */
static int get_staging(sf_device_pool *p, size_t size, staging **out, sf_error *error) {
  const sf_cuda_api *cu = p->cu;
  for (int i = 0; i < p->n_stage; i++) {
    staging *s = &p->stage[i];
    if (s->size >= size && cu->event_query(s->done) == SF_CU_SUCCESS) {
      *out = s;
      return 0;
    }
  }
  staging *s;
  sf_cu_result r;
  bool fresh = p->n_stage < MAX_STAGING;
  if (fresh) {
    s = &p->stage[p->n_stage];
    *s = (staging){0};
  } else { /* every one is busy or small: wait for the oldest copy */
    s = &p->stage[p->next_stage];
    p->next_stage = (p->next_stage + 1) % MAX_STAGING;
    r = cu->event_synchronize(s->done);
    if (r != SF_CU_SUCCESS) return cu_fail(p, error, SF_EUNSUPPORTED, r, "cuEventSynchronize (a batch's copy)");
    if (s->size >= size) {
      *out = s;
      return 0;
    }
  }
  /* Room to grow a little, so that batches of slightly varying size (ragged fields) reuse it. */
  size_t want = size + size / 8;
  void *host = NULL;
  r = cu->mem_host_alloc(&host, want, 0);
  if (r != SF_CU_SUCCESS)
    return sf_error_set(error, r == SF_CU_ERROR_OUT_OF_MEMORY ? SF_ENOMEM : SF_EUNSUPPORTED, SF_NOWHERE,
                        "cuda:%d: cannot pin %zu bytes of host memory for a batch (cuMemHostAlloc: %s); "
                        "lower batch_size, or free host memory",
                        p->ordinal, want, sf_cuda_error_text(cu, r));
  if (fresh) {
    r = cu->event_create(&s->done, SF_CU_EVENT_DISABLE_TIMING);
    if (r != SF_CU_SUCCESS) {
      cu->mem_free_host(host);
      return cu_fail(p, error, SF_EUNSUPPORTED, r, "cuEventCreate");
    }
    p->n_stage++;
  } else {
    cu->mem_free_host(s->host); /* too small: its copy is done (synchronised above) */
  }
  s->host = host;
  s->size = want;
  p->pinned_allocs++;
  *out = s;
  return 0;
}

/* Frees a list of idle slots (linked by next, off the free list), each after its consumer's work is done. */
static void free_slots(sf_device_pool *p, slot *list) {
  for (slot *s = list, *next; s; s = next) {
    next = s->next;
    if (s->release_pending) p->cu->event_synchronize(s->released);
    pthread_mutex_lock(&p->lock);
    slot_free(p, s);
    pthread_mutex_unlock(&p->lock);
  }
}

/* A device buffer of at least size bytes (at most twice: not a big one for a short last batch), new or idle. */
static int get_slot(sf_device_pool *p, size_t size, slot **out, sf_error *error) {
  const sf_cuda_api *cu = p->cu;
  slot *got = NULL, *trim = NULL;
  pthread_mutex_lock(&p->lock);
  for (slot **link = &p->free_list; *link; link = &(*link)->next)
    if ((*link)->size >= size && (*link)->size / 2 <= size) {
      got = *link;
      *link = got->next;
      p->n_idle--;
      break;
    }
  /* Idle buffers beyond MAX_IDLE (batches shrank, or the trainer let go of many) are freed here, on the
     sink's thread, where waiting for their consumers costs no trainer time. */
  while (!got && p->n_idle > MAX_IDLE) {
    slot *s = p->free_list;
    p->free_list = s->next;
    p->n_idle--;
    s->next = trim;
    trim = s;
  }
  pthread_mutex_unlock(&p->lock);
  free_slots(p, trim);
  if (got) {
    *out = got;
    return 0;
  }
  got = calloc(1, sizeof *got);
  if (!got) return SF_ENOMEM;
  got->pool = p;
  sf_cu_result r = cu->mem_alloc(&got->ptr, size);
  if (r == SF_CU_ERROR_OUT_OF_MEMORY) { /* idle buffers of other sizes may be what is missing */
    pthread_mutex_lock(&p->lock);
    slot *idle = p->free_list;
    p->free_list = NULL;
    p->n_idle = 0;
    pthread_mutex_unlock(&p->lock);
    free_slots(p, idle);
    if (idle) r = cu->mem_alloc(&got->ptr, size);
  }
  if (r != SF_CU_SUCCESS) {
    free(got);
    size_t held;
    pthread_mutex_lock(&p->lock);
    held = p->device_bytes;
    pthread_mutex_unlock(&p->lock);
    return sf_error_set(error, r == SF_CU_ERROR_OUT_OF_MEMORY ? SF_ENOMEM : SF_EUNSUPPORTED, SF_NOWHERE,
                        "cuda:%d: cannot allocate %zu bytes of device memory for a batch (cuMemAlloc: %s; the "
                        "sink holds %zu bytes in batches the trainer has not dropped); lower batch_size or "
                        "prefetch, or drop batches sooner",
                        p->ordinal, size, sf_cuda_error_text(cu, r), held);
  }
  r = cu->event_create(&got->ready, SF_CU_EVENT_DISABLE_TIMING);
  if (r == SF_CU_SUCCESS) {
    r = cu->event_create(&got->released, SF_CU_EVENT_DISABLE_TIMING);
    if (r != SF_CU_SUCCESS) cu->event_destroy(got->ready);
  }
  if (r != SF_CU_SUCCESS) {
    cu->mem_free(got->ptr);
    free(got);
    return cu_fail(p, error, SF_EUNSUPPORTED, r, "cuEventCreate");
  }
  got->size = size;
  pthread_mutex_lock(&p->lock);
  p->n_slots++;
  p->device_bytes += size;
  p->device_allocs++;
  pthread_mutex_unlock(&p->lock);
  *out = got;
  return 0;
}

/* The slot back to the free list without a consumer (a failure after get_slot). */
static void put_slot(sf_device_pool *p, slot *s) {
  pthread_mutex_lock(&p->lock);
  s->next = p->free_list;
  p->free_list = s;
  p->n_idle++;
  pthread_mutex_unlock(&p->lock);
}

/* What normalising the field takes, checked: its dims and the kernel's strides (bytes of the packed copy). */
typedef struct norm_plan {
  int64_t b, c, h, w;
  long long sb, sc, sy, sx;
  size_t in_bytes, lut_bytes, out_bytes;
  size_t in_at, lut_at, out_at; /* offsets in the batch's buffer */
} norm_plan;

static int plan_normalize(sf_device_pool *p, const sf_batch *batch, const sf_device_normalize *nm, norm_plan *np,
                          sf_error *error) {
  const sf_field *f = &batch->fields[nm->field];
  const sf_tensor *t = &f->tensor;
  if (t->dtype != SF_DTYPE_UINT8 || t->ndim != 4)
    return sf_error_set(error, SF_ESHAPE, SF_NOWHERE,
                        "cuda:%d: normalize needs a uint8 [B,H,W,C] or [B,C,H,W] field, and '%s' is %s with %d "
                        "dimensions; give augment dtype: uint8, or set image_field",
                        p->ordinal, f->name, sf_dtype_name(t->dtype), t->ndim);
  np->b = t->shape[0];
  np->c = nm->hwc ? t->shape[3] : t->shape[1];
  np->h = nm->hwc ? t->shape[1] : t->shape[2];
  np->w = nm->hwc ? t->shape[2] : t->shape[3];
  if (np->c < 1 || np->c > 4 || np->h * np->w > UINT32_MAX || np->b * np->c > UINT32_MAX)
    return sf_error_set(error, SF_ESHAPE, SF_NOWHERE,
                        "cuda:%d: field '%s' [%lld,%lld,%lld,%lld] cannot be normalised on the device: it needs 1 "
                        "to 4 channels and fewer than 2^32 pixels per image",
                        p->ordinal, f->name, (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                        (long long)t->shape[3]);
  long long c = np->c, h = np->h, w = np->w;
  np->sb = c * h * w;
  if (nm->hwc)
    np->sy = w * c, np->sx = c, np->sc = 1;
  else
    np->sc = h * w, np->sy = w, np->sx = 1;
  size_t esize = sf_dtype_size(nm->dtype);
  np->in_bytes = sf_tensor_nbytes(t);
  np->lut_bytes = (size_t)np->c * 256 * esize;
  np->out_bytes = (size_t)(np->b * np->c * np->h * np->w) * esize;
  return 0;
}

/* Loads the kernel's module on first use (the driver compiles the PTX for its GPU: a few ms, once). */
static int load_kernel(sf_device_pool *p, sf_error *error) {
  if (p->normalize) return 0;
  sf_cu_result r = p->cu->module_load_data(&p->module, device_kernels_ptx);
  if (r != SF_CU_SUCCESS) {
    p->module = NULL;
    return cu_fail(p, error, SF_EUNSUPPORTED, r,
                   "the normalise kernel does not load (cuModuleLoadData; a driver older than CUDA 11?)");
  }
  r = p->cu->module_get_function(&p->normalize, p->module, "sf_normalize_u8");
  if (r != SF_CU_SUCCESS) {
    p->normalize = NULL;
    return cu_fail(p, error, SF_EINTERNAL, r, "cuModuleGetFunction sf_normalize_u8");
  }
  return 0;
}

static int launch(sf_device_pool *p, const norm_plan *np, sf_cu_deviceptr base, sf_dtype dtype, sf_error *error) {
  sf_cu_deviceptr src = base + np->in_at, dst = base + np->out_at, lut = base + np->lut_at;
  long long sb = np->sb, sc = np->sc, sy = np->sy, sx = np->sx;
  unsigned channels = (unsigned)np->c, height = (unsigned)np->h, width = (unsigned)np->w;
  unsigned planes = (unsigned)(np->b * np->c), out_size = (unsigned)sf_dtype_size(dtype);
  void *params[] = {&src, &sb, &sc, &sy, &sx, &dst, &lut, &channels, &height, &width, &planes, &out_size};
  uint64_t pixels = (uint64_t)height * width;
  unsigned block = 256, grid_x = (unsigned)((pixels + block - 1) / block), grid_y = planes;
  if (grid_x > 4096) grid_x = 4096; /* the kernel strides over the rest */
  if (grid_x == 0) grid_x = 1;
  if (grid_y > 65535) grid_y = 65535;
  if (grid_y == 0) return 0; /* an empty batch */
  sf_cu_result r = p->cu->launch_kernel(p->normalize, grid_x, grid_y, 1, block, 1, 1, 0, p->stream, params, NULL);
  return r == SF_CU_SUCCESS ? 0 : cu_fail(p, error, SF_EUNSUPPORTED, r, "cuLaunchKernel sf_normalize_u8");
}

/*
 * Where each field goes in the packed copy: fields in order, each at a multiple of ALIGN (at[i]), the
 * normalised field's uint8 values and tables after them (np's in_at, lut_at), its output after what is
 * copied (out_at). Returns the bytes copied to the device.
 */
static size_t pack_layout(const sf_batch *batch, const sf_device_normalize *nm, norm_plan *np, size_t *at) {
  size_t copied = 0;
  for (int i = 0; i < batch->n_fields; i++) {
    if (nm && i == nm->field) continue;
    at[i] = copied;
    copied = align_up(copied + sf_tensor_nbytes(&batch->fields[i].tensor));
  }
  if (nm) {
    np->in_at = copied;
    np->lut_at = align_up(np->in_at + np->in_bytes);
    copied = align_up(np->lut_at + np->lut_bytes);
    np->out_at = copied;
  }
  return copied;
}

/* Each field of batch becomes a view of the device buffer at its place (the normalised one: its output), holding a reference. */
static void fields_to_views(sf_batch *batch, const sf_device_normalize *nm, const norm_plan *np, const size_t *at,
                            sf_buffer *buffer) {
  for (int i = 0; i < batch->n_fields; i++) {
    sf_tensor *t = &batch->fields[i].tensor;
    sf_tensor moved;
    if (nm && i == nm->field) {
      int64_t shape[4] = {np->b, np->c, np->h, np->w};
      sf_tensor_set_shape(&moved, nm->dtype, 4, shape); /* checked by plan_normalize */
      moved.offset = np->out_at;
    } else {
      sf_tensor_set_shape(&moved, t->dtype, t->ndim, t->shape); /* a shape the batch already had */
      moved.offset = at[i];
    }
    moved.buffer = sf_buffer_ref(buffer);
    sf_tensor_clear(t);
    *t = moved;
  }
}

int sf_device_pool_move(sf_device_pool *p, sf_batch *batch, const sf_device_normalize *nm, sf_error *error) {
  const sf_cuda_api *cu = p->cu;
  if (nm && nm->field < 0) nm = NULL;
  if (nm && (nm->field >= batch->n_fields || !nm->tables ||
             (nm->dtype != SF_DTYPE_FLOAT32 && nm->dtype != SF_DTYPE_BFLOAT16)))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "cuda:%d: bad normalise request", p->ordinal);
  sf_cu_result r = cu->ctx_set_current(p->ctx); /* the step may run on any of the engine's threads */
  if (r != SF_CU_SUCCESS) return cu_fail(p, error, SF_EUNSUPPORTED, r, "cuCtxSetCurrent");
  norm_plan np = {0};
  if (nm) {
    int e = plan_normalize(p, batch, nm, &np, error);
    if (e < 0) return e;
    e = load_kernel(p, error);
    if (e < 0) return e;
  }
  size_t at[SF_MAX_FIELDS] = {0}, copied = pack_layout(batch, nm, &np, at);
  size_t total = copied + (nm ? align_up(np.out_bytes) : 0);
  if (total == 0) total = ALIGN;
  staging *st = NULL;
  int e = get_staging(p, copied ? copied : 1, &st, error);
  if (e < 0) return e;
  slot *s = NULL;
  e = get_slot(p, total, &s, error);
  if (e < 0) return e;
  uint8_t *host = st->host;
  for (int i = 0; i < batch->n_fields; i++) {
    const sf_tensor *t = &batch->fields[i].tensor;
    if (!t->buffer) continue;
    sf_tensor_copy_to(t, host + (nm && i == nm->field ? np.in_at : at[i]));
  }
  if (nm) memcpy(host + np.lut_at, nm->tables, np.lut_bytes);
  /* Reusing a buffer a consumer dropped: its work queued before the drop goes first. */
  r = SF_CU_SUCCESS;
  if (s->release_pending) r = cu->stream_wait_event(p->stream, s->released, 0);
  if (r == SF_CU_SUCCESS && copied) r = cu->memcpy_htod_async(s->ptr, host, copied, p->stream);
  if (r == SF_CU_SUCCESS) r = cu->event_record(st->done, p->stream); /* the staging buffer is free after this */
  if (r != SF_CU_SUCCESS) {
    put_slot(p, s);
    return cu_fail(p, error, SF_EUNSUPPORTED, r, "cuMemcpyHtoDAsync (a batch to the device)");
  }
  s->release_pending = false;
  if (nm && (e = launch(p, &np, s->ptr, nm->dtype, error)) < 0) {
    put_slot(p, s);
    return e;
  }
  r = cu->event_record(s->ready, p->stream);
  if (r != SF_CU_SUCCESS) {
    put_slot(p, s);
    return cu_fail(p, error, SF_EUNSUPPORTED, r, "cuEventRecord");
  }
  /* The device buffer as one sf_buffer; each field a view of it, holding a reference. */
  atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
  sf_buffer *buffer = sf_buffer_wrap_device((uint8_t *)(uintptr_t)s->ptr, total, give_back, s, &p->where);
  if (!buffer) {
    atomic_fetch_sub_explicit(&p->refs, 1, memory_order_relaxed); /* the owner still holds one */
    put_slot(p, s);
    return SF_ENOMEM;
  }
  s->claimed = false;
  s->has_stream = false;
  pthread_mutex_lock(&p->lock);
  p->ahead++;
  pthread_mutex_unlock(&p->lock);
  fields_to_views(batch, nm, &np, at, buffer);
  sf_buffer_unref(&buffer); /* the fields hold it now (an empty batch: back to the pool at once) */
  p->batches++;
  return 0;
}
