/* The CUDA driver API, loaded at run time: the few functions the device sink calls, as a table of pointers. */
#ifndef SF_ENGINE_CUDA_DRIVER_H
#define SF_ENGINE_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"

/*
 * The driver API's types as cuda.h declares them (handles are pointers to opaque structs; CUdeviceptr
 * is a 64-bit integer on every 64-bit platform): declared here so that nothing of CUDA is needed to
 * build. A result is a CUresult: 0 is CUDA_SUCCESS.
 */
typedef int sf_cu_result;
typedef int sf_cu_device;
typedef struct sf_cu_context_ *sf_cu_context;
typedef struct sf_cu_stream_ *sf_cu_stream;
typedef struct sf_cu_event_ *sf_cu_event;
typedef struct sf_cu_module_ *sf_cu_module;
typedef struct sf_cu_function_ *sf_cu_function;
typedef unsigned long long sf_cu_deviceptr;

enum {
  SF_CU_SUCCESS = 0,
  SF_CU_ERROR_OUT_OF_MEMORY = 2,
  SF_CU_ERROR_NOT_READY = 600,
  SF_CU_EVENT_DISABLE_TIMING = 0x2, /* CU_EVENT_DISABLE_TIMING: cheaper events, only for ordering */
  SF_CU_STREAM_NON_BLOCKING = 0x1,  /* CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream */
};

/* The legacy and per-thread default streams as stream handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define SF_CU_STREAM_LEGACY     ((sf_cu_stream)0x1)
#define SF_CU_STREAM_PER_THREAD ((sf_cu_stream)0x2)

/*
 * The functions used, by their documented signatures (CUDA Driver API reference); the comment after
 * each is the symbol it is loaded from (the _v2 names are what cuda.h's macros pick since CUDA 3.2).
 * Code calls through this table only, so a unit test can hand it a fake driver.
 */
typedef struct sf_cuda_api {
  sf_cu_result (*init)(unsigned flags);                                        /* cuInit */
  sf_cu_result (*device_get_count)(int *count);                                /* cuDeviceGetCount */
  sf_cu_result (*device_get)(sf_cu_device *device, int ordinal);               /* cuDeviceGet */
  sf_cu_result (*primary_ctx_retain)(sf_cu_context *ctx, sf_cu_device device); /* cuDevicePrimaryCtxRetain */
  sf_cu_result (*primary_ctx_release)(sf_cu_device device);                    /* cuDevicePrimaryCtxRelease_v2 */
  sf_cu_result (*ctx_set_current)(sf_cu_context ctx);                          /* cuCtxSetCurrent */
  sf_cu_result (*ctx_push_current)(sf_cu_context ctx);                         /* cuCtxPushCurrent_v2 */
  sf_cu_result (*ctx_pop_current)(sf_cu_context *ctx);                         /* cuCtxPopCurrent_v2 */
  sf_cu_result (*mem_host_alloc)(void **p, size_t size, unsigned flags);       /* cuMemHostAlloc */
  sf_cu_result (*mem_free_host)(void *p);                                      /* cuMemFreeHost */
  sf_cu_result (*mem_alloc)(sf_cu_deviceptr *dptr, size_t size);               /* cuMemAlloc_v2 */
  sf_cu_result (*mem_free)(sf_cu_deviceptr dptr);                              /* cuMemFree_v2 */
  sf_cu_result (*stream_create)(sf_cu_stream *stream, unsigned flags);         /* cuStreamCreate */
  sf_cu_result (*stream_destroy)(sf_cu_stream stream);                         /* cuStreamDestroy_v2 */
  sf_cu_result (*memcpy_htod_async)(sf_cu_deviceptr dst, const void *src, size_t size,
                                    sf_cu_stream stream);                                    /* cuMemcpyHtoDAsync_v2 */
  sf_cu_result (*event_create)(sf_cu_event *event, unsigned flags);                          /* cuEventCreate */
  sf_cu_result (*event_destroy)(sf_cu_event event);                                          /* cuEventDestroy_v2 */
  sf_cu_result (*event_record)(sf_cu_event event, sf_cu_stream stream);                      /* cuEventRecord */
  sf_cu_result (*event_query)(sf_cu_event event);                                            /* cuEventQuery */
  sf_cu_result (*event_synchronize)(sf_cu_event event);                                      /* cuEventSynchronize */
  sf_cu_result (*stream_wait_event)(sf_cu_stream stream, sf_cu_event event, unsigned flags); /* cuStreamWaitEvent */
  sf_cu_result (*get_error_string)(sf_cu_result error, const char **text);                   /* cuGetErrorString */
  sf_cu_result (*module_load_data)(sf_cu_module *module, const void *image);                 /* cuModuleLoadData */
  sf_cu_result (*module_unload)(sf_cu_module module);                                        /* cuModuleUnload */
  sf_cu_result (*module_get_function)(sf_cu_function *function, sf_cu_module module,
                                      const char *name); /* cuModuleGetFunction */
  sf_cu_result (*launch_kernel)(sf_cu_function f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                                unsigned block_y, unsigned block_z, unsigned shared_bytes, sf_cu_stream stream,
                                void **params, void **extra); /* cuLaunchKernel */
} sf_cuda_api;

/*
 * Loads the driver (libcuda.so.1, or the file the SF_CUDA_LIBRARY environment variable names) with
 * dlopen (dynlib.h), once per process, resolves every function of sf_cuda_api and calls cuInit(0).
 * Never a build-time dependency. Returns 0 with *api (static, valid for the process's life), or
 * SF_EUNSUPPORTED with *error saying "no CUDA driver on this machine: " and dlopen's words, a missing
 * function (a driver older than CUDA 11) or cuInit's error. Thread-safe.
 */
int sf_cuda_load(const sf_cuda_api **api, sf_error *error);

/* The driver's name for result (cuGetErrorString), or "CUDA error N"; never NULL. Borrows api. */
const char *sf_cuda_error_text(const sf_cuda_api *api, sf_cu_result result);

#endif
