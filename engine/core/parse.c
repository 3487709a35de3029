/* Typed value parsers (sizes, counts, durations, booleans) shared by option tables and the CLI. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "parse.h"
#include "shardflow/error.h"
#include "shardflow/stage.h"

static const char *skip_space(const char *s) {
  while (isspace((unsigned char)*s)) s++;
  return s;
}

static bool only_space(const char *s) { return *skip_space(s) == '\0'; }

/* A number with underscores allowed between digits ("1_000"), copied without them. */
static bool strip_underscores(const char *in, char *out, size_t size) {
  size_t n = 0;
  for (; *in; in++) {
    if (*in == '_') continue;
    if (n + 1 >= size) return false;
    out[n++] = *in;
  }
  out[n] = '\0';
  return true;
}

/* The unit after a number, lower-cased, with nothing but spaces after it. */
static bool read_unit(const char *end, char *unit, size_t size) {
  size_t n = 0;
  while (end[n] && !isspace((unsigned char)end[n]) && n + 1 < size) {
    unit[n] = (char)tolower((unsigned char)end[n]);
    n++;
  }
  unit[n] = '\0';
  return only_space(end + n);
}

static int parse_scaled(const char *text, double *value, bool binary_units, bool *fractional) {
  char buf[128];
  if (!strip_underscores(skip_space(text), buf, sizeof buf) || !buf[0]) return SF_EOPTION;
  char *end;
  errno = 0;
  double v = strtod(buf, &end);
  if (end == buf || errno || !isfinite(v)) return SF_EOPTION;
  *fractional = v != floor(v);
  while (isspace((unsigned char)*end)) end++;
  static const struct {
    const char *suffix;
    double factor;
    bool binary;
  } units[] = {
      {"", 1, false},          {"b", 1, true},           {"k", 1e3, false},
      {"kb", 1e3, true},       {"ki", 1024.0, true},     {"kib", 1024.0, true},
      {"m", 1e6, false},       {"mb", 1e6, true},        {"mi", 1048576.0, true},
      {"mib", 1048576.0, true}, {"g", 1e9, false},       {"gb", 1e9, true},
      {"gi", 1073741824.0, true}, {"gib", 1073741824.0, true}, {"t", 1e12, false},
      {"tb", 1e12, true},      {"ti", 1099511627776.0, true}, {"tib", 1099511627776.0, true},
  };
  char suffix[8];
  if (!read_unit(end, suffix, sizeof suffix)) return SF_EOPTION;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(units[i].suffix, suffix) == 0) {
      if (units[i].binary && !binary_units) return SF_EOPTION;
      *value = v * units[i].factor;
      return 0;
    }
  }
  return SF_EOPTION;
}

int sf_parse_size(const char *text, int64_t *bytes) {
  double v;
  bool frac;
  if (parse_scaled(text, &v, true, &frac) < 0 || v < 0 || v > 9.2e18) return SF_EOPTION;
  *bytes = (int64_t)llround(v);
  return 0;
}

int sf_parse_count(const char *text, int64_t *count) {
  double v;
  bool frac;
  if (parse_scaled(text, &v, false, &frac) < 0 || v < 0 || v > 9.2e18) return SF_EOPTION;
  if (v != floor(v)) return SF_EOPTION;
  *count = (int64_t)v;
  return 0;
}

int sf_parse_duration(const char *text, double *seconds) {
  const char *s = skip_space(text);
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !isfinite(v) || v < 0) return SF_EOPTION;
  while (isspace((unsigned char)*end)) end++;
  static const struct {
    const char *suffix;
    double factor;
  } units[] = {{"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"m", 60}, {"min", 60}, {"h", 3600}};
  char suffix[8];
  if (!read_unit(end, suffix, sizeof suffix)) return SF_EOPTION;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(units[i].suffix, suffix) == 0) {
      *seconds = v * units[i].factor;
      return 0;
    }
  }
  return SF_EOPTION;
}

int sf_parse_bool(const char *text, bool *out) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  const char *s = skip_space(text);
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) return *out = true, 0;
    if (strcasecmp(s, no[i]) == 0) return *out = false, 0;
  }
  return SF_EOPTION;
}

int sf_parse_int(const char *text, int64_t *value) {
  char buf[64], *end = NULL;
  errno = 0;
  long long v = strip_underscores(skip_space(text), buf, sizeof buf) ? strtoll(buf, &end, 0) : 0;
  if (!end || end == buf || errno || !only_space(end)) return SF_EOPTION;
  *value = v;
  return 0;
}

int sf_parse_seed(const char *text, uint64_t *value) {
  const char *s = skip_space(text);
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (end == s || errno || !only_space(end) || *s == '-') return SF_EOPTION;
  *value = v;
  return 0;
}

int sf_parse_float(const char *text, double *value) {
  const char *s = skip_space(text);
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !only_space(end) || !isfinite(v)) return SF_EOPTION;
  *value = v;
  return 0;
}

int sf_parse_float_list(const char *text, sf_float_list *out) {
  sf_float_list list = {0};
  const char *s = skip_space(text);
  if (*s == '[') s++;
  for (;;) {
    s = skip_space(s);
    if (*s == ']' || *s == '\0') break;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v)) return SF_EOPTION;
    if (list.n >= (int)(sizeof list.v / sizeof list.v[0])) return SF_EOPTION;
    list.v[list.n++] = v;
    s = skip_space(end);
    if (*s == ',') s++;
  }
  if (*s == ']') s++;
  if (!only_space(s)) return SF_EOPTION;
  *out = list;
  return 0;
}

int sf_parse_name_list(const char *text, sf_name_list *out) {
  const char *s = skip_space(text), *end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1])) end--;
  if (end - s >= 2 && *s == '[' && end[-1] == ']') s++, end--; /* brackets only as a pair: "[a, b]" */
  int n = 0;
  size_t bytes = 0;
  for (int pass = 0; pass < 2; pass++) { /* count, then copy into one block: pointers, then the strings */
    char **v = NULL, *text_at = NULL;
    if (pass == 1) {
      if (n == 0) {
        *out = (sf_name_list){0};
        return 0;
      }
      v = malloc((size_t)n * sizeof *v + bytes);
      if (!v) return SF_ENOMEM;
      text_at = (char *)(v + n);
    }
    n = 0;
    for (const char *p = s; p < end;) {
      const char *comma = memchr(p, ',', (size_t)(end - p)), *a = p, *b = comma ? comma : end;
      p = comma ? comma + 1 : end;
      while (a < b && isspace((unsigned char)*a)) a++;
      while (b > a && isspace((unsigned char)b[-1])) b--;
      if (a == b) continue;
      if (pass == 0) {
        if (n == SF_NAME_LIST_MAX) return SF_ETOOBIG;
        bytes += (size_t)(b - a) + 1;
      } else {
        v[n] = text_at;
        memcpy(text_at, a, (size_t)(b - a));
        text_at[b - a] = '\0';
        text_at += b - a + 1;
      }
      n++;
    }
    if (pass == 1) *out = (sf_name_list){.n = n, .v = (const char *const *)v};
  }
  return 0;
}
