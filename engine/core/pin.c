/* cudaHostRegister through the CUDA runtime loaded at run time (dynlib.h): pinned batches, no CUDA build dependency. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "dynlib.h"
#include "pin.h"

static struct {
  int (*host_register)(void *ptr, size_t size, unsigned flags); /* cudaHostRegister */
  int (*host_unregister)(void *ptr);                            /* cudaHostUnregister */
  const char *(*error_string)(int error);                       /* cudaGetErrorString */
} cuda;
static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so", NULL};
static const char *const symbols[] = {"cudaHostRegister", "cudaHostUnregister", "cudaGetErrorString", NULL};
_Static_assert(sizeof cuda == 3 * sizeof(void (*)(void)), "one function pointer per symbol, in order");
static sf_dynlib runtime = {.sonames = sonames, .symbols = symbols, .fns = &cuda, .purpose = "pin batch memory"};

int sf_pin_open(sf_error *error) {
  if (sf_dynlib_load(&runtime) < 0)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "pin_memory needs the CUDA runtime: %s; set pin_memory: false on hosts without a GPU",
                        runtime.why);
  void *probe = aligned_alloc(4096, 4096);
  if (!probe) return SF_ENOMEM;
  int rc = cuda.host_register(probe, 4096, 0);
  if (rc == 0) cuda.host_unregister(probe);
  free(probe);
  if (rc != 0)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "pin_memory: cudaHostRegister failed (%s); set pin_memory: false on hosts without "
                        "a usable GPU",
                        cuda.error_string(rc));
  return 0;
}

/* The table is filled once the runtime has loaded (sf_dynlib_load's state says so, with release order). */
static bool loaded(void) { return atomic_load_explicit(&runtime.state, memory_order_acquire) > 0; }

int sf_pin(void *ptr, size_t size) {
  return loaded() && cuda.host_register(ptr, size, 0) != 0 ? SF_EUNSUPPORTED : 0;
}

void sf_unpin(void *ptr) {
  if (loaded()) cuda.host_unregister(ptr);
}
