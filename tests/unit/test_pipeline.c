/* Pipelines through the public API: next() with a timeout, destroy while a source hangs, an
 * epoch quota that can never be met failing instead of spinning, stop() from another thread, and
 * a run that fails with a timeout of its own told from next()'s. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "shardflow/shardflow.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static sf_pipeline *start(const char *graph_text) {
  sf_graph *g;
  sf_error e;
  int r = sf_graph_load_string(&g, graph_text, "test.yaml", &e);
  if (r < 0) fail_msg("graph: %s", e.message);
  sf_pipeline *p;
  r = sf_pipeline_new(&p, g, NULL, &e);
  sf_graph_destroy(&g);
  if (r < 0) fail_msg("pipeline: %s", e.message);
  return p;
}

/* A pipe: source that never writes: next() times out, and destroy does not wait for the command. */
static void test_destroy_while_source_hangs(void **state) {
  sf_pipeline *p = start("error_policy: skip\n"
                         "stages:\n"
                         "  - type: shard_source\n"
                         "    urls: 'pipe:sleep 30'\n"
                         "    allow_pipe: true\n"
                         "  - type: tar_split\n"
                         "  - type: batch\n"
                         "    batch_size: 2\n"
                         "  - type: device_sink\n");
  sf_batch *b;
  double t = now();
  assert_int_equal(sf_pipeline_next(p, &b, 0.3), SF_ETIMEDOUT);
  assert_null(b);
  assert_true(now() - t >= 0.25 && now() - t < 5);
  t = now();
  sf_pipeline_destroy(&p);
  assert_null(p);
  assert_true(now() - t < 3.0); /* the reader gives up within ~100 ms of the stop */
}

/* samples_per_epoch with shards that yield nothing: an error, not an endless search for samples. */
static void test_unreachable_quota_fails(void **state) {
  sf_pipeline *p = start("error_policy: skip\n"
                         "stages:\n"
                         "  - type: shard_source\n"
                         "    urls: /nonexistent/shard-{0..3}.tar\n"
                         "    samples_per_epoch: 100\n"
                         "  - type: tar_split\n"
                         "  - type: batch\n"
                         "  - type: device_sink\n");
  sf_batch *b;
  int r = sf_pipeline_next(p, &b, 10.0);
  assert_int_equal(r, SF_ENOENT);
  sf_error e;
  assert_true(sf_pipeline_last_error(p, &e));
  assert_non_null(strstr(e.message, "samples_per_epoch"));
  assert_true(sf_pipeline_error_count(p) >= 4); /* the four missing shards were recorded too */
  sf_pipeline_destroy(&p);
}

/* Options from the API override the environment; a bad rank is refused with the reason. */
static void test_rank_checks(void **state) {
  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g,
                                        "stages:\n  - type: shard_source\n    urls: x-{0..3}.tar\n"
                                        "  - type: tar_split\n  - type: batch\n  - type: device_sink\n",
                                        "rank.yaml", &e),
                   0);
  sf_pipeline_options o;
  sf_pipeline_options_init(&o);
  o.rank = 5;
  o.world_size = 2;
  sf_pipeline *p;
  assert_int_equal(sf_pipeline_new(&p, g, &o, &e), SF_EOPTION);
  assert_null(p);
  assert_non_null(strstr(e.message, "rank 5"));
  setenv("RANK", "abc", 1);
  sf_pipeline_options_init(&o);
  assert_int_equal(sf_pipeline_new(&p, g, &o, &e), SF_EOPTION);
  assert_non_null(strstr(e.message, "RANK"));
  unsetenv("RANK");
  sf_graph_destroy(&g);
}

/* The pollable descriptor: silent while nothing is ready, readable when a batch is, and the step count. */
static void test_poll_fd(void **state) {
  char dir[] = "/tmp/sf-test-poll-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char shard[256], cmd[600];
  snprintf(shard, sizeof shard, "%s/s.tar", dir);
  /* three samples with a 1-byte cls field each, written by GNU tar */
  snprintf(cmd, sizeof cmd, "cd %s && printf 1 > 0.cls && printf 2 > 1.cls && printf 3 > 2.cls && tar cf s.tar 0.cls 1.cls 2.cls",
           dir);
  assert_int_equal(system(cmd), 0);
  char text[1024];
  snprintf(text, sizeof text,
           "stages:\n  - type: shard_source\n    urls: %s\n  - type: tar_split\n  - type: decode\n"
           "  - type: batch\n    batch_size: 2\n  - type: device_sink\n",
           shard);
  sf_pipeline *p = start(text);
  int fd = sf_pipeline_fd(p);
  assert_true(fd >= 0);
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  assert_int_equal(poll(&pfd, 1, 5000), 1); /* the first batch arrives */
  sf_batch *b;
  assert_int_equal(sf_pipeline_next(p, &b, 0), 0);
  assert_int_equal(b->size, 2);
  assert_int_equal(sf_pipeline_step(p), 1);
  sf_batch_destroy(&b);
  assert_int_equal(poll(&pfd, 1, 5000), 1); /* the short last batch */
  assert_int_equal(sf_pipeline_next(p, &b, 0), 0);
  assert_int_equal(b->size, 1);
  sf_batch_destroy(&b);
  assert_int_equal(poll(&pfd, 1, 5000), 1); /* the epoch end */
  assert_int_equal(sf_pipeline_next(p, &b, 0), SF_EOF);
  assert_int_equal(sf_pipeline_step(p), 0);
  assert_int_equal(sf_pipeline_epoch(p), 1);
  sf_pipeline_destroy(&p);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);

  /* a source that never delivers: the descriptor stays quiet */
  p = start("stages:\n  - type: shard_source\n    urls: 'pipe:sleep 30'\n    allow_pipe: true\n"
            "  - type: tar_split\n  - type: batch\n  - type: device_sink\n");
  pfd.fd = sf_pipeline_fd(p);
  assert_int_equal(poll(&pfd, 1, 200), 0);
  sf_pipeline_destroy(&p);
}

/* pin_memory: pinned batches on a GPU host; elsewhere a start-up error that says what is missing. */
static void test_pin_memory(void **state) {
  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g,
                                        "stages:\n  - type: shard_source\n    urls: x.tar\n  - type: tar_split\n"
                                        "  - type: batch\n    pin_memory: true\n  - type: device_sink\n",
                                        "pin.yaml", &e),
                   0);
  sf_pipeline *p;
  int r = sf_pipeline_new(&p, g, NULL, &e);
  if (r == 0) {
    sf_pipeline_destroy(&p); /* a host with a GPU and the CUDA runtime */
  } else {
    assert_int_equal(r, SF_EUNSUPPORTED);
    assert_non_null(strstr(e.message, "pin_memory"));
    assert_int_equal(e.line, 5);
    assert_null(p);
  }
  sf_graph_destroy(&g);
}

static void *stop_later(void *arg) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  sf_pipeline_stop(arg);
  return NULL;
}

/* stop() from another thread wakes a next() waiting for ever: it and every later call return
 * SF_ECANCELED (not a failure), the descriptor turns readable, and destroy follows at once. */
static void test_stop_wakes_next(void **state) {
  sf_pipeline *p = start("stages:\n  - type: shard_source\n    urls: 'pipe:sleep 30'\n    allow_pipe: true\n"
                         "  - type: tar_split\n  - type: batch\n  - type: device_sink\n");
  struct pollfd pfd = {.fd = sf_pipeline_fd(p), .events = POLLIN};
  assert_int_equal(poll(&pfd, 1, 0), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, stop_later, p), 0);
  sf_batch *b;
  double t0 = now();
  assert_int_equal(sf_pipeline_next(p, &b, -1), SF_ECANCELED);
  assert_null(b);
  assert_true(now() - t0 >= 0.25 && now() - t0 < 3);
  pthread_join(t, NULL);
  assert_int_equal(sf_pipeline_failed(p), 0);
  assert_int_equal(poll(&pfd, 1, 0), 1);
  t0 = now();
  assert_int_equal(sf_pipeline_next(p, &b, 5), SF_ECANCELED);
  assert_true(now() - t0 < 0.5);
  sf_pipeline_stop(p); /* again: nothing more happens */
  sf_pipeline_destroy(&p);
  sf_pipeline_stop(NULL);
}

/* A download that stalls under error_policy: fail stops the run with SF_ETIMEDOUT, the code next()
 * also returns when its own wait runs out: sf_pipeline_failed() is 0 for the latter, the code then. */
static void test_failed_with_timeout(void **state) {
  int server = socket(AF_INET, SOCK_STREAM, 0); /* accepts connections (the backlog) and never answers */
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  assert_int_equal(bind(server, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(server, 16), 0);
  assert_int_equal(getsockname(server, (struct sockaddr *)&addr, &len), 0);
  char text[512];
  snprintf(text, sizeof text,
           "error_policy: fail\nstages:\n  - type: shard_source\n    urls: http://127.0.0.1:%d/s.tar\n"
           "  - type: tar_split\n    stall_timeout: 1s\n    connect_timeout: 1s\n    retries: 0\n"
           "  - type: batch\n  - type: device_sink\n",
           ntohs(addr.sin_port));
  sf_pipeline *p = start(text);
  sf_batch *b;
  assert_int_equal(sf_pipeline_next(p, &b, 0.1), SF_ETIMEDOUT); /* the wait ran out; the run goes on */
  assert_int_equal(sf_pipeline_failed(p), 0);
  double t0 = now();
  int r;
  while ((r = sf_pipeline_next(p, &b, 0.1)) == SF_ETIMEDOUT && !sf_pipeline_failed(p) && now() - t0 < 20) {
  }
  assert_int_equal(r, SF_ETIMEDOUT);
  assert_int_equal(sf_pipeline_failed(p), SF_ETIMEDOUT);
  sf_error e;
  assert_true(sf_pipeline_last_error(p, &e));
  assert_int_equal(e.code, SF_ETIMEDOUT);
  assert_non_null(strstr(e.message, "stall_timeout"));
  sf_pipeline_destroy(&p);
  close(server);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_destroy_while_source_hangs),
      cmocka_unit_test(test_unreachable_quota_fails),
      cmocka_unit_test(test_rank_checks),
      cmocka_unit_test(test_poll_fd),
      cmocka_unit_test(test_pin_memory),
      cmocka_unit_test(test_stop_wakes_next),
      cmocka_unit_test(test_failed_with_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
