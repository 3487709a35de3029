/*
 * Optional shared libraries opened on first use (dlopen), so a process that never needs one does not
 * pay for loading it: libavif and libjxl bring about thirty more libraries between them (AV1 encoders,
 * abseil, highway, the C++ runtime), 40% of the CLI's start-up time, which every `shardflow run`, group
 * worker and DataLoader worker pays whether or not it meets an AVIF or a JPEG XL.
 */
#ifndef SF_ENGINE_DYNLIB_H
#define SF_ENGINE_DYNLIB_H

#include <stdatomic.h>
#include <stddef.h>

/*
 * A library to open once: its soname (what dlopen is given), or sonames, the names to try in order
 * (a library's versions, newest first: the first that opens is used, and soname then says which);
 * the names of the functions to resolve and where their addresses go (fns: a struct of function
 * pointers, one per name, in order, nothing else in it). Define it statically, with state 0;
 * sf_dynlib_load fills the rest.
 */
typedef struct sf_dynlib {
  const char *soname;
  const char *const *sonames; /* NULL-terminated; NULL = soname alone */
  const char *const *symbols; /* NULL-terminated */
  void *fns;
  const char *purpose;        /* for the message, e.g. "decode AVIF images" */
  atomic_int state;           /* 0 not tried, 1 loaded, -1 failed */
  void *handle;
  char why[320];              /* the failure, as the user reads it */
} sf_dynlib;

/*
 * Opens lib and resolves its symbols, the first time it is called for lib (thread-safe; later calls
 * return the first call's outcome). Returns 0, or SF_EUNSUPPORTED when the library or one of its functions
 * is missing: lib->why then names the soname, dlerror's words, and what to install.
 */
int sf_dynlib_load(sf_dynlib *lib);

/*
 * For a library's list of functions written once as X(name) X(name)...: SF_DYNLIB_FIELD makes its fns struct's
 * members (a pointer of each function's own type), SF_DYNLIB_NAME its symbols[] entries.
 */
#define SF_DYNLIB_FIELD(name) __typeof__(&name) name;
#define SF_DYNLIB_NAME(name) #name,

#endif
