/* Unit tests of the shuffle stage alone (harness): permutations per epoch, seeds, buffer_size 1, initial fill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "graph.h"
#include "harness.h"

enum { MAX_OUT = 1024, END = -1 };

static sf_harness *new_shuffle(const char *buffer_size, const char *initial, uint64_t seed) {
  char a[64], b[64];
  snprintf(a, sizeof a, "buffer_size=%s", buffer_size);
  snprintf(b, sizeof b, "initial=%s", initial);
  const char *options[] = {a, b, NULL};
  sf_harness *h;
  sf_error error;
  memset(&error, 0, sizeof error);
  int r = sf_harness_new(&h, "shuffle", options, seed, 0, 0, 1, &error);
  if (r) fail_msg("harness: %s", error.message);
  return h;
}

/* Sample `id` of `epoch`; the id is also its index and is read back from the key. */
static void push_sample(sf_harness *h, int id, uint64_t epoch) {
  sf_sample *s = sf_sample_new();
  assert_non_null(s);
  char key[16];
  snprintf(key, sizeof key, "%d", id);
  assert_int_equal(sf_sample_set_key(s, key, strlen(key)), 0);
  s->epoch = epoch;
  s->index = (uint64_t)id;
  sf_item item = {.kind = SF_ITEM_SAMPLE, .epoch = epoch, .u.sample = s};
  sf_harness_push(h, &item);
}

static void push_epoch_end(sf_harness *h, uint64_t epoch) {
  sf_item item = {.kind = SF_ITEM_EPOCH_END, .epoch = epoch};
  sf_harness_push(h, &item);
}

/*
 * Drains the output into ids (END for an epoch marker) and checks every
 * sample's epoch against the markers seen so far. Returns the count.
 */
static int drain(sf_harness *h, int *ids, uint64_t first_epoch) {
  int n = 0;
  uint64_t epoch = first_epoch;
  sf_item item;
  while (sf_harness_pop(h, &item) == 0) {
    assert_true(n < MAX_OUT);
    if (item.kind == SF_ITEM_EPOCH_END) {
      assert_int_equal(item.epoch, epoch);
      epoch++;
      ids[n++] = END;
      continue;
    }
    assert_int_equal(item.kind, SF_ITEM_SAMPLE);
    assert_int_equal(item.u.sample->epoch, epoch);
    assert_int_equal(item.epoch, epoch);
    ids[n++] = atoi(item.u.sample->key);
    sf_item_clear(&item);
  }
  return n;
}

/* Runs `epochs` epochs of `per_epoch` samples (ids e*1000 + i) through a fresh shuffle. */
static int run_epochs(const char *buffer_size, const char *initial, uint64_t seed, int epochs, int per_epoch,
                      int *ids) {
  sf_harness *h = new_shuffle(buffer_size, initial, seed);
  for (int e = 0; e < epochs; e++) {
    for (int i = 0; i < per_epoch; i++) push_sample(h, e * 1000 + i, (uint64_t)e);
    push_epoch_end(h, (uint64_t)e);
  }
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  int n = drain(h, ids, 0);
  assert_int_equal(sf_harness_error_count(h), 0);
  sf_harness_destroy(&h);
  return n;
}

/*
 * The order as the stage's definition gives it, written out plainly: per epoch an rng seeded with
 * sf_seed_mix(node seed, epoch); each sample joins the buffer; past `initial` one leaves for every two
 * that join, and one for each that joins a full buffer; at the epoch's end the rest leave. The one that
 * leaves is at sf_rng_below(count), and the last takes its place.
 */
static int reference_order(uint64_t seed, int buffer_size, int initial, int epochs, int per_epoch, int *ids) {
  uint64_t node_seed = sf_graph_node_seed(seed, "shuffle");
  int buffer[MAX_OUT], count = 0, n = 0;
  for (int e = 0; e < epochs; e++) {
    sf_rng rng;
    sf_rng_seed(&rng, sf_seed_mix(node_seed, (uint64_t)e));
    uint64_t since_initial = 0;
    for (int i = 0; i <= per_epoch; i++) {
      bool end = i == per_epoch;
      if (!end) buffer[count++] = e * 1000 + i;
      while (count > 0 && (end || count >= buffer_size || (count >= initial && (++since_initial & 1)))) {
        uint64_t at = sf_rng_below(&rng, (uint64_t)count);
        ids[n++] = buffer[at];
        buffer[at] = buffer[--count];
        if (!end) break;
      }
    }
    ids[n++] = END;
  }
  return n;
}

/* The emissions drawn ahead (while the buffer is full and while it drains) are the definition's draws. */
static void test_order_matches_definition(void **state) {
  (void)state;
  int got[MAX_OUT], want[MAX_OUT];
  const struct { const char *size, *initial; int b, i; } cases[] = {{"16", "5", 16, 5}, {"16", "0", 16, 16},
                                                                      {"7", "0", 7, 7}, {"200", "0", 200, 200}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int n = run_epochs(cases[k].size, cases[k].initial, 11, 3, 150, got);
    assert_int_equal(n, reference_order(11, cases[k].b, cases[k].i, 3, 150, want));
    assert_memory_equal(got, want, (size_t)n * sizeof *got);
  }
}

static void test_permutation_per_epoch(void **state) {
  int ids[MAX_OUT];
  int n = run_epochs("16", "0", 7, 3, 100, ids);
  assert_int_equal(n, 3 * 101);
  for (int e = 0; e < 3; e++) {
    const int *seg = ids + e * 101;
    assert_int_equal(seg[100], END);
    bool seen[100] = {false};
    int moved = 0;
    for (int i = 0; i < 100; i++) {
      int id = seg[i] - e * 1000;
      assert_true(id >= 0 && id < 100); /* every sample stays within its epoch */
      assert_false(seen[id]);
      seen[id] = true;
      moved += id != i;
    }
    assert_true(moved > 50); /* actually shuffled */
  }
  /* Epochs use different permutations. */
  int same = 0;
  for (int i = 0; i < 100; i++) same += ids[i] == ids[101 + i] - 1000;
  assert_true(same < 50);
}

static void test_seeds(void **state) {
  int a[MAX_OUT], b[MAX_OUT], c[MAX_OUT];
  int na = run_epochs("32", "0", 1234, 2, 200, a);
  int nb = run_epochs("32", "0", 1234, 2, 200, b);
  int nc = run_epochs("32", "0", 1235, 2, 200, c);
  assert_int_equal(na, nb);
  assert_int_equal(na, nc);
  assert_memory_equal(a, b, (size_t)na * sizeof a[0]);
  int differ = 0;
  for (int i = 0; i < na; i++) differ += a[i] != c[i];
  assert_true(differ > na / 2);
}

static void test_buffer_size_one_keeps_order(void **state) {
  int ids[MAX_OUT];
  int n = run_epochs("1", "0", 99, 2, 50, ids);
  assert_int_equal(n, 2 * 51);
  for (int e = 0; e < 2; e++) {
    for (int i = 0; i < 50; i++) assert_int_equal(ids[e * 51 + i], e * 1000 + i);
    assert_int_equal(ids[e * 51 + 50], END);
  }
}

/* Nothing leaves before `initial` samples are in; every sample leaves by the epoch's end. */
static void test_initial_fill(void **state) {
  int ids[MAX_OUT];
  sf_harness *h = new_shuffle("10", "5", 3);
  for (int i = 0; i < 4; i++) push_sample(h, i, 0);
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  assert_int_equal(drain(h, ids, 0), 0);
  push_sample(h, 4, 0);
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  int out = drain(h, ids, 0);
  assert_int_equal(out, 1);
  assert_true(ids[0] >= 0 && ids[0] < 5);
  push_sample(h, 5, 0);
  push_sample(h, 6, 0);
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  out += drain(h, ids + out, 0);
  push_epoch_end(h, 0); /* the end of the epoch empties the buffer, then the marker follows */
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  out += drain(h, ids + out, 0);
  assert_int_equal(out, 7 + 1);
  assert_int_equal(ids[7], END);
  sf_harness_destroy(&h);

  /* initial 0 means a full buffer first. */
  h = new_shuffle("6", "0", 3);
  for (int i = 0; i < 5; i++) push_sample(h, i, 0);
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  assert_int_equal(drain(h, ids, 0), 0);
  push_sample(h, 5, 0);
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  assert_int_equal(drain(h, ids, 0), 1);
  sf_harness_close_input(h); /* EOF without a marker drains too, with no marker */
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  assert_int_equal(drain(h, ids, 0), 5);
  for (int i = 0; i < 5; i++) assert_true(ids[i] != END);
  sf_harness_destroy(&h);
}

/* The buffer holds at most buffer_size samples, and a full buffer lets one out per one in. */
static void test_bounded_buffer(void **state) {
  int ids[MAX_OUT];
  sf_harness *h = new_shuffle("8", "0", 5);
  int out = 0;
  for (int i = 1; i <= 40; i++) {
    push_sample(h, i, 0);
    assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
    out += drain(h, ids, 0);
    int held = i - out;
    assert_true(held <= 8);
    if (i >= 8) assert_true(held >= 7);
  }
  sf_harness_destroy(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_matches_definition), cmocka_unit_test(test_permutation_per_epoch),
      cmocka_unit_test(test_seeds),
      cmocka_unit_test(test_buffer_size_one_keeps_order),
      cmocka_unit_test(test_initial_fill),
      cmocka_unit_test(test_bounded_buffer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
