/* Queues: order, soft bound, close/EOF, epoch markers wake consumers, threads trading many items. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "queue.h"

static sf_item marker(uint64_t epoch) {
  sf_item it = {.kind = SF_ITEM_EPOCH_END, .epoch = epoch};
  return it;
}

static void test_order_and_close(void **state) {
  sf_queue q;
  assert_int_equal(sf_queue_init(&q, 4, 2, 1), 0);
  for (uint64_t i = 0; i < 10; i++) { /* past capacity: the ring grows (soft bound) */
    sf_item it = marker(i);
    sf_queue_push(&q, &it);
    assert_int_equal(it.kind, SF_ITEM_NONE);
    assert_int_equal(sf_queue_can_push(&q), i + 1 < 4);
  }
  sf_item out;
  for (uint64_t i = 0; i < 10; i++) {
    assert_int_equal(sf_queue_pop(&q, &out), 0);
    assert_int_equal(out.epoch, i);
  }
  assert_int_equal(sf_queue_pop(&q, &out), SF_EAGAIN);
  sf_queue_close(&q);
  assert_int_equal(sf_queue_pop(&q, &out), SF_EOF);
  sf_queue_destroy(&q);
}

static void test_wait_timeout(void **state) {
  sf_queue q;
  atomic_bool stop;
  atomic_init(&stop, false);
  sf_queue_init(&q, 8, 4, 1);
  assert_false(sf_queue_wait_readable(&q, &stop, 0.05)); /* nothing: times out */
  sf_item it = marker(0);
  sf_queue_push(&q, &it);
  assert_true(sf_queue_wait_readable(&q, &stop, 0.05)); /* a marker is enough, below wake_at */
  sf_queue_destroy(&q);
}

typedef struct ctx {
  sf_queue *q;
  uint64_t n;
  atomic_bool *stop;
} ctx;

static void *producer(void *arg) {
  ctx *c = arg;
  for (uint64_t i = 0; i < c->n; i++) {
    while (!sf_queue_can_push(c->q)) sf_queue_wait_writable(c->q, c->stop);
    sf_item it = marker(i);
    sf_queue_push(c->q, &it);
  }
  sf_queue_close(c->q);
  return NULL;
}

static void test_threads(void **state) {
  sf_queue q;
  atomic_bool stop;
  atomic_init(&stop, false);
  sf_queue_init(&q, 64, 16, 1);
  ctx c = {&q, 200000, &stop};
  pthread_t t;
  pthread_create(&t, NULL, producer, &c);
  uint64_t expect = 0;
  size_t max_seen = 0;
  for (;;) {
    sf_item out;
    int r = sf_queue_pop(&q, &out);
    if (r == SF_EOF) break;
    if (r == SF_EAGAIN) {
      sf_queue_wait_readable(&q, &stop, -1);
      continue;
    }
    assert_int_equal(out.epoch, expect);
    expect++;
    pthread_mutex_lock(&q.lock);
    if (q.count > max_seen) max_seen = q.count;
    pthread_mutex_unlock(&q.lock);
  }
  pthread_join(t, NULL);
  assert_int_equal(expect, c.n);
  assert_true(max_seen <= 64); /* the producer respected the bound */
  sf_queue_destroy(&q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_and_close),
      cmocka_unit_test(test_wait_timeout),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
