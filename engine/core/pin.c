/* cudaHostRegister through a run-time dlopen of the CUDA runtime: pinned batches without a CUDA build dependency. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "pin.h"

typedef int (*host_register_fn)(void *ptr, size_t size, unsigned flags);
typedef int (*host_unregister_fn)(void *ptr);
typedef const char *(*error_string_fn)(int error);

static struct {
  pthread_once_t once;
  void *library;
  host_register_fn host_register;
  host_unregister_fn host_unregister;
  error_string_fn error_string;
} cuda = {.once = PTHREAD_ONCE_INIT};

static void load(void) {
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !cuda.library; i++)
    cuda.library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!cuda.library) return;
  cuda.host_register = (host_register_fn)dlsym(cuda.library, "cudaHostRegister");
  cuda.host_unregister = (host_unregister_fn)dlsym(cuda.library, "cudaHostUnregister");
  cuda.error_string = (error_string_fn)dlsym(cuda.library, "cudaGetErrorString");
}

int sf_pin_open(sf_error *error) {
  pthread_once(&cuda.once, load);
  if (!cuda.library || !cuda.host_register || !cuda.host_unregister)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "pin_memory needs the CUDA runtime (libcudart.so), which is not installed; "
                        "set pin_memory: false on hosts without a GPU");
  void *probe = aligned_alloc(4096, 4096);
  if (!probe) return SF_ENOMEM;
  int rc = cuda.host_register(probe, 4096, 0);
  if (rc == 0) cuda.host_unregister(probe);
  free(probe);
  if (rc != 0)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "pin_memory: cudaHostRegister failed (%s); set pin_memory: false on hosts without "
                        "a usable GPU",
                        cuda.error_string ? cuda.error_string(rc) : "unknown CUDA error");
  return 0;
}

int sf_pin(void *ptr, size_t size) {
  return cuda.host_register && cuda.host_register(ptr, size, 0) != 0 ? SF_EUNSUPPORTED : 0;
}

void sf_unpin(void *ptr) {
  if (cuda.host_unregister) cuda.host_unregister(ptr);
}
