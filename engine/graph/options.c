/* The table-driven option apply and help shared by every stage (the value parsers are core/parse.c). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "options.h"
#include "registry.h"
#include "shardflow/shardflow.h"

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
      [SF_OPT_FLOAT_LIST] = "float list", [SF_OPT_NAME_LIST] = "name list",
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

/* The numeric types, their parsers' results stored as int64_t (INT, COUNT, SIZE) or double (FLOAT, DURATION). */
static int parse_number(const sf_option *o, const char *text, void *p, char *why, size_t n) {
  int64_t i = 0;
  double d = 0;
  int r;
  const char *hint;
  switch (o->type) {
  case SF_OPT_INT: r = sf_parse_int(text, &i), d = (double)i, hint = "is not an integer"; break;
  case SF_OPT_COUNT: r = sf_parse_count(text, &i), d = (double)i, hint = "is not a count"; break;
  case SF_OPT_SIZE: r = sf_parse_size(text, &i), d = (double)i, hint = "is not a size"; break;
  case SF_OPT_FLOAT: r = sf_parse_float(text, &d), hint = "is not a number"; break;
  default: r = sf_parse_duration(text, &d), hint = "is not a duration"; break;
  }
  if (r < 0) {
    static const char *const examples[] = {
        [SF_OPT_COUNT] = ": use a whole number such as 128, 10k or 2M",
        [SF_OPT_SIZE] = ": use bytes with an optional unit such as 64KiB, 16MiB, 1G",
        [SF_OPT_DURATION] = ": use e.g. 250ms, 30s, 5m or 1h",
    };
    const char *e = (size_t)o->type < sizeof examples / sizeof examples[0] && examples[o->type] ? examples[o->type] : "";
    snprintf(why, n, "'%s' %s for %s%s", text, hint, o->name, e);
    return SF_EOPTION;
  }
  if ((r = out_of_range(o, d, why, n)) < 0) return r;
  if (o->type == SF_OPT_FLOAT || o->type == SF_OPT_DURATION) *(double *)p = d;
  else *(int64_t *)p = i;
  return 0;
}

/* An enum's name (any case, leading blanks ignored) as its index. */
static int parse_enum(const sf_option *o, const char *text, int *p, char *why, size_t n) {
  int i = 0;
  const char *s = text + strspn(text, " \t\r\n");
  for (const char *const *e = o->enum_names; e && *e; e++, i++) {
    if (strcasecmp(*e, s) == 0) {
      *p = i;
      return 0;
    }
  }
  char tbuf[256];
  snprintf(why, n, "'%s' is not valid for %s: expected one of %s", text, o->name, sf_option_type_text(o, tbuf, sizeof tbuf));
  return SF_EOPTION;
}

int sf_option_parse(const sf_option *o, const char *text, void *priv, char *why, size_t n) {
  char *p = (char *)priv + o->offset;
  int r = 0;
  if (!text) text = "";
  switch (o->type) {
  case SF_OPT_BOOL: {
    bool v;
    if ((r = sf_parse_bool(text, &v)) == 0) *(bool *)p = v;
    else snprintf(why, n, "'%s' is not a bool for %s: use true or false", text, o->name);
    break;
  }
  case SF_OPT_INT:
  case SF_OPT_COUNT:
  case SF_OPT_FLOAT:
  case SF_OPT_SIZE:
  case SF_OPT_DURATION: r = parse_number(o, text, p, why, n); break;
  case SF_OPT_STRING: {
    char *copy = strdup(text);
    if (!copy) return SF_ENOMEM;
    free(*(char **)p);
    *(char **)p = copy;
    break;
  }
  case SF_OPT_ENUM: r = parse_enum(o, text, (int *)p, why, n); break;
  case SF_OPT_SEED: {
    uint64_t v;
    if ((r = sf_parse_seed(text, &v)) < 0)
      snprintf(why, n, "'%s' is not a seed for %s: use a non-negative integer", text, o->name);
    else
      *(uint64_t *)p = v;
    break;
  }
  case SF_OPT_FLOAT_LIST: {
    sf_float_list v;
    if ((r = sf_parse_float_list(text, &v)) < 0)
      snprintf(why, n, "'%s' is not a list of numbers for %s: use e.g. [0.5, 0.5, 0.5] (at most %d)", text,
               o->name, SF_FLOAT_LIST_MAX);
    else
      *(sf_float_list *)p = v;
    break;
  }
  case SF_OPT_NAME_LIST: {
    sf_name_list v;
    if ((r = sf_parse_name_list(text, &v)) == 0) {
      free((void *)((sf_name_list *)p)->v);
      *(sf_name_list *)p = v;
    } else if (r == SF_ETOOBIG) {
      snprintf(why, n, "%s lists more than %d items: give at most %d, separated by commas", o->name,
               SF_NAME_LIST_MAX, SF_NAME_LIST_MAX);
      r = SF_EOPTION;
    }
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
    if (o->type == SF_OPT_NAME_LIST) {
      sf_name_list *l = (sf_name_list *)((char *)priv + o->offset);
      free((void *)l->v);
      *l = (sf_name_list){0};
    }
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
  fprintf(out, "%s: %s\n  in: %s  out: %s%s\n", def->name, def->summary, port_name(sf_port_first_kind(def->inputs)),
          port_name(sf_port_first_kind(def->outputs)), (def->flags & SF_STAGE_MAP) ? "  (map stage: `replicas: N` runs N copies)" : "");
  const sf_plugin *plugin = sf_registry_stage_plugin(def);
  if (plugin) fprintf(out, "  from plugin %s (build %s): write `plugins: [%s]` in the graph\n", plugin->name,
                      plugin->build_id, plugin->name);
  sf_options_print_help(out, def->options);
}

void sf_options_print_help(FILE *out, const sf_option *table) {
  for (const sf_option *o = table; o && o->name; o++) {
    char tbuf[256];
    fprintf(out, "  %-18s %-12s default %-10s", o->name, sf_option_type_text(o, tbuf, sizeof tbuf),
            o->default_value && o->default_value[0] ? o->default_value : "\"\"");
    if (has_range(o)) fprintf(out, " range %g..%g", o->min, o->max);
    fprintf(out, "\n  %18s %s\n", "", o->help ? o->help : "");
  }
}

void sf_stage_print_markdown(FILE *out, const sf_stage_def *def) {
  fprintf(out, "## %s\n\n%s.\n\nInput: %s. Output: %s.%s\n\n", def->name, def->summary, port_name(sf_port_first_kind(def->inputs)),
          port_name(sf_port_first_kind(def->outputs)), (def->flags & SF_STAGE_MAP) ? " A map stage: `replicas: N` runs N copies." : "");
  const sf_plugin *plugin = sf_registry_stage_plugin(def);
  if (plugin) fprintf(out, "From plugin `%s` (build %s): the graph names it in `plugins:`.\n\n", plugin->name,
                      plugin->build_id);
  sf_options_print_markdown(out, def->options, "option");
}

void sf_options_print_markdown(FILE *out, const sf_option *table, const char *what) {
  if (!table || !table->name) {
    fprintf(out, "No options.\n\n");
    return;
  }
  fprintf(out, "| %s | type | default | range | meaning |\n|---|---|---|---|---|\n", what);
  for (const sf_option *o = table; o->name; o++) {
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
