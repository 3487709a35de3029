/* The CUDA driver API loaded at run time (libcuda.so.1, through dynlib.h): no CUDA build dependency. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_driver.h"
#include "dynlib.h"

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

/* The symbols in the table's order (dynlib fills the table by position: checked below, entry by entry). */
#define NAME(field, symbol) symbol,
static const char *const symbols[] = {SYMBOLS(NAME) NULL};
#undef NAME
#define INDEX(field, symbol) AT_##field,
enum { SYMBOLS(INDEX) N_SYMBOLS };
#undef INDEX
#define SAME_PLACE(field, symbol)                                                                                      \
  _Static_assert(offsetof(sf_cuda_api, field) == AT_##field * sizeof(void (*)(void)), "sf_cuda_api." #field);
SYMBOLS(SAME_PLACE)
#undef SAME_PLACE
_Static_assert(sizeof(sf_cuda_api) == N_SYMBOLS * sizeof(void (*)(void)), "sf_cuda_api holds the symbols only");

static sf_cuda_api api_table;
static sf_dynlib driver_lib = {
    .soname = "libcuda.so.1", .symbols = symbols, .fns = &api_table, .purpose = "hand batches out on a GPU"};
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[480]; /* the failure, for every caller */

static void load(void) {
  const char *name = getenv("SF_CUDA_LIBRARY"); /* a driver somewhere else, or a test's fake */
  if (name && name[0]) driver_lib.soname = name;
  if (sf_dynlib_load(&driver_lib) < 0) {
    snprintf(why, sizeof why, "no CUDA driver on this machine: %s", driver_lib.why);
    return;
  }
  sf_cu_result r = api_table.init(0);
  if (r != SF_CU_SUCCESS)
    snprintf(why, sizeof why,
             "the CUDA driver (%s) does not start: cuInit: %s (no GPU, or the driver and kernel module differ: "
             "see nvidia-smi)",
             driver_lib.soname, sf_cuda_error_text(&api_table, r));
}

int sf_cuda_load(const sf_cuda_api **api, sf_error *error) {
  *api = NULL;
  pthread_once(&once, load);
  if (why[0]) return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "%s", why);
  *api = &api_table;
  return 0;
}

const char *sf_cuda_error_text(const sf_cuda_api *api, sf_cu_result result) {
  const char *text = NULL;
  if (api && api->get_error_string && api->get_error_string(result, &text) == SF_CU_SUCCESS && text) return text;
  static _Thread_local char unknown[32];
  snprintf(unknown, sizeof unknown, "CUDA error %d", result);
  return unknown;
}
