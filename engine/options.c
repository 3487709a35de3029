/* Typed option parsers and the table-driven apply/help shared by every stage. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/options.h"
#include "shardflow/shardflow.h"

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

static int parse_bool(const char *text, bool *out) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  const char *s = skip_space(text);
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) return *out = true, 0;
    if (strcasecmp(s, no[i]) == 0) return *out = false, 0;
  }
  return SF_EOPTION;
}

static int parse_float_list(const char *text, sf_float_list *out) {
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

const sf_option *sf_option_find(const sf_option *table, const char *name) {
  for (const sf_option *o = table; o && o->name; o++)
    if (strcmp(o->name, name) == 0) return o;
  return NULL;
}

void sf_options_names(const sf_option *table, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (const sf_option *o = table; o && o->name; o++) {
    int w = snprintf(buf + n, size - n, "%s%s", n ? ", " : "", o->name);
    if (w < 0 || (size_t)w >= size - n) break;
    n += (size_t)w;
  }
  if (n == 0) snprintf(buf, size, "(this stage has no options)");
}

static void enum_names(const sf_option *o, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (const char *const *e = o->enum_names; e && *e; e++) {
    int w = snprintf(buf + n, size - n, "%s%s", n ? "|" : "", *e);
    if (w < 0 || (size_t)w >= size - n) break;
    n += (size_t)w;
  }
}

const char *sf_option_type_text(const sf_option *o, char *buf, size_t size) {
  static const char *const names[] = {
      [SF_OPT_BOOL] = "bool",     [SF_OPT_INT] = "int",         [SF_OPT_COUNT] = "count",
      [SF_OPT_FLOAT] = "float",   [SF_OPT_STRING] = "string",   [SF_OPT_ENUM] = "enum",
      [SF_OPT_SIZE] = "size",     [SF_OPT_DURATION] = "duration", [SF_OPT_SEED] = "seed",
      [SF_OPT_FLOAT_LIST] = "float list",
  };
  if (o->type == SF_OPT_ENUM)
    enum_names(o, buf, size);
  else
    snprintf(buf, size, "%s", (unsigned)o->type < sizeof names / sizeof names[0] ? names[o->type] : "?");
  return buf;
}

static bool has_range(const sf_option *o) { return o->min != o->max; }

static int out_of_range(const sf_option *o, double v, char *why, size_t n) {
  if (!has_range(o) || (v >= o->min && v <= o->max)) return 0;
  snprintf(why, n, "value %g is out of range for %s: expected %g..%g", v, o->name, o->min, o->max);
  return SF_EOPTION;
}

int sf_option_parse(const sf_option *o, const char *text, void *priv, char *why, size_t n) {
  char *p = (char *)priv + o->offset;
  char tbuf[256];
  int r = 0;
  if (!text) text = "";
  switch (o->type) {
  case SF_OPT_BOOL: {
    bool v;
    if ((r = parse_bool(text, &v)) == 0) *(bool *)p = v;
    else snprintf(why, n, "'%s' is not a bool for %s: use true or false", text, o->name);
    break;
  }
  case SF_OPT_INT: {
    char buf[64], *end = NULL;
    errno = 0;
    long long v = strip_underscores(skip_space(text), buf, sizeof buf) ? strtoll(buf, &end, 0) : 0;
    if (!end || end == buf || errno || !only_space(end)) {
      snprintf(why, n, "'%s' is not an integer for %s", text, o->name);
      r = SF_EOPTION;
    } else if ((r = out_of_range(o, (double)v, why, n)) == 0) {
      *(int64_t *)p = v;
    }
    break;
  }
  case SF_OPT_COUNT: {
    int64_t v;
    if ((r = sf_parse_count(text, &v)) < 0)
      snprintf(why, n, "'%s' is not a count for %s: use a whole number such as 128, 10k or 2M", text, o->name);
    else if ((r = out_of_range(o, (double)v, why, n)) == 0)
      *(int64_t *)p = v;
    break;
  }
  case SF_OPT_FLOAT: {
    char *end;
    errno = 0;
    double v = strtod(skip_space(text), &end);
    if (end == skip_space(text) || errno || !only_space(end) || !isfinite(v)) {
      snprintf(why, n, "'%s' is not a number for %s", text, o->name);
      r = SF_EOPTION;
    } else if ((r = out_of_range(o, v, why, n)) == 0) {
      *(double *)p = v;
    }
    break;
  }
  case SF_OPT_STRING: {
    char *copy = strdup(text);
    if (!copy) return SF_ENOMEM;
    free(*(char **)p);
    *(char **)p = copy;
    break;
  }
  case SF_OPT_ENUM: {
    int i = 0;
    const char *s = skip_space(text);
    for (const char *const *e = o->enum_names; e && *e; e++, i++) {
      if (strcasecmp(*e, s) == 0) {
        *(int *)p = i;
        return 0;
      }
    }
    snprintf(why, n, "'%s' is not valid for %s: expected one of %s", text, o->name,
             sf_option_type_text(o, tbuf, sizeof tbuf));
    r = SF_EOPTION;
    break;
  }
  case SF_OPT_SIZE: {
    int64_t v;
    if ((r = sf_parse_size(text, &v)) < 0)
      snprintf(why, n, "'%s' is not a size for %s: use bytes with an optional unit such as 64KiB, 16MiB, 1G",
               text, o->name);
    else if ((r = out_of_range(o, (double)v, why, n)) == 0)
      *(int64_t *)p = v;
    break;
  }
  case SF_OPT_DURATION: {
    double v;
    if ((r = sf_parse_duration(text, &v)) < 0)
      snprintf(why, n, "'%s' is not a duration for %s: use e.g. 250ms, 30s, 5m or 1h", text, o->name);
    else if ((r = out_of_range(o, v, why, n)) == 0)
      *(double *)p = v;
    break;
  }
  case SF_OPT_SEED: {
    char *end;
    errno = 0;
    const char *s = skip_space(text);
    unsigned long long v = strtoull(s, &end, 0);
    if (end == s || errno || !only_space(end) || *s == '-') {
      snprintf(why, n, "'%s' is not a seed for %s: use a non-negative integer", text, o->name);
      r = SF_EOPTION;
    } else {
      *(uint64_t *)p = v;
    }
    break;
  }
  case SF_OPT_FLOAT_LIST: {
    sf_float_list v;
    if ((r = parse_float_list(text, &v)) < 0)
      snprintf(why, n, "'%s' is not a list of numbers for %s: use e.g. [0.5, 0.5, 0.5] (at most 8)", text,
               o->name);
    else
      *(sf_float_list *)p = v;
    break;
  }
  default:
    snprintf(why, n, "option %s has an unknown type", o->name);
    r = SF_EINTERNAL;
  }
  return r;
}

int sf_options_set_defaults(const sf_option *table, void *priv, char *why, size_t n) {
  for (const sf_option *o = table; o && o->name; o++) {
    if (!o->default_value && o->type != SF_OPT_STRING) continue;
    int r = sf_option_parse(o, o->default_value ? o->default_value : "", priv, why, n);
    if (r == SF_ENOMEM) return r;
    if (r < 0) return SF_EINTERNAL;
  }
  return 0;
}

void sf_options_free(const sf_option *table, void *priv) {
  for (const sf_option *o = table; o && o->name; o++) {
    if (o->type != SF_OPT_STRING) continue;
    char **p = (char **)((char *)priv + o->offset);
    free(*p);
    *p = NULL;
  }
}

static const char *port_name(sf_port_kind k) {
  switch (k) {
  case SF_PORT_SHARD: return "shards";
  case SF_PORT_SAMPLE: return "samples";
  case SF_PORT_BATCH: return "batches";
  default: return "-";
  }
}

void sf_stage_print_help(FILE *out, const sf_stage_def *def) {
  fprintf(out, "%s: %s\n  in: %s  out: %s%s\n", def->name, def->summary, port_name(def->input),
          port_name(def->output), (def->flags & SF_STAGE_MAP) ? "  (map stage: `replicas: N` runs N copies)" : "");
  for (const sf_option *o = def->options; o && o->name; o++) {
    char tbuf[256];
    fprintf(out, "  %-18s %-12s default %-10s", o->name, sf_option_type_text(o, tbuf, sizeof tbuf),
            o->default_value && o->default_value[0] ? o->default_value : "\"\"");
    if (has_range(o)) fprintf(out, " range %g..%g", o->min, o->max);
    fprintf(out, "\n  %18s %s\n", "", o->help ? o->help : "");
  }
}

void sf_stage_print_markdown(FILE *out, const sf_stage_def *def) {
  fprintf(out, "## %s\n\n%s.\n\nInput: %s. Output: %s.%s\n\n", def->name, def->summary, port_name(def->input),
          port_name(def->output), (def->flags & SF_STAGE_MAP) ? " A map stage: `replicas: N` runs N copies." : "");
  if (!def->options || !def->options->name) {
    fprintf(out, "No options.\n\n");
    return;
  }
  fprintf(out, "| option | type | default | range | meaning |\n|---|---|---|---|---|\n");
  for (const sf_option *o = def->options; o->name; o++) {
    char tbuf[256], range[64] = "";
    if (has_range(o)) snprintf(range, sizeof range, "%g..%g", o->min, o->max);
    fprintf(out, "| `%s` | %s | `%s` | %s | %s |\n", o->name, sf_option_type_text(o, tbuf, sizeof tbuf),
            o->default_value && o->default_value[0] ? o->default_value : "\"\"", range, o->help ? o->help : "");
  }
  fprintf(out, "\n");
}

int sf_stage_help(const char *stage, char *buf, size_t size) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return SF_ENOMEM;
  int r = 0;
  if (stage) {
    const sf_stage_def *def = sf_stage_find(stage);
    if (def)
      sf_stage_print_help(f, def);
    else
      r = SF_ENOENT;
  } else {
    void *it = NULL;
    const sf_stage_def *def;
    while ((def = sf_stage_iterate(&it))) fprintf(f, "%s: %s\n", def->name, def->summary);
  }
  fclose(f);
  if (r == 0 && buf && size) snprintf(buf, size, "%s", text);
  free(text);
  return r < 0 ? r : (int)len;
}
