/* Subcommand options from one table: getopt_long, the stages' typed parsers, --help and docs/cli.md. */
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "options.h"
#include "shardflow/error.h"

enum { HELP_COLUMN = 26, HELP_WIDTH = 100 }; /* where option help starts, and where lines wrap */

static int count_rows(const sf_cli_option *t) {
  int n = 0;
  while (t && t[n].row.name)
    n++;
  return n;
}

int sf_cli_usage_error(const sf_cli_command *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "shardflow %s: ", c->name);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nusage: shardflow %s %s\n(shardflow %s --help describes every option)\n", c->name, c->args,
          c->name);
  return 2;
}

int sf_cli_vfail(const char *name, const char *fmt, va_list ap) {
  fprintf(stderr, "shardflow %s: ", name);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  return 1;
}

int sf_cli_fail(const sf_cli_command *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = sf_cli_vfail(c->name, fmt, ap);
  va_end(ap);
  return r;
}

/* Stores one value of row o into args; on a bad value prints the usage error and returns 2. */
static int store(const sf_cli_command *c, const sf_cli_option *o, const char *text, void *args) {
  void *field = (char *)args + o->row.offset;
  if (!o->value) {
    *(bool *)field = true;
    return 0;
  }
  if (o->repeat) {
    sf_cli_list *list = field;
    const char **v = realloc(list->v, (size_t)(list->n + 1) * sizeof *v);
    if (!v) return sf_cli_fail(c, "out of memory");
    v[list->n++] = text;
    list->v = v;
    return 0;
  }
  if (o->row.type == SF_OPT_STRING) { /* argv outlives the command: nothing to copy or free */
    *(const char **)field = text;
    return 0;
  }
  /* The shared parser names the option as the user wrote it. */
  char name[64], why[512];
  sf_option row = o->row;
  snprintf(name, sizeof name, "--%s", o->row.name);
  row.name = name;
  if (sf_option_parse(&row, text, args, why, sizeof why) < 0) return sf_cli_usage_error(c, "%s", why);
  return 0;
}

static int set_defaults(const sf_cli_command *c, void *args) {
  for (const sf_cli_option *o = c->options; o && o->row.name; o++) {
    if (!o->row.default_value || !o->value || o->repeat) continue;
    if (o->row.type == SF_OPT_STRING) {
      *(const char **)((char *)args + o->row.offset) = o->row.default_value;
    } else {
      char why[512];
      if (sf_option_parse(&o->row, o->row.default_value, args, why, sizeof why) < 0)
        return sf_cli_fail(c, "internal error: the default of --%s: %s", o->row.name, why);
    }
  }
  return 0;
}

bool sf_cli_parse(const sf_cli_command *c, int argc, char **argv, void *args, int *first, int *status) {
  int n = count_rows(c->options);
  struct option *longopts = calloc((size_t)n + 2, sizeof *longopts);
  char shorts[2 * 64 + 4];
  size_t ns = 0;
  if (!longopts) {
    *status = sf_cli_fail(c, "out of memory");
    return false;
  }
  if (c->options_first) shorts[ns++] = '+'; /* else GNU order: options may follow the operands */
  shorts[ns++] = ':';                       /* a missing value is reported as ':' */
  shorts[ns++] = 'h';
  for (int i = 0; i < n; i++) {
    const sf_cli_option *o = &c->options[i];
    longopts[i] = (struct option){o->row.name, o->value ? required_argument : no_argument, NULL, 256 + i};
    if (o->short_name && ns + 3 < sizeof shorts) {
      shorts[ns++] = o->short_name;
      if (o->value) shorts[ns++] = ':';
    }
  }
  shorts[ns] = '\0';
  longopts[n] = (struct option){"help", no_argument, NULL, 'h'};
  *status = set_defaults(c, args);
  optind = 0; /* GNU getopt: start over (help runs a second command's parser) */
  opterr = 0;
  int ch;
  while (*status == 0 && (ch = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
    const sf_cli_option *o = NULL;
    if (ch >= 256) {
      o = &c->options[ch - 256];
    } else {
      for (int i = 0; i < n && !o; i++)
        if (c->options[i].short_name && c->options[i].short_name == ch) o = &c->options[i];
    }
    if (o) {
      *status = store(c, o, optarg, args);
    } else if (ch == 'h') {
      sf_cli_print_help(stdout, c);
      free(longopts);
      sf_cli_free(c, args);
      *status = 0;
      return false;
    } else if (ch == ':') {
      const sf_cli_option *m = optopt >= 256 ? &c->options[optopt - 256] : NULL;
      *status = sf_cli_usage_error(c, "%s needs a value%s%s", argv[optind - 1], m ? ": " : "", m ? m->value : "");
    } else if (optopt >= 256) {
      *status = sf_cli_usage_error(c, "--%s takes no value", c->options[optopt - 256].row.name);
    } else {
      char bad[3] = {'-', (char)optopt, 0};
      *status = sf_cli_usage_error(c, "unknown option '%s'", optopt > 0 && optopt < 256 ? bad : argv[optind - 1]);
    }
  }
  free(longopts);
  *first = optind;
  if (*status != 0) sf_cli_free(c, args); /* the caller returns at once: nothing of args stays in use */
  return *status == 0;
}

void sf_cli_free(const sf_cli_command *c, void *args) {
  for (const sf_cli_option *o = c->options; o && o->row.name; o++) {
    if (!o->repeat) continue;
    sf_cli_list *list = (sf_cli_list *)((char *)args + o->row.offset);
    free(list->v);
    *list = (sf_cli_list){0};
  }
}

/* "(count, default 100, 1..4096)": what the table knows beyond the help sentence, or "". */
static void row_facts(const sf_cli_option *o, char *buf, size_t size) {
  char type[256] = "", def[128] = "", range[64] = "";
  if (!o->value) {
    buf[0] = '\0';
    return;
  }
  if (o->row.type != SF_OPT_STRING) sf_option_type_text(&o->row, type, sizeof type);
  if (o->row.default_value && o->row.default_value[0])
    snprintf(def, sizeof def, "%sdefault %s", type[0] ? ", " : "", o->row.default_value);
  if (o->row.min != o->row.max)
    snprintf(range, sizeof range, "%s%.15g..%.15g", type[0] || def[0] ? ", " : "", o->row.min, o->row.max);
  if (o->repeat) snprintf(type, sizeof type, "may be repeated");
  if (type[0] || def[0] || range[0])
    snprintf(buf, size, " (%s%s%s)", type, def, range);
  else
    buf[0] = '\0';
}

/* Prints text word-wrapped from column `at` to HELP_WIDTH, continuation lines indented to `at`. */
static void put_wrapped(FILE *out, const char *text, int at) {
  int col = at;
  const char *s = text;
  while (*s) {
    size_t word = strcspn(s, " ");
    if (col > at && col + 1 + (int)word > HELP_WIDTH) {
      fprintf(out, "\n%*s", at, "");
      col = at;
    } else if (col > at) {
      fputc(' ', out);
      col++;
    }
    fwrite(s, 1, word, out);
    col += (int)word;
    s += word;
    while (*s == ' ')
      s++;
  }
  fputc('\n', out);
}

static void put_option(FILE *out, char short_name, const char *name, const char *value, const char *help,
                       const char *facts) {
  char left[128], alias[8] = "", text[1024];
  if (short_name) snprintf(alias, sizeof alias, "-%c, ", short_name);
  snprintf(left, sizeof left, "  %s--%s%s%s", alias, name, value ? " " : "", value ? value : "");
  snprintf(text, sizeof text, "%s%s", help, facts);
  if ((int)strlen(left) >= HELP_COLUMN - 1) /* keep two spaces before the help */
    fprintf(out, "%s\n%*s", left, HELP_COLUMN, "");
  else
    fprintf(out, "%-*s", HELP_COLUMN, left);
  put_wrapped(out, text, HELP_COLUMN);
}

void sf_cli_print_help(FILE *out, const sf_cli_command *c) {
  fprintf(out, "usage: shardflow %s %s\n\n%s\n\noptions:\n", c->name, c->args, c->about);
  for (const sf_cli_option *o = c->options; o && o->row.name; o++) {
    char facts[512];
    row_facts(o, facts, sizeof facts);
    put_option(out, o->short_name, o->row.name, o->value, o->row.help ? o->row.help : "", facts);
  }
  put_option(out, 'h', "help", NULL, "show this help", "");
  if (c->notes) fprintf(out, "\n%s\n", c->notes);
}

void sf_cli_print_markdown(FILE *out, const sf_cli_command *c) {
  fprintf(out, "## shardflow %s\n\n%s.\n\n```text\n", c->name, c->summary);
  sf_cli_print_help(out, c);
  fprintf(out, "```\n\n");
}
