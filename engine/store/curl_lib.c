/* libcurl opened on first use: the table behind engine/store/curl_lib.h's names. */
#include "curl_lib.h"

#include <stdio.h>
#include <stdlib.h>

#include "shardflow/error.h"

static const char *const symbols[] = {SF_CURL_FUNCTIONS(SF_DYNLIB_NAME) NULL};
static sf_curl_fns fns;
static sf_dynlib lib = {.soname = SF_CURL_SONAME, .symbols = symbols, .fns = &fns,
                        .purpose = "read shards over HTTP(S) and object stores (libcurl; Debian: libcurl4)"};

int sf_curl_open(const char **why) {
  if (sf_dynlib_load(&lib) == 0) return 0;
  if (why) *why = lib.why;
  return SF_EUNSUPPORTED;
}

const sf_curl_fns *sf_curl(void) {
  if (atomic_load_explicit(&lib.state, memory_order_acquire) == 1) return &fns;
  const char *why;
  if (sf_curl_open(&why) < 0) {
    fprintf(stderr, "shardflow: %s\n", why);
    exit(127);
  }
  return &fns;
}
