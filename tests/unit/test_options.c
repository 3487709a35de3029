/* Typed option parsers and table-driven application: values, units, ranges, messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "options.h"

typedef struct opts {
  bool flag;
  int64_t i, count, size;
  double f, duration;
  char *s;
  int e;
  uint64_t seed;
  sf_float_list list;
  sf_name_list names;
} opts;

static const char *const colors[] = {"red", "green", "blue", NULL};
static const sf_option table[] = {
    {"flag", SF_OPT_BOOL, offsetof(opts, flag), "true", 0, 0, "a flag", NULL},
    {"i", SF_OPT_INT, offsetof(opts, i), "-3", -10, 10, "an int", NULL},
    {"count", SF_OPT_COUNT, offsetof(opts, count), "10k", 0, 0, "a count", NULL},
    {"size", SF_OPT_SIZE, offsetof(opts, size), "64MiB", 0, 0, "a size", NULL},
    {"f", SF_OPT_FLOAT, offsetof(opts, f), "0.5", 0, 1, "a float", NULL},
    {"duration", SF_OPT_DURATION, offsetof(opts, duration), "30s", 0, 0, "a duration", NULL},
    {"s", SF_OPT_STRING, offsetof(opts, s), "hello", 0, 0, "a string", NULL},
    {"e", SF_OPT_ENUM, offsetof(opts, e), "green", 0, 0, "an enum", colors},
    {"seed", SF_OPT_SEED, offsetof(opts, seed), "42", 0, 0, "a seed", NULL},
    {"list", SF_OPT_FLOAT_LIST, offsetof(opts, list), "[0.1, 0.2, 0.3]", 0, 0, "a list", NULL},
    {"names", SF_OPT_NAME_LIST, offsetof(opts, names), "jpg,png", 0, 0, "a name list", NULL},
    {NULL},
};

static void test_defaults(void **state) {
  opts o = {0};
  char why[256];
  assert_int_equal(sf_options_set_defaults(table, &o, why, sizeof why), 0);
  assert_true(o.flag);
  assert_int_equal(o.i, -3);
  assert_int_equal(o.count, 10000);
  assert_int_equal(o.size, 64 * 1024 * 1024);
  assert_true(o.f == 0.5);
  assert_true(o.duration == 30.0);
  assert_string_equal(o.s, "hello");
  assert_int_equal(o.e, 1);
  assert_int_equal(o.seed, 42);
  assert_int_equal(o.list.n, 3);
  assert_true(o.list.v[2] == 0.3);
  assert_int_equal(o.names.n, 2);
  assert_string_equal(o.names.v[1], "png");
  sf_options_free(table, &o);
  assert_null(o.s);
  assert_int_equal(o.names.n, 0);
  assert_null(o.names.v);
}

static int parse(opts *o, const char *name, const char *text, char *why) {
  return sf_option_parse(sf_option_find(table, name), text, o, why, 256);
}

static void test_units(void **state) {
  opts o = {0};
  char why[256];
  assert_int_equal(parse(&o, "size", "512", why), 0);
  assert_int_equal(o.size, 512);
  assert_int_equal(parse(&o, "size", "64k", why), 0);
  assert_int_equal(o.size, 64000);
  assert_int_equal(parse(&o, "size", "64KiB", why), 0);
  assert_int_equal(o.size, 65536);
  assert_int_equal(parse(&o, "size", "1.5G", why), 0);
  assert_int_equal(o.size, 1500000000);
  assert_int_equal(parse(&o, "count", "1_000", why), 0);
  assert_int_equal(o.count, 1000);
  assert_int_equal(parse(&o, "count", "2M", why), 0);
  assert_int_equal(o.count, 2000000);
  assert_int_equal(parse(&o, "duration", "250ms", why), 0);
  assert_true(o.duration > 0.2499 && o.duration < 0.2501);
  assert_int_equal(parse(&o, "duration", "5m", why), 0);
  assert_true(o.duration == 300);
  assert_int_equal(parse(&o, "duration", "1h", why), 0);
  assert_true(o.duration == 3600);
  assert_int_equal(parse(&o, "flag", "off", why), 0);
  assert_false(o.flag);
  assert_int_equal(parse(&o, "e", "BLUE", why), 0);
  assert_int_equal(o.e, 2);
  assert_int_equal(parse(&o, "list", "1,2", why), 0);
  assert_int_equal(o.list.n, 2);
  assert_int_equal(parse(&o, "seed", "0x10", why), 0);
  assert_int_equal(o.seed, 16);
  sf_options_free(table, &o);
}

static void test_errors(void **state) {
  opts o = {0};
  char why[256];
  assert_int_equal(parse(&o, "i", "11", why), SF_EOPTION);
  assert_non_null(strstr(why, "-10..10"));
  assert_int_equal(parse(&o, "i", "abc", why), SF_EOPTION);
  assert_int_equal(parse(&o, "i", "1234567890123456789012345678901234567890123456789012345678901234567890", why),
                   SF_EOPTION); /* longer than the parser's buffer (found by fuzz_graph) */
  assert_int_equal(parse(&o, "i", "", why), SF_EOPTION);
  assert_non_null(strstr(why, "not an integer"));
  assert_int_equal(parse(&o, "e", "purple", why), SF_EOPTION);
  assert_non_null(strstr(why, "red|green|blue"));
  assert_int_equal(parse(&o, "size", "12 parsecs", why), SF_EOPTION);
  assert_int_equal(parse(&o, "count", "-1", why), SF_EOPTION);
  assert_int_equal(parse(&o, "count", "1.5", why), SF_EOPTION);
  assert_int_equal(parse(&o, "count", "64KiB", why), SF_EOPTION); /* binary units are for sizes */
  assert_int_equal(parse(&o, "flag", "maybe", why), SF_EOPTION);
  assert_int_equal(parse(&o, "f", "2", why), SF_EOPTION);
  assert_int_equal(parse(&o, "duration", "-1s", why), SF_EOPTION);
  assert_int_equal(parse(&o, "seed", "-5", why), SF_EOPTION);
  assert_int_equal(parse(&o, "list", "1,x", why), SF_EOPTION);
  char names[256];
  sf_options_names(table, names, sizeof names);
  assert_non_null(strstr(names, "flag, i, count"));
}

static void test_stage_tables_parse(void **state) {
  /* Every built-in stage's defaults must parse with its own parsers. */
  void *it = NULL;
  const sf_stage_def *def;
  int n = 0;
  while ((def = sf_stage_iterate(&it))) {
    char why[256] = "";
    char *priv = calloc(1, def->priv_size ? def->priv_size : 1);
    int r = sf_options_set_defaults(def->options, priv, why, sizeof why);
    if (r != 0) fail_msg("stage %s: default does not parse: %s", def->name, why);
    for (const sf_option *o = def->options; o && o->name; o++) {
      assert_non_null(o->help);
      assert_true(o->offset < def->priv_size);
    }
    sf_options_free(def->options, priv);
    free(priv);
    n++;
  }
  assert_int_equal(n, SF_BUILTIN_STAGE_COUNT); /* meson.build's builtin_stages */
}

/* Checks that names holds the items of want (a NULL-terminated list). */
static void assert_names(const sf_name_list *names, const char *const *want) {
  int n = 0;
  while (want[n]) n++;
  assert_int_equal(names->n, n);
  for (int i = 0; i < n; i++) assert_string_equal(names->v[i], want[i]);
}

/* A name list takes what the comma-separated strings it replaced took, and what lists are written as. */
static void test_name_list(void **state) {
  opts o = {0};
  char why[256], text[2048];
  assert_int_equal(parse(&o, "names", "image=jpg;png,label=cls", why), 0);
  assert_names(&o.names, (const char *[]){"image=jpg;png", "label=cls", NULL});
  /* a YAML list reaches options joined with ", "; --set and Python keyword arguments write "[a, b]" */
  assert_int_equal(parse(&o, "names", "a, b c , d", why), 0);
  assert_names(&o.names, (const char *[]){"a", "b c", "d", NULL});
  assert_int_equal(parse(&o, "names", " [ ids=0, audio = 1.5 ] ", why), 0);
  assert_names(&o.names, (const char *[]){"ids=0", "audio = 1.5", NULL});
  /* empty items are left out, as augment's and batch's own parsers did */
  assert_int_equal(parse(&o, "names", ",a,, b,", why), 0);
  assert_names(&o.names, (const char *[]){"a", "b", NULL});
  assert_int_equal(parse(&o, "names", "[]", why), 0);
  assert_names(&o.names, (const char *[]){NULL});
  assert_null(o.names.v);
  assert_int_equal(parse(&o, "names", "", why), 0);
  assert_int_equal(o.names.n, 0);
  /* a bracket that is not one of a pair is text */
  assert_int_equal(parse(&o, "names", "[a,b", why), 0);
  assert_names(&o.names, (const char *[]){"[a", "b", NULL});
  /* at most SF_NAME_LIST_MAX items; a refused value leaves the old one */
  size_t len = 0;
  for (int i = 0; i <= SF_NAME_LIST_MAX; i++) len += (size_t)snprintf(text + len, sizeof text - len, "f%d,", i);
  assert_int_equal(parse(&o, "names", text, why), SF_EOPTION);
  assert_non_null(strstr(why, "names lists more than 64 items"));
  assert_names(&o.names, (const char *[]){"[a", "b", NULL});
  text[len - 4] = '\0'; /* drop ",64," */
  assert_int_equal(parse(&o, "names", text, why), 0);
  assert_int_equal(o.names.n, SF_NAME_LIST_MAX);
  assert_string_equal(o.names.v[63], "f63");
  char type[64];
  assert_string_equal(sf_option_type_text(sf_option_find(table, "names"), type, sizeof type), "name list");
  sf_options_free(table, &o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_units),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_stage_tables_parse),
      cmocka_unit_test(test_name_list),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
