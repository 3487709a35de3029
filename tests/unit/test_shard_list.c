/* Unit tests of shard list expansion: braces as bash expands them, '::' joins, @FILE lists, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "shard_list.h"

/* Expands spec and checks the URLs against the NULL-terminated list of expected ones. */
static void expect_urls(const char *spec, const char *const *expected) {
  sf_shard_list list;
  sf_error error;
  int r = sf_shard_list_expand(&list, spec, &error);
  if (r) fail_msg("%s: %s", spec, error.message);
  size_t n = 0;
  while (expected[n]) n++;
  assert_int_equal(list.count, n);
  for (size_t i = 0; i < n; i++) assert_string_equal(list.urls[i], expected[i]);
  sf_shard_list_clear(&list);
  assert_null(list.urls);
  assert_int_equal(list.count, 0);
}

/* Expands spec, expects code, and checks the message names the pattern and what it should. */
static void expect_error(const char *spec, int code, const char *pattern, const char *needle) {
  sf_shard_list list = {(char **)1, 99};
  sf_error error;
  memset(&error, 0, sizeof error);
  int r = sf_shard_list_expand(&list, spec, &error);
  assert_int_equal(r, code);
  assert_int_equal(error.code, code);
  assert_null(list.urls);
  assert_int_equal(list.count, 0);
  if (pattern && !strstr(error.message, pattern))
    fail_msg("message \"%s\" does not quote \"%s\"", error.message, pattern);
  if (needle && !strstr(error.message, needle))
    fail_msg("message \"%s\" does not mention \"%s\"", error.message, needle);
  /* The library must also cope without an error record. */
  assert_int_equal(sf_shard_list_expand(&list, spec, NULL), code);
}

static void test_padding(void **state) {
  expect_urls("s-{000000..000003}.tar",
              (const char *[]){"s-000000.tar", "s-000001.tar", "s-000002.tar", "s-000003.tar", NULL});
  /* The bound written with leading zeros sets the width for every number. */
  expect_urls("{8..010}", (const char *[]){"008", "009", "010", NULL});
  expect_urls("{09..11}", (const char *[]){"09", "10", "11", NULL});
  expect_urls("{8..10}", (const char *[]){"8", "9", "10", NULL});
  expect_urls("{0..2}", (const char *[]){"0", "1", "2", NULL});
  expect_urls("x{5..5}", (const char *[]){"x5", NULL});

  /* The size used by the CIFAR/ImageNet examples, against printf's padding. */
  sf_shard_list list;
  assert_int_equal(sf_shard_list_expand(&list, "train-{000000..000649}.tar", NULL), 0);
  assert_int_equal(list.count, 650);
  for (size_t i = 0; i < list.count; i++) {
    char want[64];
    snprintf(want, sizeof want, "train-%06zu.tar", i);
    assert_string_equal(list.urls[i], want);
  }
  sf_shard_list_clear(&list);
}

static void test_countdown(void **state) {
  expect_urls("{3..1}", (const char *[]){"3", "2", "1", NULL});
  expect_urls("a{010..008}b", (const char *[]){"a010b", "a009b", "a008b", NULL});
  expect_urls("{10..8}", (const char *[]){"10", "9", "8", NULL});
}

static void test_lists(void **state) {
  expect_urls("{a,b,c}.tar", (const char *[]){"a.tar", "b.tar", "c.tar", NULL});
  expect_urls("x{,.bak}", (const char *[]){"x", "x.bak", NULL});
  expect_urls("{a,b{1..2},c}", (const char *[]){"a", "b1", "b2", "c", NULL});
  expect_urls("{a,{x,y}z}", (const char *[]){"a", "xz", "yz", NULL});
  /* Escaped braces and commas are literal; commas outside a group are too. */
  expect_urls("x\\{y\\}", (const char *[]){"x{y}", NULL});
  expect_urls("{a\\,b,c}", (const char *[]){"a,b", "c", NULL});
  expect_urls("a,b", (const char *[]){"a,b", NULL});
  expect_urls("plain.tar", (const char *[]){"plain.tar", NULL});
}

static void test_products(void **state) {
  expect_urls("{a,b}-{1..3}",
              (const char *[]){"a-1", "a-2", "a-3", "b-1", "b-2", "b-3", NULL});
  expect_urls("d{0..1}/s{00..01}{x,y}",
              (const char *[]){"d0/s00x", "d0/s00y", "d0/s01x", "d0/s01y", "d1/s00x", "d1/s00y",
                               "d1/s01x", "d1/s01y", NULL});
  /* A group inside an alternative multiplies only that alternative. */
  expect_urls("{a{1,2},b}{x,y}",
              (const char *[]){"a1x", "a1y", "a2x", "a2y", "bx", "by", NULL});

  sf_shard_list list;
  assert_int_equal(sf_shard_list_expand(&list, "{0..99}-{0..99}-{0..9}", NULL), 0);
  assert_int_equal(list.count, 100000);
  assert_string_equal(list.urls[12345], "12-34-5");
  sf_shard_list_clear(&list);
}

static void test_joins_and_urls(void **state) {
  expect_urls("a{1..2}::b::c{x,y}", (const char *[]){"a1", "a2", "b", "cx", "cy", NULL});
  /* URLs are opaque: schemes, ports and single colons pass through. */
  expect_urls("s3://bucket/x-{0..1}.tar::http://host:8080/y.tar",
              (const char *[]){"s3://bucket/x-0.tar", "s3://bucket/x-1.tar",
                               "http://host:8080/y.tar", NULL});
  expect_urls("pipe:curl -s http://h/{a,b}.tar",
              (const char *[]){"pipe:curl -s http://h/a.tar", "pipe:curl -s http://h/b.tar", NULL});
  expect_urls("", (const char *[]){NULL});
}

/* bash itself is the reference for brace expansion (patterns chosen so no word is empty). */
static void test_against_bash(void **state) {
  if (access("/bin/bash", X_OK) != 0) skip();
  static const char *const patterns[] = {
      "s-{000000..000012}.tar", "{8..010}", "{09..11}", "{1..010}", "{001..1}", "{3..1}",
      "{010..008}", "{10..8}", "x{,.bak}", "{a,b{1..2},c}", "{a,{x,y}z}", "{a,b}-{1..3}",
      "d{0..1}/s{00..01}{x,y}", "{a{1,2},b}{x,y}", "{a,b}{c,d}{e,f}", "x{0..0}y",
      "x\\{y\\}", "{a\\,b,c}", "{0..2}{9..7}{00..02}",
  };
  for (size_t p = 0; p < sizeof patterns / sizeof *patterns; p++) {
    char command[256];
    snprintf(command, sizeof command, "/bin/bash -c \"printf '%%s\\n' %s\"", patterns[p]);
    FILE *f = popen(command, "r");
    assert_non_null(f);
    sf_shard_list list;
    assert_int_equal(sf_shard_list_expand(&list, patterns[p], NULL), 0);
    char line[256];
    size_t n = 0;
    while (fgets(line, sizeof line, f)) {
      line[strcspn(line, "\n")] = '\0';
      if (n >= list.count) fail_msg("%s: bash gives more words than %zu", patterns[p], list.count);
      if (strcmp(line, list.urls[n]) != 0)
        fail_msg("%s: word %zu is \"%s\" in bash, \"%s\" here", patterns[p], n, line, list.urls[n]);
      n++;
    }
    assert_int_equal(pclose(f), 0);
    if (n != list.count) fail_msg("%s: bash gives %zu words, we give %zu", patterns[p], n, list.count);
    sf_shard_list_clear(&list);
  }
}

static char dir[64];

static char *write_file(const char *name, const char *text) {
  static char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static void test_list_file(void **state) {
  char spec[256];
  snprintf(spec, sizeof spec, "@%s",
           write_file("list.txt", "# shards of the first split\n"
                                  "/data/a-{0..1}.tar\n"
                                  "\n"
                                  "   \t\n"
                                  "  http://h/b.tar  \r\n"
                                  "  # indented comment\n"
                                  "c{x,y}.tar")); /* no newline at the end */
  expect_urls(spec, (const char *[]){"/data/a-0.tar", "/data/a-1.tar", "http://h/b.tar", "cx.tar",
                                     "cy.tar", NULL});
  char joined[300];
  snprintf(joined, sizeof joined, "first.tar::%s::last-{1..2}.tar", spec);
  expect_urls(joined, (const char *[]){"first.tar", "/data/a-0.tar", "/data/a-1.tar", "http://h/b.tar",
                                       "cx.tar", "cy.tar", "last-1.tar", "last-2.tar", NULL});

  snprintf(spec, sizeof spec, "@%s", write_file("empty.txt", "# nothing yet\n\n"));
  expect_urls(spec, (const char *[]){NULL});
}

static void test_errors(void **state) {
  expect_error("s-{000..", SF_EINVAL, "\"s-{000..\"", "at column 3: unbalanced '{'");
  expect_error("s-}000", SF_EINVAL, "\"s-}000\"", "at column 3: unbalanced '}'");
  expect_error("a{b,c}}", SF_EINVAL, NULL, "at column 7: unbalanced '}'");
  expect_error("a{b,{c}", SF_EINVAL, NULL, "at column 2: unbalanced '{'");
  expect_error("x{}y", SF_EINVAL, "\"x{}y\"", "at column 2: empty brace group {}");
  expect_error("x{abc}", SF_EINVAL, NULL, "at column 2");
  expect_error("x{{a,b}}", SF_EINVAL, NULL, "neither a list");
  expect_error("s-{a..9}", SF_EINVAL, "\"s-{a..9}\"", "at column 3: bad range \"{a..9}\"");
  expect_error("s-{1..}", SF_EINVAL, NULL, "at column 3: bad range \"{1..}\"");
  expect_error("s-{..3}", SF_EINVAL, NULL, "column 3");
  expect_error("s-{1..2..3}", SF_EINVAL, NULL, "bad range");
  expect_error("s-{-1..3}", SF_EINVAL, NULL, "bad range");
  expect_error("s-{1..1234567890123456789}", SF_EINVAL, NULL, "column 3");
  /* Columns count within the pattern named in the message, not the whole spec. */
  expect_error("ok-{1..2}::bad{1..", SF_EINVAL, "\"bad{1..\"", "column 4");
  expect_error("a::::b", SF_EINVAL, "\"a::::b\"", "at column 4: empty pattern");
  expect_error("::a", SF_EINVAL, NULL, "at column 1: empty pattern");
  expect_error("a::", SF_EINVAL, NULL, "at column 4: empty pattern");
  expect_error(NULL, SF_EINVAL, NULL, "no shard list");

  /* More than 10,000,000 URLs fail before anything is allocated for them. */
  expect_error("s-{0..10000000}", SF_ETOOBIG, "\"s-{0..10000000}\"", "10,000,000");
  expect_error("{0..99999}{0..999}", SF_ETOOBIG, NULL, "10,000,000");
  expect_error("{0..999999999999999999}{0..999999999999999999}", SF_ETOOBIG, NULL, "10,000,000");
  expect_error("{0..4}{a,b,c{0..9999999}}", SF_ETOOBIG, NULL, "10,000,000");
  /* 1 + 10,000,000: the total counts, checked before the second pattern expands. */
  expect_error("b::a-{0..9999999}", SF_ETOOBIG, "\"a-{0..9999999}\"",
               "10,000,000 URLs with the patterns before it");

  /* Hostile nesting and group counts are refused instead of exhausting the stack. */
  char deep[200] = "", many[2000] = "";
  for (int i = 0; i < 40; i++) strcat(deep, "{a,");
  for (int i = 0; i < 40; i++) strcat(deep, "}");
  expect_error(deep, SF_EINVAL, NULL, "nested more than");
  for (int i = 0; i < 300; i++) strcat(many, "{1..1}");
  expect_error(many, SF_EINVAL, NULL, "more than 256 brace groups");
}

static void test_list_file_errors(void **state) {
  char spec[256];
  sf_error error;
  sf_shard_list list;

  snprintf(spec, sizeof spec, "@%s/missing.txt", dir);
  expect_error(spec, SF_ENOENT, spec, "cannot open");
  assert_int_equal(sf_shard_list_expand(&list, spec, &error), SF_ENOENT);
  assert_string_equal(error.url, spec + 1);
  expect_error("a.tar::@", SF_EINVAL, "\"@\"", "column 2");

  char *path = write_file("bad.txt", "ok-{1..2}.tar\n# fine\n  bad-{1..3.tar\n");
  snprintf(spec, sizeof spec, "@%s", path);
  expect_error(spec, SF_EINVAL, "\"bad-{1..3.tar\"", "column 5");
  assert_int_equal(sf_shard_list_expand(&list, spec, &error), SF_EINVAL);
  assert_string_equal(error.url, path);
  assert_int_equal(error.line, 3);
  assert_non_null(strstr(error.message, "line 3 of"));

  path = write_file("nested.txt", "a.tar\n@other.txt\n");
  snprintf(spec, sizeof spec, "@%s", path);
  expect_error(spec, SF_EINVAL, "\"@other.txt\"", "cannot name another list file");
  assert_int_equal(sf_shard_list_expand(&list, spec, &error), SF_EINVAL);
  assert_int_equal(error.line, 2);
}

static int setup(void **state) {
  snprintf(dir, sizeof dir, "%s", "/tmp/sf-shard-list-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  const char *names[] = {"list.txt", "empty.txt", "bad.txt", "nested.txt"};
  char path[128];
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  return rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_padding),    cmocka_unit_test(test_countdown),
      cmocka_unit_test(test_lists),      cmocka_unit_test(test_products),   cmocka_unit_test(test_against_bash),
      cmocka_unit_test(test_joins_and_urls), cmocka_unit_test(test_list_file),
      cmocka_unit_test(test_errors),     cmocka_unit_test(test_list_file_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
