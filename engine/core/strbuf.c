/* A growable string (engine/strbuf.h): amortised doubling, sticky out-of-memory, never aborts. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/error.h"

/* Room for n more bytes and the NUL. */
static int reserve(sf_strbuf *b, size_t n) {
  if (b->failed) return SF_ENOMEM;
  if (b->data && n < b->cap - b->len) return 0;
  if (n > SIZE_MAX / 2 - b->len - 1) { /* the doubling below would overflow */
    b->failed = true;
    return SF_ENOMEM;
  }
  size_t cap = (b->len + n + 1) * 2;
  if (cap < 64) cap = 64;
  char *p = realloc(b->data, cap);
  if (!p) {
    b->failed = true;
    return SF_ENOMEM;
  }
  b->data = p;
  b->cap = cap;
  return 0;
}

int sf_strbuf_append(sf_strbuf *b, const void *s, size_t n) {
  int r = reserve(b, n);
  if (r) return r;
  if (n) memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

int sf_strbuf_add(sf_strbuf *b, const char *s) { return sf_strbuf_append(b, s, strlen(s)); }

int sf_strbuf_appendf(sf_strbuf *b, const char *fmt, ...) {
  if (b->failed) return SF_ENOMEM;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = true;
    return SF_ENOMEM;
  }
  if (b->data && (size_t)n < b->cap - b->len) { /* it fitted at the first try */
    b->len += (size_t)n;
    return 0;
  }
  int r = reserve(b, (size_t)n);
  if (r) return r;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

void sf_strbuf_truncate(sf_strbuf *b, size_t len) {
  if (len >= b->len) return;
  b->len = len;
  b->data[len] = '\0';
}

char *sf_strbuf_take(sf_strbuf *b, size_t *len) {
  char *s = b->failed ? NULL : b->data ? b->data : strdup("");
  if (b->failed) free(b->data);
  if (len) *len = s ? b->len : 0;
  *b = (sf_strbuf){0};
  return s;
}

void sf_strbuf_clear(sf_strbuf *b) {
  free(b->data);
  *b = (sf_strbuf){0};
}
