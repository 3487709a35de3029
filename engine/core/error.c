/* Error code names and strings, generated from SF_ERRNO_MAP; error record formatting. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "shardflow/error.h"

const char *sf_strerror(int code) {
  switch (code) {
#define SF_ERRNO_TEXT(name, value, text) \
  case SF_##name: return text;
    SF_ERRNO_MAP(SF_ERRNO_TEXT)
#undef SF_ERRNO_TEXT
  case 0: return "success";
  default: return "unknown error";
  }
}

const char *sf_err_name(int code) {
  switch (code) {
#define SF_ERRNO_NAME(name, value, text) \
  case SF_##name: return "SF_" #name;
    SF_ERRNO_MAP(SF_ERRNO_NAME)
#undef SF_ERRNO_NAME
  case 0: return "SF_OK";
  default: return "SF_EUNKNOWN";
  }
}

char *sf_error_format(const sf_error *e, char *buf, unsigned size) {
  if (!buf || size == 0) return buf;
  int n = 0;
  buf[0] = '\0';
#define APPEND(...)                                                              \
  do {                                                                           \
    if ((unsigned)n < size) {                                                    \
      int w = snprintf(buf + n, size - (unsigned)n, __VA_ARGS__);                \
      if (w > 0) n += w;                                                         \
    }                                                                            \
  } while (0)
  if (e->stage[0]) APPEND("%s: ", e->stage);
  if (e->url[0]) {
    APPEND("%s", e->url);
    if (e->line >= 0) APPEND(":%lld", (long long)e->line);
    if (e->offset >= 0) APPEND(" @ byte %lld", (long long)e->offset);
    if (e->key[0]) APPEND(" (key %s)", e->key);
    APPEND(": ");
  } else if (e->key[0]) {
    APPEND("key %s: ", e->key);
  }
  APPEND("%s", e->message[0] ? e->message : sf_strerror(e->code));
#undef APPEND
  return buf;
}

int sf_error_setv(sf_error *e, int code, sf_where where, const char *fmt, va_list args) {
  if (!e) return code;
  memset(e, 0, sizeof *e);
  e->code = code;
  e->offset = where.offset;
  e->line = where.line;
  snprintf(e->stage, sizeof e->stage, "%s", where.stage ? where.stage : "");
  snprintf(e->url, sizeof e->url, "%s", where.url ? where.url : "");
  snprintf(e->key, sizeof e->key, "%s", where.key ? where.key : "");
  vsnprintf(e->message, sizeof e->message, fmt, args);
  return code;
}

int sf_error_set(sf_error *e, int code, sf_where where, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sf_error_setv(e, code, where, fmt, ap);
  va_end(ap);
  return code;
}
