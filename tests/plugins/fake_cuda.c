/*
 * A fake CUDA driver (libcuda's function names) for test_device_sink.py: device_sink's device: cuda runs
 * through the real stage, executor and Python binding on a machine without a GPU (SF_CUDA_LIBRARY names this
 * file). Device memory is malloc'd host memory (a test reads it through the DLPack data pointer), copies
 * happen at once, streams and events are names; fake_cuda_counts() tells the test what is held and what was
 * asked. Thread-safe: the engine's threads and the test's call it.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef struct event {
  uintptr_t stream; /* where it was last recorded, 0 never */
} event;

enum { OOM = 2 }; /* CUDA_ERROR_OUT_OF_MEMORY */
enum { C_DEVICE, C_HOST, C_EVENTS, C_STREAMS, C_CTX, C_COPIES, C_WAITS, C_RELEASES, C_DEPTH, C_N };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long counts[C_N];
static uintptr_t last_wait_stream, last_release_stream;
static long fail_allocs;

#define API __attribute__((visibility("default")))
#define COUNT(i, d)                                                                                                    \
  do {                                                                                                                 \
    pthread_mutex_lock(&lock);                                                                                         \
    counts[i] += (d);                                                                                                  \
    pthread_mutex_unlock(&lock);                                                                                       \
  } while (0)

/* What the test reads: live device and pinned buffers, events, streams, retained contexts, copies, consumer
 * waits, releases recorded on consumer streams, pushed contexts; and the last streams of those two. */
API void fake_cuda_counts(long out[9], uintptr_t streams[2]) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 9; i++) out[i] = counts[C_DEVICE + i];
  streams[0] = last_wait_stream;
  streams[1] = last_release_stream;
  pthread_mutex_unlock(&lock);
}

/* The next n cuMemAlloc calls fail with CUDA_ERROR_OUT_OF_MEMORY. */
API void fake_cuda_fail_allocs(long n) {
  pthread_mutex_lock(&lock);
  fail_allocs = n;
  pthread_mutex_unlock(&lock);
}

API CUresult cuInit(unsigned flags) { return flags ? 1 : 0; }
API CUresult cuDeviceGetCount(int *n) {
  *n = 1;
  return 0;
}
API CUresult cuDeviceGet(int *d, int ordinal) {
  *d = ordinal;
  return ordinal == 0 ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */
}
API CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) {
  (void)d;
  *ctx = (void *)(uintptr_t)0xc0;
  COUNT(C_CTX, 1);
  return 0;
}
API CUresult cuDevicePrimaryCtxRelease_v2(int d) {
  (void)d;
  COUNT(C_CTX, -1);
  return 0;
}
API CUresult cuCtxSetCurrent(void *ctx) { return ctx == (void *)(uintptr_t)0xc0 ? 0 : 201; }
API CUresult cuCtxPushCurrent_v2(void *ctx) {
  COUNT(C_DEPTH, 1);
  return ctx == (void *)(uintptr_t)0xc0 ? 0 : 201;
}
API CUresult cuCtxPopCurrent_v2(void **ctx) {
  COUNT(C_DEPTH, -1);
  *ctx = (void *)(uintptr_t)0xc0;
  return 0;
}
API CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags) {
  (void)flags;
  *p = malloc(size);
  COUNT(C_HOST, 1);
  return *p ? 0 : OOM;
}
API CUresult cuMemFreeHost(void *p) {
  free(p);
  COUNT(C_HOST, -1);
  return 0;
}
API CUresult cuMemAlloc_v2(unsigned long long *d, size_t size) {
  pthread_mutex_lock(&lock);
  bool fail = fail_allocs > 0;
  if (fail) fail_allocs--;
  pthread_mutex_unlock(&lock);
  if (fail) return OOM;
  void *p = malloc(size);
  if (!p) return OOM;
  *d = (unsigned long long)(uintptr_t)p;
  COUNT(C_DEVICE, 1);
  return 0;
}
API CUresult cuMemFree_v2(unsigned long long d) {
  free((void *)(uintptr_t)d);
  COUNT(C_DEVICE, -1);
  return 0;
}
API CUresult cuStreamCreate(void **s, unsigned flags) {
  (void)flags;
  *s = malloc(1);
  COUNT(C_STREAMS, 1);
  return 0;
}
API CUresult cuStreamDestroy_v2(void *s) {
  free(s);
  COUNT(C_STREAMS, -1);
  return 0;
}
API CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *s) {
  (void)s;
  memcpy((void *)(uintptr_t)dst, src, n);
  COUNT(C_COPIES, 1);
  return 0;
}
API CUresult cuEventCreate(void **e, unsigned flags) {
  (void)flags;
  *e = calloc(1, sizeof(event));
  COUNT(C_EVENTS, 1);
  return 0;
}
API CUresult cuEventDestroy_v2(void *e) {
  free(e);
  COUNT(C_EVENTS, -1);
  return 0;
}
/* A record on a stream that is not one of ours (the fake's streams are malloc'd; a test's consumer streams are
 * small numbers) is a release recorded on the consumer's stream. */
API CUresult cuEventRecord(void *e, void *s) {
  pthread_mutex_lock(&lock);
  ((event *)e)->stream = (uintptr_t)s;
  if ((uintptr_t)s < 0x100000) {
    counts[C_RELEASES]++;
    last_release_stream = (uintptr_t)s;
  }
  pthread_mutex_unlock(&lock);
  return 0;
}
API CUresult cuEventQuery(void *e) {
  (void)e;
  return 0;
}
API CUresult cuEventSynchronize(void *e) {
  (void)e;
  return 0;
}
API CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  CUresult r = ((event *)e)->stream ? 0 : 400; /* an event never recorded: CUDA_ERROR_INVALID_HANDLE */
  if ((uintptr_t)s < 0x100000) {
    counts[C_WAITS]++;
    last_wait_stream = (uintptr_t)s;
  }
  pthread_mutex_unlock(&lock);
  return r;
}
API CUresult cuGetErrorString(CUresult r, const char **text) {
  *text = r == OOM ? "out of memory (fake driver)" : "fake driver error";
  return 0;
}
API CUresult cuModuleLoadData(void **m, const void *image) {
  *m = strstr(image, ".entry sf_normalize_u8(") ? malloc(1) : NULL;
  return *m ? 0 : 218; /* CUDA_ERROR_INVALID_PTX */
}
API CUresult cuModuleUnload(void *m) {
  free(m);
  return 0;
}
API CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  (void)m;
  *f = (void *)(uintptr_t)0xf0;
  return strcmp(name, "sf_normalize_u8") == 0 ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}
/* engine/core/device_kernels.cu's kernel, run here on the host over the whole grid at once. */
API CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shared, void *s, void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)s, (void)extra;
  const uint8_t *src = (const uint8_t *)(uintptr_t)*(unsigned long long *)params[0];
  long long sb = *(long long *)params[1], sc = *(long long *)params[2], sy = *(long long *)params[3],
            sx = *(long long *)params[4];
  uint8_t *dst = (uint8_t *)(uintptr_t)*(unsigned long long *)params[5];
  const uint8_t *lut = (const uint8_t *)(uintptr_t)*(unsigned long long *)params[6];
  unsigned channels = *(unsigned *)params[7], height = *(unsigned *)params[8], width = *(unsigned *)params[9],
           planes = *(unsigned *)params[10], size = *(unsigned *)params[11];
  for (unsigned plane = 0; plane < planes; plane++)
    for (unsigned p = 0; p < height * width; p++) {
      unsigned b = plane / channels, c = plane % channels, y = p / width, x = p % width;
      unsigned v = src[b * sb + c * sc + y * sy + x * sx];
      memcpy(dst + ((size_t)plane * height * width + p) * size, lut + ((size_t)c * 256 + v) * size, size);
    }
  return 0;
}
