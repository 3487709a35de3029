/* A growable string: append bytes or printf-formatted text, then take the result. */
#ifndef SF_ENGINE_STRBUF_H
#define SF_ENGINE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Start from {0}.  data is NULL or NUL-terminated at len.  An append that
 * cannot get memory marks the string failed: later appends do nothing and
 * return SF_ENOMEM too, so a run of appends needs one check at the end
 * (sf_strbuf_take returns NULL).  The string owns data until taken or cleared.
 */
typedef struct sf_strbuf {
  char *data;
  size_t len, cap;
  bool failed;
} sf_strbuf;

/* Appends s[0, n) (may hold NUL bytes).  Returns 0, or SF_ENOMEM (b is then failed). */
int sf_strbuf_append(sf_strbuf *b, const void *s, size_t n);

/* Appends the NUL-terminated s.  Returns 0, or SF_ENOMEM. */
int sf_strbuf_add(sf_strbuf *b, const char *s);

/* Appends printf-formatted text.  Returns 0, or SF_ENOMEM (also for a format error). */
int sf_strbuf_appendf(sf_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Cuts the string back to len bytes (len <= b->len), keeping the memory for reuse. */
void sf_strbuf_truncate(sf_strbuf *b, size_t len);

/*
 * Hands the string over: returns it (newly allocated, NUL-terminated, "" when
 * nothing was appended; the caller frees it) with its length in *len when len
 * is not NULL, and resets b to {0}.  Returns NULL when b failed or out of
 * memory (b's memory is freed either way).
 */
char *sf_strbuf_take(sf_strbuf *b, size_t *len);

/* Frees the string and resets b to {0}. */
void sf_strbuf_clear(sf_strbuf *b);

#endif
