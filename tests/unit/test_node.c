/* The stage API beyond items: a node's log lines, its option errors and its own counters, through the harness. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "shardflow/shardflow.h"

typedef struct line {
  int level;
  char stage[64];
  char message[256];
} line;

static line lines[8];
static int n_lines;

static void keep(void *opaque, int level, const char *stage, const char *message) {
  if (n_lines == 8) return;
  line *l = &lines[n_lines++];
  l->level = level;
  snprintf(l->stage, sizeof l->stage, "%s", stage ? stage : "(null)");
  snprintf(l->message, sizeof l->message, "%s", message);
}

static int log_init(sf_node *node) {
  sf_node_log(node, SF_LOG_WARNING, "%d of %s clamped", 3, "ppm");
  sf_node_log(node, SF_LOG_INFO, "a plain line");
  sf_node_log(node, (sf_log_level)42, "a level the API does not have");
  return 0;
}

static const sf_stage_def logger = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "logger",
    .summary = "logs in init",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .init = log_init,
    .step = NULL,
};

/* Runs the logger's init with stderr sent to a file; returns what it printed (caller frees). */
static char *logged_to_stderr(void) {
  fflush(stderr);
  FILE *f = tmpfile();
  assert_non_null(f);
  int saved = dup(STDERR_FILENO);
  assert_true(dup2(fileno(f), STDERR_FILENO) >= 0);
  sf_harness *h;
  sf_error e;
  int r = sf_harness_new_def(&h, &logger, NULL, 1, 0, 0, 1, &e);
  fflush(stderr);
  assert_true(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  assert_int_equal(r, 0);
  sf_harness_destroy(&h);
  long size = ftell(f);
  char *text = calloc(1, (size_t)size + 1);
  assert_non_null(text);
  rewind(f);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  return text;
}

/* sf_node_log writes as the engine writes about a node: its name as the stage, the default's layout. */
static void test_node_log(void **state) {
  char *out = logged_to_stderr();
  assert_string_equal(out, "shardflow: logger: 3 of ppm clamped\n"
                           "shardflow: logger: a plain line\n"
                           "shardflow: logger: a level the API does not have\n");
  free(out);
  n_lines = 0;
  assert_int_equal(sf_log_set_handler(keep, NULL), 0);
  out = logged_to_stderr();
  assert_int_equal(sf_log_set_handler(NULL, NULL), 0);
  assert_string_equal(out, "");
  free(out);
  assert_int_equal(n_lines, 3);
  assert_int_equal(lines[0].level, SF_LOG_WARNING);
  assert_string_equal(lines[0].stage, "logger");
  assert_string_equal(lines[0].message, "3 of ppm clamped");
  assert_int_equal(lines[1].level, SF_LOG_INFO);
  assert_int_equal(lines[2].level, SF_LOG_WARNING); /* an unknown level is a warning */
}

static int option_init(sf_node *node) { return sf_node_option_error(node, "factor", "%g is too large", 1e9); }
static int wiring_init(sf_node *node) { return sf_node_option_error(node, NULL, "no option: the %s", "wiring"); }

/* An option error ends init under the skip policy too (sf_node_error returns 0 there), with one record. */
static void test_option_error(void **state) {
  sf_stage_def def = logger;
  def.init = option_init;
  sf_harness *h;
  sf_error e;
  memset(&e, 0, sizeof e);
  assert_int_equal(sf_harness_new_def(&h, &def, NULL, 1, 0, 0, 1, &e), SF_EOPTION); /* the harness skips */
  assert_null(h);
  assert_int_equal(e.code, SF_EOPTION);
  assert_string_equal(e.stage, "logger");
  assert_string_equal(e.message, "option factor: 1e+09 is too large");
  def.init = wiring_init;
  assert_int_equal(sf_harness_new_def(&h, &def, NULL, 1, 0, 0, 1, &e), SF_EOPTION);
  assert_string_equal(e.message, "no option: the wiring");
}

static int counter_results[16];

static int counter_init(sf_node *node) {
  int *r = counter_results;
  *r++ = sf_node_counter_add(node, "clamped", 0);
  *r++ = sf_node_counter_add(node, "clamped", 5);
  *r++ = sf_node_counter_add(node, "", 1);
  *r++ = sf_node_counter_add(node, NULL, 1);
  *r++ = sf_node_counter_add(node, "Clamped", 1);   /* upper case */
  *r++ = sf_node_counter_add(node, "9lives", 1);    /* a digit first */
  *r++ = sf_node_counter_add(node, "two words", 1); /* a blank: one word of the stage table */
  *r++ = sf_node_counter_add(node, "a_name_of_exactly_thirty_two_by", 1); /* 31 bytes */
  *r++ = sf_node_counter_add(node, "a_name_of_exactly_thirty_two_byt", 1); /* 32 bytes */
  *r++ = sf_node_counter_add(node, "third", 1);
  *r++ = sf_node_counter_add(node, "fourth", 1);
  *r++ = sf_node_counter_add(node, "fifth", 1); /* one too many */
  *r++ = sf_node_counter_add(node, "third", 2); /* the known ones still count */
  return 0;
}

/* Counter names are checked and limited; the result says why nothing was counted. */
static void test_counter_names(void **state) {
  sf_stage_def def = logger;
  def.init = counter_init;
  sf_harness *h;
  sf_error e;
  assert_int_equal(sf_harness_new_def(&h, &def, NULL, 1, 0, 0, 1, &e), 0);
  const int want[] = {0, 0, SF_EINVAL, SF_EINVAL, SF_EINVAL, SF_EINVAL, SF_EINVAL, 0, SF_EINVAL, 0, 0, SF_ETOOBIG, 0};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) assert_int_equal(counter_results[i], want[i]);
  sf_harness_destroy(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_node_log),
      cmocka_unit_test(test_option_error),
      cmocka_unit_test(test_counter_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
