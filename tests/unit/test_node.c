/* The stage API beyond items: a node's log lines, option errors, own counters (through the harness); sf_shard's reading. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

static double harness_elapsed = -2, harness_trainer = -2;

static int log_init(sf_node *node) {
  sf_node_log(node, SF_LOG_WARNING, "%d of %s clamped", 3, "ppm");
  sf_node_log(node, SF_LOG_INFO, "a plain line");
  sf_node_log(node, (sf_log_level)42, "a level the API does not have");
  sf_node_log(node, SF_LOG_INFO | SF_LOG_UNPREFIXED, "an account of its own");
  harness_elapsed = sf_node_elapsed(node);
  harness_trainer = sf_node_trainer_wait(node);
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
                           "shardflow: logger: a level the API does not have\n"
                           "logger: an account of its own\n");
  free(out);
  n_lines = 0;
  assert_int_equal(sf_log_set_handler(keep, NULL), 0);
  out = logged_to_stderr();
  assert_int_equal(sf_log_set_handler(NULL, NULL), 0);
  assert_string_equal(out, "");
  free(out);
  assert_int_equal(n_lines, 4);
  assert_int_equal(lines[0].level, SF_LOG_WARNING);
  assert_string_equal(lines[0].stage, "logger");
  assert_string_equal(lines[0].message, "3 of ppm clamped");
  assert_int_equal(lines[1].level, SF_LOG_INFO);
  assert_int_equal(lines[2].level, SF_LOG_WARNING); /* an unknown level is a warning */
  assert_int_equal(lines[3].level, SF_LOG_INFO);    /* a handler gets the level without the flag */
  assert_string_equal(lines[3].message, "an account of its own");
  /* Outside a pipeline (the harness): no clock to read, no trainer. */
  assert_true(harness_elapsed == 0);
  assert_true(harness_trainer < 0);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* sf_shard's reading instructions through its accessors: what a source sets is what a splitter reads. */
static void test_shard_reading(void **state) {
  sf_shard *shard = sf_shard_new("a.tar");
  assert_non_null(shard);
  assert_false(sf_shard_allow_pipe(shard));
  assert_int_equal(sf_shard_set_allow_pipe(shard, true), 0);
  assert_true(sf_shard_allow_pipe(shard));
  for (uint64_t i = 0; i < 20; i++) assert_true(sf_shard_keeps(shard, i)); /* no list: every sample */
  uint64_t want[] = {9, 2, 5, 17, 0};
  uint64_t *keep = malloc(sizeof want);
  assert_non_null(keep);
  memcpy(keep, want, sizeof want);
  assert_int_equal(sf_shard_set_keep(shard, keep, 5), 0); /* taken, in any order */
  qsort(want, 5, sizeof *want, cmp_u64);
  for (uint64_t i = 0; i < 20; i++)
    assert_int_equal(sf_shard_keeps(shard, i), bsearch(&i, want, 5, sizeof *want, cmp_u64) != NULL);
  sf_shard_range r;
  assert_false(sf_shard_range_of(shard, &r));
  assert_int_equal(r.length, 0);
  char etag[] = "\"v1\"", index[] = "/idx/a.tar.sfidx";
  sf_shard_range set = {.offset = 1024, .length = 3072, .first_sample = 4, .samples = 2, .etag = etag, .index = index};
  assert_int_equal(sf_shard_set_range(shard, &(sf_shard_range){.offset = 1, .length = 0}), SF_EINVAL);
  assert_int_equal(sf_shard_set_range(shard, &set), 0);
  etag[1] = 'x', index[1] = 'x'; /* copied */
  assert_true(sf_shard_range_of(shard, &r));
  assert_true(r.offset == 1024 && r.length == 3072 && r.first_sample == 4 && r.samples == 2);
  assert_string_equal(r.etag, "\"v1\"");
  assert_string_equal(r.index, "/idx/a.tar.sfidx");
  sf_shard_destroy(&shard);
  assert_null(shard);
  /* A shard a stage laid out itself has no reading: the defaults, and setters refuse (taking keep). */
  sf_shard own = {.url = "b.tar"};
  assert_false(sf_shard_allow_pipe(&own));
  assert_true(sf_shard_keeps(&own, 3));
  assert_false(sf_shard_range_of(&own, &r));
  assert_int_equal(sf_shard_set_allow_pipe(&own, true), SF_EINVAL);
  assert_int_equal(sf_shard_set_keep(&own, malloc(8), 1), SF_EINVAL);
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
      cmocka_unit_test(test_shard_reading),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
