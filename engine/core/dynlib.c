/* Optional shared libraries opened on first use (dynlib.h). */
#include "dynlib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "shardflow/error.h"

static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;

/* dlopens the first of lib's sonames that opens, and sets lib->soname to it; NULL (lib->why says why) if none does. */
static void *open_first(sf_dynlib *lib) {
  const char *const one[] = {lib->soname, NULL};
  const char *const *names = lib->sonames ? lib->sonames : one;
  char tried[160] = "";
  size_t at = 0;
  for (size_t i = 0; names[i]; i++) {
    void *handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      lib->soname = names[i];
      return handle;
    }
    const char *sep = i == 0 ? "" : names[i + 1] ? ", " : " or ";
    int n = snprintf(tried + at, sizeof tried - at, "%s%s", sep, names[i]);
    at = n < 0 || (size_t)n >= sizeof tried - at ? sizeof tried - 1 : at + (size_t)n;
  }
  /* dlerror says why the last one failed: for versions of one library, the others failed the same way. */
  const char *err = dlerror();
  snprintf(lib->why, sizeof lib->why, "cannot load %s to %s (%s): install the library (on Debian: apt-get "
           "install the package that holds %s)", tried, lib->purpose, err ? err : "no name given",
           names[0] ? names[0] : "it");
  return NULL;
}

/* Opens and resolves lib; sets lib->why on failure. Called once, under `loading`. */
static int open_library(sf_dynlib *lib) {
  void *handle = open_first(lib);
  if (!handle) return SF_EUNSUPPORTED;
  void **fns = lib->fns;
  for (size_t i = 0; lib->symbols[i]; i++) {
    void *f = dlsym(handle, lib->symbols[i]);
    if (!f) {
      snprintf(lib->why, sizeof lib->why, "%s has no %s (%s): it is not the version shardflow was built "
               "against", lib->soname, lib->symbols[i], dlerror());
      memset(fns, 0, i * sizeof f); /* nothing may call into the library closed below */
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
