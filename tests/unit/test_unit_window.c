/* Unit tests of a group's unit window alone: order, reassignment, duplicate drop, window shrink, late hand-on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit_window.h"
#include "shardflow/error.h"
#include "shardflow/tensor.h"

enum { A, B, C }; /* workers, in the order they join */

/* Sample `index` of shard `shard` with one field of `bytes` bytes (a header only: the window counts, never reads). */
static sf_sample *sample(uint64_t shard, uint64_t index, int64_t bytes) {
  sf_sample *s = sf_sample_new();
  assert_non_null(s);
  s->shard_index = shard;
  s->index = index;
  if (bytes > 0) {
    sf_tensor t;
    assert_int_equal(sf_tensor_set_shape(&t, SF_DTYPE_UINT8, 1, &bytes), 0);
    assert_non_null(sf_sample_add_field(s, "bin", false, &t));
  }
  return s;
}

/* Appends a unit of samples first..first+n-1 of a shard; returns its id. */
static uint64_t add_unit(sf_unit_window *w, uint64_t shard, uint64_t first, int n) {
  sf_sample *s[64];
  for (int i = 0; i < n; i++) s[i] = sample(shard, first + (uint64_t)i, 0);
  uint64_t id = w->next_id;
  assert_int_equal(sf_unit_window_add(w, s, n), 0);
  return id;
}

/* A worker's result: copies of samples first..first+n-1 (what a worker sends back), each of `bytes` bytes. */
typedef struct result {
  sf_sample *s[64];
  int n;
} result;

static result answer(uint64_t shard, uint64_t first, int n, int64_t bytes) {
  result r = {.n = n};
  for (int i = 0; i < n; i++) r.s[i] = sample(shard, first + (uint64_t)i, bytes);
  return r;
}

/* Frees what the window did not take. */
static void result_clear(result *r) {
  for (int i = 0; i < r->n; i++) sf_sample_destroy(&r->s[i]);
}

static sf_unit_answer send_result(sf_unit_window *w, int wi, uint64_t id, result *r, double now) {
  sf_unit *u;
  sf_unit_answer a = sf_unit_window_result(w, wi, id, r->s, r->n, now, &u);
  assert_true((a == SF_UNIT_TAKEN) == (u != NULL));
  return a;
}

static sf_unit_window *window_with_workers(int64_t window, int workers, uint32_t credits) {
  sf_unit_window *w;
  assert_int_equal(sf_unit_window_new(window, 1 << 30, 4, 8, &w), 0);
  for (int i = 0; i < workers; i++) {
    assert_int_equal(sf_unit_window_join(w), i);
    sf_unit_window_credit(w, i, credits);
  }
  return w;
}

/* Sends the oldest pending unit to the worker the window chooses; returns that worker. */
static int dispatch_one(sf_unit_window *w, uint64_t id, double now) {
  sf_unit *u = sf_unit_window_find(w, id);
  assert_non_null(u);
  assert_int_equal(u->state, SF_UNIT_PENDING);
  int wi = sf_unit_window_choose(w);
  assert_true(wi >= 0);
  sf_unit_window_sent(w, u, wi, now);
  return wi;
}

/* Results arriving in any order leave the units, and the epoch markers between them, in input order. */
static void test_order_kept(void **state) {
  sf_unit_window *w = window_with_workers(8, 3, 4);
  uint64_t u0 = add_unit(w, 0, 0, 4), u1 = add_unit(w, 0, 4, 4);
  assert_int_equal(sf_unit_window_add_marker(w, 0), 0);
  uint64_t u2 = add_unit(w, 1, 0, 2);
  assert_int_equal(w->count, 4);
  assert_int_equal(dispatch_one(w, u0, 1), A);
  assert_int_equal(dispatch_one(w, u1, 1), B);
  assert_int_equal(dispatch_one(w, u2, 1), C);
  result r2 = answer(1, 0, 2, 0), r1 = answer(0, 4, 4, 0), r0 = answer(0, 0, 4, 0);
  assert_int_equal(send_result(w, C, u2, &r2, 2), SF_UNIT_TAKEN);
  assert_int_equal(send_result(w, B, u1, &r1, 2), SF_UNIT_TAKEN);
  assert_int_equal(sf_unit_window_at(w, 0)->state, SF_UNIT_AT_WORKER); /* the oldest is still out: nothing leaves */
  assert_int_equal(send_result(w, A, u0, &r0, 2), SF_UNIT_TAKEN);
  const uint64_t want_shard[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  const uint64_t want_index[] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1};
  int n = 0, markers = 0;
  while (w->count > 0) {
    sf_unit *u = sf_unit_window_at(w, 0);
    if (u->state == SF_UNIT_MARKER) {
      assert_int_equal(n, 8); /* between shard 0's units and shard 1's */
      assert_int_equal(u->epoch, 0);
      markers++;
    } else {
      assert_int_equal(u->state, SF_UNIT_DONE);
      for (int i = 0; i < u->n_out; i++, n++) {
        assert_int_equal(u->out[i]->shard_index, want_shard[n]);
        assert_int_equal(u->out[i]->index, want_index[n]);
      }
    }
    sf_unit_window_pop(w);
  }
  assert_int_equal(n, 10);
  assert_int_equal(markers, 1);
  assert_int_equal(w->duplicates, 0);
  sf_unit_window_destroy(&w);
  assert_null(w);
}

/*
 * The first result of a unit is passed on, any later one is dropped and
 * counted: the second copy of a late unit, a resend, a result for a unit that
 * has already left the window.  Without the duplicate check the second copy
 * reaches the trainer twice (or replaces the first).
 */
static void test_duplicate_result_dropped(void **state) {
  sf_unit_window *w = window_with_workers(8, 2, 4);
  uint64_t id = add_unit(w, 3, 0, 4);
  assert_int_equal(dispatch_one(w, id, 1), A);
  result first = answer(3, 0, 4, 0), again = answer(3, 0, 4, 0), after = answer(3, 0, 4, 0);
  assert_int_equal(send_result(w, A, id, &first, 2), SF_UNIT_TAKEN);
  sf_unit *u = sf_unit_window_find(w, id);
  sf_sample *kept = u->out[0];
  assert_int_equal(send_result(w, B, id, &again, 3), SF_UNIT_DUPLICATE); /* done: a second copy */
  assert_int_equal(w->duplicates, 1);
  assert_non_null(again.s[0]); /* not taken: still the caller's */
  assert_ptr_equal(u->out[0], kept);
  assert_int_equal(u->n_out, 4);
  sf_unit_window_pop(w);
  assert_int_equal(send_result(w, A, id, &after, 4), SF_UNIT_DUPLICATE); /* gone from the window */
  assert_int_equal(w->duplicates, 2);
  assert_int_equal(w->workers[A].credits, 4 - 1 + 2); /* one unit sent, two answers: each returns a credit */
  result_clear(&again);
  result_clear(&after);
  sf_unit_window_destroy(&w);
}

/* A result may leave samples out (skipped by the worker) but not add, repeat or reorder any. */
static void test_foreign_result_dropped(void **state) {
  sf_unit_window *w = window_with_workers(8, 1, 4);
  uint64_t id = add_unit(w, 0, 10, 3);
  dispatch_one(w, id, 1);
  result extra = answer(0, 10, 4, 0), other_shard = answer(1, 10, 3, 0);
  result reordered = {.n = 2, .s = {sample(0, 12, 0), sample(0, 10, 0)}};
  result repeated = {.n = 2, .s = {sample(0, 11, 0), sample(0, 11, 0)}};
  assert_int_equal(send_result(w, A, id, &extra, 2), SF_UNIT_FOREIGN);
  assert_int_equal(send_result(w, A, id, &other_shard, 2), SF_UNIT_FOREIGN);
  assert_int_equal(send_result(w, A, id, &reordered, 2), SF_UNIT_FOREIGN);
  assert_int_equal(send_result(w, A, id, &repeated, 2), SF_UNIT_FOREIGN);
  assert_int_equal(sf_unit_window_find(w, id)->state, SF_UNIT_AT_WORKER); /* still waiting for its own samples */
  result skipped_one = {.n = 2, .s = {sample(0, 10, 0), sample(0, 12, 0)}};
  assert_int_equal(send_result(w, A, id, &skipped_one, 2), SF_UNIT_TAKEN);
  assert_int_equal(sf_unit_window_find(w, id)->n_out, 2);
  assert_int_equal(w->duplicates, 0);
  result_clear(&extra);
  result_clear(&other_shard);
  result_clear(&reordered);
  result_clear(&repeated);
  sf_unit_window_destroy(&w);
}

/* A lost worker's units wait for the others, one attempt more each; a unit lost too often is skipped. */
static void test_reassignment(void **state) {
  sf_unit_window *w = window_with_workers(8, 2, 4);
  uint64_t u0 = add_unit(w, 0, 0, 4), u1 = add_unit(w, 0, 4, 4), u2 = add_unit(w, 0, 8, 4);
  assert_int_equal(dispatch_one(w, u0, 1), A);
  assert_int_equal(dispatch_one(w, u1, 1), B);
  assert_int_equal(dispatch_one(w, u2, 1), A);
  assert_false(sf_unit_window_has_pending(w));
  assert_int_equal(w->workers[A].in_flight, 2);
  assert_int_equal(sf_unit_window_leave(w, A), 2);
  assert_int_equal(sf_unit_window_leave(w, A), -1); /* once */
  assert_int_equal(w->reassigned, 2);
  assert_true(sf_unit_window_has_pending(w));
  assert_int_equal(sf_unit_window_find(w, u0)->attempts, 1);
  assert_int_equal(sf_unit_window_find(w, u1)->state, SF_UNIT_AT_WORKER);
  assert_int_equal(sf_unit_window_choose(w), B); /* the dead one gets nothing */
  /* the dead worker's answer still counts once */
  result late = answer(0, 8, 4, 0);
  assert_int_equal(send_result(w, -1, u2, &late, 2), SF_UNIT_TAKEN);
  /* u0 loses B too, then a third worker: skipped */
  assert_int_equal(dispatch_one(w, u0, 3), B);
  assert_int_equal(sf_unit_window_leave(w, B), 2);
  int c = sf_unit_window_join(w);
  assert_int_equal(c, A); /* the free slot is reused */
  sf_unit_window_credit(w, c, 1);
  assert_int_equal(dispatch_one(w, u0, 4), c);
  assert_int_equal(sf_unit_window_leave(w, c), 1);
  sf_unit *u = sf_unit_window_find(w, u0);
  assert_int_equal(u->attempts, SF_UNIT_MAX_ATTEMPTS);
  sf_unit_window_skip(w, u);
  assert_int_equal(u->state, SF_UNIT_DONE);
  assert_int_equal(u->n_out, 0);
  assert_null(u->in);
  sf_unit_window_destroy(&w);
}

/* Workers with credit take turns; one without credit is passed over; an answer returns its credit. */
static void test_round_robin(void **state) {
  sf_unit_window *w = window_with_workers(16, 3, 1);
  sf_unit_window_credit(w, A, 1);
  uint64_t id[6];
  for (int i = 0; i < 6; i++) id[i] = add_unit(w, 0, (uint64_t)i * 4, 4);
  assert_int_equal(dispatch_one(w, id[0], 1), A);
  assert_int_equal(dispatch_one(w, id[1], 1), B);
  assert_int_equal(dispatch_one(w, id[2], 1), C);
  assert_int_equal(dispatch_one(w, id[3], 1), A);
  assert_int_equal(sf_unit_window_choose(w), -1); /* no credit left anywhere */
  result r = answer(0, 4, 4, 0);
  assert_int_equal(send_result(w, B, id[1], &r, 2), SF_UNIT_TAKEN);
  assert_int_equal(dispatch_one(w, id[4], 2), B);
  assert_int_equal(sf_unit_window_join(w), 3);
  assert_int_equal(sf_unit_window_choose(w), -1); /* joined, but asked for nothing yet */
  sf_unit_window_destroy(&w);
}

/* Large results shrink the window so the head holds about buffer_size bytes; never below 2 units. */
static void test_window_shrinks(void **state) {
  sf_unit_window *w;
  assert_int_equal(sf_unit_window_new(16, 1 << 20, 4, 4, &w), 0);
  assert_int_equal(sf_unit_window_limit(w), 16);
  assert_int_equal(sf_unit_window_join(w), A);
  sf_unit_window_credit(w, A, 8);
  uint64_t small = add_unit(w, 0, 0, 4);
  dispatch_one(w, small, 1);
  result r = answer(0, 0, 4, 1024); /* 1 MiB / (4 samples x 1 KiB) = 256 units fit: the option holds */
  assert_int_equal(send_result(w, A, small, &r, 2), SF_UNIT_TAKEN);
  assert_int_equal(sf_unit_window_limit(w), 16);
  sf_unit_window_pop(w);
  /* 64 KiB samples: the average moves a tenth of the way, 1024 + 0.1 * (65536 - 1024) = 7475.2 bytes */
  uint64_t big = add_unit(w, 0, 4, 4);
  dispatch_one(w, big, 3);
  r = answer(0, 4, 4, 65536);
  assert_int_equal(send_result(w, A, big, &r, 4), SF_UNIT_TAKEN);
  assert_int_equal(sf_unit_window_limit(w), 16); /* 1 MiB / (4 x 7475.2) = 35 units: the option (16) holds */
  for (int i = 0; i < 40; i++) { /* the average converges on 64 KiB: 1 MiB / 256 KiB a unit = 4 units */
    sf_unit_window_pop(w);
    uint64_t id = add_unit(w, 0, 8, 4);
    dispatch_one(w, id, 5);
    r = answer(0, 8, 4, 65536);
    assert_int_equal(send_result(w, A, id, &r, 6), SF_UNIT_TAKEN);
  }
  assert_int_equal(sf_unit_window_limit(w), 4);
  sf_unit_window_pop(w);
  uint64_t huge = add_unit(w, 0, 12, 4);
  dispatch_one(w, huge, 7);
  r = answer(0, 12, 4, 64 << 20); /* one sample larger than the whole budget */
  assert_int_equal(send_result(w, A, huge, &r, 8), SF_UNIT_TAKEN);
  assert_int_equal(sf_unit_window_limit(w), 2);
  sf_unit_window_destroy(&w);
}

/* How long units take rises at once with a slow unit and falls slowly with fast ones. */
static void test_unit_seconds(void **state) {
  sf_unit_window *w = window_with_workers(8, 1, 8);
  uint64_t id = add_unit(w, 0, 0, 1);
  dispatch_one(w, id, 10);
  result r = answer(0, 0, 1, 0);
  send_result(w, A, id, &r, 10.5);
  assert_float_equal(w->unit_seconds, 0.5, 1e-9);
  sf_unit_window_pop(w);
  id = add_unit(w, 0, 1, 1);
  dispatch_one(w, id, 20);
  r = answer(0, 1, 1, 0);
  send_result(w, A, id, &r, 20.1);
  assert_float_equal(w->unit_seconds, 0.95 * 0.5 + 0.05 * 0.1, 1e-9);
  sf_unit_window_pop(w);
  id = add_unit(w, 0, 2, 1);
  dispatch_one(w, id, 30);
  r = answer(0, 2, 1, 0);
  send_result(w, A, id, &r, 32);
  assert_float_equal(w->unit_seconds, 2.0, 1e-9);
  sf_unit_window_destroy(&w);
}

/* Finishes a unit at worker wi that took `took` seconds, so the window knows what units take; it stays at `slot`. */
static void calibrate(sf_unit_window *w, int wi, double took, int slot) {
  uint64_t id = add_unit(w, 9, 0, 1);
  assert_int_equal(w->count, slot + 1);
  sf_unit_window_sent(w, sf_unit_window_find(w, id), wi, 1);
  sf_unit_window_credit(w, wi, 1);
  result r = answer(9, 0, 1, 0);
  assert_int_equal(send_result(w, wi, id, &r, 1 + took), SF_UNIT_TAKEN);
}

/*
 * A unit held longer than 4x what units take (1 s at least) goes to a second
 * worker, once; the late worker gets no more work while another answers in
 * time; whichever result comes first is kept, the other is a duplicate.
 */
static void test_late_unit_handed_on(void **state) {
  sf_unit_window *w = window_with_workers(8, 2, 4);
  uint64_t id = add_unit(w, 0, 0, 4);
  assert_int_equal(dispatch_one(w, id, 100), A);
  assert_null(sf_unit_window_next_late(w, 1000)); /* no unit finished yet: nothing to compare with */
  calibrate(w, B, 0.1, 1); /* units take 0.1 s: late after the 1 s floor, not after 0.4 s */
  assert_null(sf_unit_window_next_late(w, 101.0));
  sf_unit *u = sf_unit_window_next_late(w, 101.01);
  assert_non_null(u);
  assert_int_equal(u->id, id);
  assert_int_equal(u->state, SF_UNIT_PENDING);
  assert_int_equal(u->worker, A); /* who held it, for the log line */
  assert_true(w->workers[A].late);
  assert_int_equal(w->workers[A].in_flight, 0);
  assert_int_equal(w->reassigned, 1);
  assert_null(sf_unit_window_next_late(w, 101.01)); /* nothing else is late */
  assert_int_equal(sf_unit_window_choose(w), B); /* A owes a late unit: B gets it */
  assert_int_equal(dispatch_one(w, id, 101.02), B);
  assert_null(sf_unit_window_next_late(w, 500)); /* handed on once only */
  result slow = answer(0, 0, 4, 0), fast = answer(0, 0, 4, 0);
  assert_int_equal(send_result(w, A, id, &slow, 501), SF_UNIT_TAKEN); /* the first answer wins, late or not */
  assert_false(w->workers[A].late);                                    /* it answers after all */
  assert_int_equal(w->workers[B].in_flight, 0);                        /* B's copy is no longer awaited */
  assert_int_equal(send_result(w, B, id, &fast, 502), SF_UNIT_DUPLICATE);
  assert_int_equal(w->duplicates, 1);
  result_clear(&fast);
  sf_unit_window_destroy(&w);
}

/* The deadline follows what units take (4x), and a unit stays put when no other worker answers in time. */
static void test_late_needs_a_prompt_worker(void **state) {
  sf_unit_window *w = window_with_workers(8, 2, 4);
  calibrate(w, A, 2.0, 0); /* deadline 8 s */
  uint64_t u0 = add_unit(w, 0, 0, 4), u1 = add_unit(w, 0, 4, 4);
  assert_int_equal(dispatch_one(w, u0, 10), B);
  assert_int_equal(dispatch_one(w, u1, 10), A);
  assert_null(sf_unit_window_next_late(w, 18.0));
  assert_int_equal(sf_unit_window_next_late(w, 18.5)->id, u0); /* B late: A still prompt */
  assert_null(sf_unit_window_next_late(w, 18.5)); /* A's unit is late too, but B is late: nobody to hand it to */
  assert_int_equal(sf_unit_window_find(w, u1)->state, SF_UNIT_AT_WORKER);
  assert_int_equal(sf_unit_window_choose(w), A);
  /* with only late workers left, a late one still gets work rather than none */
  assert_int_equal(sf_unit_window_leave(w, A), 1);
  assert_int_equal(sf_unit_window_choose(w), B);
  sf_unit_window_destroy(&w);
}

/* The ring has room for a unit and a marker at the limit, and refuses more rather than overwrite. */
static void test_ring_full(void **state) {
  sf_unit_window *w;
  assert_int_equal(sf_unit_window_new(2, 1 << 20, 4, 1, &w), 0);
  add_unit(w, 0, 0, 1);
  add_unit(w, 0, 1, 1);
  add_unit(w, 0, 2, 1);
  assert_int_equal(sf_unit_window_add_marker(w, 0), 0);
  assert_int_equal(sf_unit_window_add_marker(w, 1), SF_ETOOBIG);
  sf_sample *s = sample(0, 3, 0);
  assert_int_equal(sf_unit_window_add(w, &s, 1), SF_ETOOBIG);
  sf_sample_destroy(&s);
  assert_int_equal(sf_unit_window_join(w), 0);
  assert_int_equal(sf_unit_window_join(w), -1); /* max_workers live */
  sf_unit_window_destroy(&w); /* frees the samples still in it (ASan checks) */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_kept),          cmocka_unit_test(test_duplicate_result_dropped),
      cmocka_unit_test(test_foreign_result_dropped), cmocka_unit_test(test_reassignment),
      cmocka_unit_test(test_round_robin),         cmocka_unit_test(test_window_shrinks),
      cmocka_unit_test(test_unit_seconds),        cmocka_unit_test(test_late_unit_handed_on),
      cmocka_unit_test(test_late_needs_a_prompt_worker), cmocka_unit_test(test_ring_full),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
