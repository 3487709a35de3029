/* Optional shared libraries opened on first use (dynlib.h). */
#include "dynlib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "shardflow/error.h"

static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;

/* Opens and resolves lib; sets lib->why on failure. Called once, under `loading`. */
static int open_library(sf_dynlib *lib) {
  void *handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    snprintf(lib->why, sizeof lib->why, "cannot load %s to %s (%s): install the library (on Debian: apt-get "
             "install the package that holds %s)", lib->soname, lib->purpose, dlerror(), lib->soname);
    return SF_EUNSUPPORTED;
  }
  void **fns = lib->fns;
  for (size_t i = 0; lib->symbols[i]; i++) {
    void *f = dlsym(handle, lib->symbols[i]);
    if (!f) {
      snprintf(lib->why, sizeof lib->why, "%s has no %s (%s): it is not the version shardflow was built "
               "against", lib->soname, lib->symbols[i], dlerror());
      dlclose(handle);
      return SF_EUNSUPPORTED;
    }
    /* POSIX guarantees a dlsym result converts to a function pointer; the table holds only those. */
    memcpy(&fns[i], &f, sizeof f);
  }
  lib->handle = handle;
  return 0;
}

int sf_dynlib_load(sf_dynlib *lib) {
  int s = atomic_load_explicit(&lib->state, memory_order_acquire);
  if (s) return s > 0 ? 0 : SF_EUNSUPPORTED;
  pthread_mutex_lock(&loading);
  if (!(s = atomic_load_explicit(&lib->state, memory_order_relaxed))) {
    s = open_library(lib) == 0 ? 1 : -1;
    atomic_store_explicit(&lib->state, s, memory_order_release);
  }
  pthread_mutex_unlock(&loading);
  return s > 0 ? 0 : SF_EUNSUPPORTED;
}
