/* The log callback: records from a pipeline reach the handler, the default prints today's lines,
 * and swapping handlers waits for calls in flight (what a binding's exit relies on). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"
#include "shardflow/shardflow.h"

enum { MAX_RECORDS = 16 };

typedef struct record {
  int level;
  char stage[64];
  char message[1024];
} record;

typedef struct records {
  pthread_mutex_t lock;
  int n, dropped;
  record r[MAX_RECORDS];
} records;

static void keep(void *opaque, int level, const char *stage, const char *message) {
  records *rs = opaque;
  pthread_mutex_lock(&rs->lock);
  if (rs->n < MAX_RECORDS) {
    record *r = &rs->r[rs->n++];
    r->level = level;
    snprintf(r->stage, sizeof r->stage, "%s", stage ? stage : "(null)");
    snprintf(r->message, sizeof r->message, "%s", message);
  } else {
    rs->dropped++;
  }
  pthread_mutex_unlock(&rs->lock);
}

/* Runs fn with stderr sent to a file; returns what it printed (caller frees). */
static char *capture_stderr(void (*fn)(void)) {
  fflush(stderr);
  FILE *f = tmpfile();
  assert_non_null(f);
  int saved = dup(STDERR_FILENO);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(f), STDERR_FILENO) >= 0);
  fn();
  fflush(stderr);
  assert_true(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  long size = ftell(f);
  assert_true(size >= 0);
  char *text = calloc(1, (size_t)size + 1);
  assert_non_null(text);
  rewind(f);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  return text;
}

/* A shard of three samples whose second label is not a number: decode records it and skips the sample. */
static void test_bad_sample_reaches_handler(void **state) {
  char dir[] = "/tmp/sf-test-log-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char cmd[600], text[1024], shard[256];
  snprintf(cmd, sizeof cmd,
           "cd %s && printf 1 > 0.cls && printf seven > 1.cls && printf 3 > 2.cls && tar cf s.tar 0.cls 1.cls 2.cls",
           dir);
  assert_int_equal(system(cmd), 0);
  snprintf(shard, sizeof shard, "%s/s.tar", dir);
  snprintf(text, sizeof text,
           "error_policy: skip\nstages:\n  - type: shard_source\n    urls: %s\n  - type: tar_split\n"
           "  - type: decode\n  - type: batch\n    batch_size: 8\n  - type: device_sink\n",
           shard);
  records rs = {.lock = PTHREAD_MUTEX_INITIALIZER};
  assert_int_equal(sf_log_set_handler(keep, &rs), 0);

  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g, text, "log.yaml", &e), 0);
  sf_pipeline *p;
  assert_int_equal(sf_pipeline_new(&p, g, NULL, &e), 0);
  sf_graph_destroy(&g);
  sf_batch *b;
  assert_int_equal(sf_pipeline_next(p, &b, 10.0), 0);
  assert_int_equal(b->size, 2); /* the two good samples */
  sf_batch_destroy(&b);
  assert_int_equal(sf_pipeline_next(p, &b, 10.0), SF_EOF);
  assert_int_equal(sf_pipeline_skipped(p), 1);
  sf_pipeline_destroy(&p);
  assert_int_equal(sf_log_set_handler(NULL, NULL), 0);

  assert_int_equal(rs.n, 1);
  assert_int_equal(rs.r[0].level, SF_LOG_ERROR);
  assert_string_equal(rs.r[0].stage, "decode");
  /* the message names the shard, the byte offset and the key; the stage is its own argument */
  assert_ptr_equal(strstr(rs.r[0].message, shard), rs.r[0].message);
  assert_non_null(strstr(rs.r[0].message, " @ byte 1024 (key 1): "));
  assert_non_null(strstr(rs.r[0].message, "seven"));
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void log_each_layout(void) {
  sf_log(SF_LOG_ERROR, "decode", "a.tar @ byte 512 (key 1): bad label");
  sf_log(SF_LOG_WARNING, NULL, "tcp://127.0.0.1:5555: refused a NULL client");
  sf_log(SF_LOG_INFO, "", "an empty stage is no stage");
  sf_log(SF_LOG_INFO | SF_LOG_UNPREFIXED, "tar_split", "downloaded 2 shard(s)");
  sf_log(SF_LOG_INFO | SF_LOG_UNPREFIXED, NULL, "shardflow worker w1: joined ipc://x");
}

/* The default handler prints the lines the library printed before there was a handler. */
static void test_default_lines(void **state) {
  char *out = capture_stderr(log_each_layout);
  assert_string_equal(out, "shardflow: error: decode: a.tar @ byte 512 (key 1): bad label\n"
                           "shardflow: tcp://127.0.0.1:5555: refused a NULL client\n"
                           "shardflow: an empty stage is no stage\n"
                           "tar_split: downloaded 2 shard(s)\n"
                           "shardflow worker w1: joined ipc://x\n");
  free(out);

  /* a handler sees the level without the layout flag, and "" as no stage */
  records rs = {.lock = PTHREAD_MUTEX_INITIALIZER};
  assert_int_equal(sf_log_set_handler(keep, &rs), 0);
  out = capture_stderr(log_each_layout);
  assert_int_equal(sf_log_set_handler(NULL, NULL), 0);
  assert_string_equal(out, "");
  free(out);
  assert_int_equal(rs.n, 5);
  assert_int_equal(rs.r[0].level, SF_LOG_ERROR);
  assert_int_equal(rs.r[1].level, SF_LOG_WARNING);
  assert_string_equal(rs.r[1].stage, "(null)");
  assert_string_equal(rs.r[2].stage, "(null)");
  assert_int_equal(rs.r[3].level, SF_LOG_INFO);
  assert_string_equal(rs.r[3].stage, "tar_split");
  assert_string_equal(rs.r[3].message, "downloaded 2 shard(s)");
}

static int reentry_result = 1;

static void reenter(void *opaque, int level, const char *stage, const char *message) {
  reentry_result = sf_log_set_handler(NULL, NULL);       /* would wait for itself */
  sf_log(SF_LOG_INFO, "inner", "logged from a handler"); /* to stderr, not back here */
}

static void log_once(void) { sf_log(SF_LOG_WARNING, "outer", "first"); }

/* A handler cannot swap handlers (it would wait for itself), and what it logs goes to the default. */
static void test_handler_reentry(void **state) {
  assert_int_equal(sf_log_set_handler(reenter, NULL), 0);
  char *out = capture_stderr(log_once);
  assert_int_equal(reentry_result, SF_EINVAL);
  assert_string_equal(out, "shardflow: inner: logged from a handler\n");
  free(out);
  assert_int_equal(sf_log_set_handler(NULL, NULL), 0);
}

static atomic_int slow_state; /* 0 idle, 1 inside the handler, 2 returned */

static void slow(void *opaque, int level, const char *stage, const char *message) {
  atomic_store(&slow_state, 1);
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  atomic_store(&slow_state, 2);
}

static void *log_from_thread(void *arg) {
  sf_log(SF_LOG_INFO, "remote", "from another thread");
  return NULL;
}

/* sf_log_set_handler returns only once the old handler's calls have returned (a binding's exit). */
static void test_set_waits_for_calls_in_flight(void **state) {
  assert_int_equal(sf_log_set_handler(slow, NULL), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, log_from_thread, NULL), 0);
  while (atomic_load(&slow_state) == 0)
    sched_yield();
  assert_int_equal(sf_log_set_handler(NULL, NULL), 0);
  assert_int_equal(atomic_load(&slow_state), 2);
  pthread_join(t, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_sample_reaches_handler),
      cmocka_unit_test(test_default_lines),
      cmocka_unit_test(test_handler_reentry),
      cmocka_unit_test(test_set_waits_for_calls_in_flight),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
