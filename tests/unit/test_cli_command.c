/* cli/command.c: a command's options table drives parsing (typed, defaults, repeats, flags), errors and --help. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/cli.h"

typedef struct args {
  sf_cli_list sets;
  int64_t count, size, untouched;
  double seconds;
  int format;
  const char *dir;
  bool quiet;
} args;

static const char *const formats[] = {"ppm", "png", NULL};

static const sf_cli_option table[] = {
    {.row = {"set", SF_OPT_STRING, offsetof(args, sets), .help = "an override"}, .value = "K=V", .repeat = true},
    {.row = {"count", SF_OPT_COUNT, offsetof(args, count), "100", 1, 4096, "how many"}, .value = "N"},
    {.row = {"size", SF_OPT_SIZE, offsetof(args, size), "1KiB", .help = "how big"}, .value = "BYTES"},
    {.row = {"untouched", SF_OPT_COUNT, offsetof(args, untouched), .help = "no default"}, .value = "N"},
    {.row = {"time", SF_OPT_DURATION, offsetof(args, seconds), "30s", .help = "how long"}, .value = "SECONDS"},
    {.row = {"format", SF_OPT_ENUM, offsetof(args, format), "ppm", .help = "image", .enum_names = formats},
     .value = "F"},
    {.row = {"dir", SF_OPT_STRING, offsetof(args, dir), ".", .help = "where"}, .value = "DIR"},
    {.row = {"quiet", SF_OPT_BOOL, offsetof(args, quiet), .help = "say less"}, .short_name = 'q'},
    {.row = {NULL}},
};

static int test_main(int argc, char **argv) { return argc && argv ? 0 : 1; }

static const sf_cli_command command = {
    .name = "test",
    .run = test_main,
    .args = "[OPTIONS] FILE",
    .summary = "a test command",
    .about = "About the test command.",
    .options = table,
    .notes = "Notes at the end.",
};

/* Parses the words of line (argv[0] "test" added); returns sf_cli_parse's result, status and first operand. */
static bool parse(const char *line, args *a, int *first, int *status) {
  static char buf[512];
  static char *argv[32];
  int argc = 0;
  snprintf(buf, sizeof buf, "test %s", line);
  for (char *w = strtok(buf, " "); w && argc < 31; w = strtok(NULL, " "))
    argv[argc++] = w;
  argv[argc] = NULL;
  *a = (args){.untouched = -1};
  return sf_cli_parse(&command, argc, argv, a, first, status);
}

/* What stmt writes to stderr, into the array buf. */
#define CAPTURE_STDERR(buf, stmt)                                                                                      \
  do {                                                                                                                 \
    fflush(stderr);                                                                                                    \
    FILE *tmp_ = tmpfile();                                                                                            \
    int saved_ = dup(2);                                                                                               \
    dup2(fileno(tmp_), 2);                                                                                             \
    stmt;                                                                                                              \
    fflush(stderr);                                                                                                    \
    dup2(saved_, 2);                                                                                                   \
    close(saved_);                                                                                                     \
    rewind(tmp_);                                                                                                      \
    size_t n_ = fread(buf, 1, sizeof buf - 1, tmp_);                                                                   \
    buf[n_] = '\0';                                                                                                    \
    fclose(tmp_);                                                                                                      \
  } while (0)

static void test_defaults_and_values(void **state) {
  (void)state;
  args a;
  int first, status;
  assert_true(parse("FILE", &a, &first, &status));
  assert_int_equal(a.count, 100);
  assert_int_equal(a.size, 1024);
  assert_int_equal(a.untouched, -1); /* no default: the command's own initial value stays */
  assert_true(a.seconds == 30);
  assert_string_equal(a.dir, ".");
  assert_false(a.quiet);
  assert_int_equal(a.sets.n, 0);
  assert_int_equal(first, 1);
  assert_true(parse("--count 2k --size=64MiB --time 250ms --format PNG -q FILE --dir /x --set a=1 --set b=2", &a,
                    &first, &status));
  assert_int_equal(a.count, 2000);
  assert_int_equal(a.size, 64 << 20);
  assert_true(a.seconds == 0.25);
  assert_int_equal(a.format, 1);
  assert_true(a.quiet);
  assert_string_equal(a.dir, "/x");
  assert_int_equal(a.sets.n, 2);
  assert_string_equal(a.sets.v[0], "a=1");
  assert_string_equal(a.sets.v[1], "b=2");
  assert_int_equal(first, 15); /* GNU order: the operand FILE moved behind the options, argv[15] */
  sf_cli_free(&command, &a);
  assert_null(a.sets.v);
}

static void test_usage_errors(void **state) {
  (void)state;
  static const struct {
    const char *line, *says;
  } bad[] = {
      {"--count abc FILE", "'abc' is not a count for --count"},
      {"--count 10k FILE", "out of range for --count: expected 1..4096"},
      {"--size 12parsecs FILE", "'12parsecs' is not a size for --size"},
      {"--time soon FILE", "'soon' is not a duration for --time"},
      {"--format gif FILE", "'gif' is not valid for --format: expected one of ppm|png"},
      {"--count", "--count needs a value: N"},
      {"--quiet=1 FILE", "--quiet takes no value"},
      {"--bogus FILE", "unknown option '--bogus'"},
      {"-z FILE", "unknown option '-z'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    args a;
    int first, status = -1;
    bool go = true;
    char err[2048];
    CAPTURE_STDERR(err, go = parse(bad[i].line, &a, &first, &status));
    sf_cli_free(&command, &a);
    assert_false(go);
    assert_int_equal(status, 2);
    if (!strstr(err, bad[i].says)) fail_msg("%s: expected \"%s\" in: %s", bad[i].line, bad[i].says, err);
    assert_non_null(strstr(err, "shardflow test: "));
    assert_non_null(strstr(err, "usage: shardflow test [OPTIONS] FILE"));
  }
}

static void test_help(void **state) {
  (void)state;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  sf_cli_print_help(f, &command);
  fclose(f);
  assert_non_null(strstr(text, "usage: shardflow test [OPTIONS] FILE\n\nAbout the test command.\n"));
  /* Every row, with its value's name and what the table knows of it. */
  assert_non_null(strstr(text, "  --set K=V "));
  assert_non_null(strstr(text, "(may be repeated)"));
  assert_non_null(strstr(text, "  --count N "));
  assert_non_null(strstr(text, "how many (count, default 100, 1..4096)\n"));
  assert_non_null(strstr(text, "how big (size, default 1KiB)\n"));
  assert_non_null(strstr(text, "  --untouched N "));
  assert_non_null(strstr(text, "how long (duration, default 30s)\n"));
  assert_non_null(strstr(text, "image (ppm|png, default ppm)\n"));
  assert_non_null(strstr(text, "  --dir DIR "));
  assert_non_null(strstr(text, "  -q, --quiet "));
  assert_non_null(strstr(text, "  -h, --help "));
  assert_non_null(strstr(text, "\nNotes at the end.\n"));
  free(text);
  /* --help prints that and stops the command with status 0. */
  args a;
  int first, status = -1;
  fflush(stdout);
  int saved = dup(1);
  FILE *null = fopen("/dev/null", "w");
  dup2(fileno(null), 1);
  bool go = parse("--count 5 --help FILE", &a, &first, &status);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  fclose(null);
  assert_false(go);
  assert_int_equal(status, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_and_values),
      cmocka_unit_test(test_usage_errors),
      cmocka_unit_test(test_help),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
