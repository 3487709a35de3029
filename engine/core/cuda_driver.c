/* The CUDA driver API through a run-time dlopen of libcuda.so.1: GPU batches without a CUDA build dependency. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"

static struct {
  pthread_once_t once;
  sf_cuda_api api;
  int code;      /* 0, or the SF_E* code of the failure */
  char why[480]; /* what failed, for every caller after the first */
} driver = {.once = PTHREAD_ONCE_INIT};

/* Each table entry and its symbol: the _v2 names are those cuda.h's macros have chosen since CUDA 3.2. */
/* clang-format off */
#define SYMBOLS(X) \
  X(init, "cuInit") \
  X(device_get_count, "cuDeviceGetCount") \
  X(device_get, "cuDeviceGet") \
  X(primary_ctx_retain, "cuDevicePrimaryCtxRetain") \
  X(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2") \
  X(ctx_set_current, "cuCtxSetCurrent") \
  X(ctx_push_current, "cuCtxPushCurrent_v2") \
  X(ctx_pop_current, "cuCtxPopCurrent_v2") \
  X(mem_host_alloc, "cuMemHostAlloc") \
  X(mem_free_host, "cuMemFreeHost") \
  X(mem_alloc, "cuMemAlloc_v2") \
  X(mem_free, "cuMemFree_v2") \
  X(stream_create, "cuStreamCreate") \
  X(stream_destroy, "cuStreamDestroy_v2") \
  X(memcpy_htod_async, "cuMemcpyHtoDAsync_v2") \
  X(event_create, "cuEventCreate") \
  X(event_destroy, "cuEventDestroy_v2") \
  X(event_record, "cuEventRecord") \
  X(event_query, "cuEventQuery") \
  X(event_synchronize, "cuEventSynchronize") \
  X(stream_wait_event, "cuStreamWaitEvent") \
  X(get_error_string, "cuGetErrorString") \
  X(module_load_data, "cuModuleLoadData") \
  X(module_unload, "cuModuleUnload") \
  X(module_get_function, "cuModuleGetFunction") \
  X(launch_kernel, "cuLaunchKernel")
/* clang-format on */

static void load(void) {
  const char *name = getenv("SF_CUDA_LIBRARY");
  if (!name || !name[0]) name = "libcuda.so.1";
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    driver.code = SF_EUNSUPPORTED;
    snprintf(driver.why, sizeof driver.why, "no CUDA driver on this machine: %s", e ? e : name);
    return;
  }
  /* dlsym returns void *; converting it to a function pointer is what POSIX requires to work. */
#define RESOLVE(field, symbol)                                                                                         \
  if (!driver.code) {                                                                                                  \
    void *f = dlsym(lib, symbol);                                                                                      \
    if (!f) {                                                                                                          \
      driver.code = SF_EUNSUPPORTED;                                                                                   \
      snprintf(driver.why, sizeof driver.why,                                                                          \
               "%s has no %s: not the CUDA driver, or one older than CUDA 11; update the "                             \
               "NVIDIA driver",                                                                                        \
               name, symbol);                                                                                          \
    } else {                                                                                                           \
      memcpy(&driver.api.field, &f, sizeof f);                                                                         \
    }                                                                                                                  \
  }
  SYMBOLS(RESOLVE)
#undef RESOLVE
  if (driver.code) return; /* the library stays loaded: unloading a driver is not worth its risks */
  sf_cu_result r = driver.api.init(0);
  if (r != SF_CU_SUCCESS) {
    driver.code = SF_EUNSUPPORTED;
    snprintf(driver.why, sizeof driver.why,
             "the CUDA driver (%s) does not start: cuInit: %s (no GPU, or the "
             "driver and kernel module differ: see nvidia-smi)",
             name, sf_cuda_error_text(&driver.api, r));
  }
}

int sf_cuda_load(const sf_cuda_api **api, sf_error *error) {
  *api = NULL;
  pthread_once(&driver.once, load);
  if (driver.code) return sf_error_set(error, driver.code, SF_NOWHERE, "%s", driver.why);
  *api = &driver.api;
  return 0;
}

const char *sf_cuda_error_text(const sf_cuda_api *api, sf_cu_result result) {
  const char *text = NULL;
  if (api && api->get_error_string && api->get_error_string(result, &text) == SF_CU_SUCCESS && text) return text;
  static _Thread_local char unknown[32];
  snprintf(unknown, sizeof unknown, "CUDA error %d", result);
  return unknown;
}
