/* Unit tests of the shard_source stage under the harness: rank/worker shares, per-epoch shuffles, epochs. */
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

#define N_SHARDS 100
#define URLS "urls=s-{000..099}.tar"

/* What the test keeps of one output item. */
typedef struct rec {
  sf_item_kind kind;
  uint64_t epoch, index, pass, samples_per_epoch;
  bool allow_pipe;
} rec;

typedef struct out {
  rec *recs;
  size_t n;
  int result; /* what sf_harness_run returned */
} out;

static sf_harness *start(const char *const *options, uint64_t seed, uint64_t epochs, int rank,
                         int world_size) {
  sf_harness *h = NULL;
  sf_error error;
  memset(&error, 0, sizeof error);
  int r = sf_harness_new(&h, "shard_source", options, seed, epochs, rank, world_size, &error);
  if (r) fail_msg("shard_source init failed (%d): %s", r, error.message);
  assert_non_null(h);
  return h;
}

/* Runs up to max_steps steps (0 = until SF_EOF) and takes every item the stage produced. */
static out run(sf_harness *h, uint64_t max_steps) {
  out o = {NULL, 0, sf_harness_run(h, max_steps)};
  sf_item item;
  size_t cap = 0;
  while (sf_harness_pop(h, &item) == 0) {
    if (o.n == cap) {
      cap = cap ? cap * 2 : 256;
      o.recs = realloc(o.recs, cap * sizeof *o.recs);
      assert_non_null(o.recs);
    }
    rec *r = &o.recs[o.n++];
    memset(r, 0, sizeof *r);
    r->kind = item.kind;
    r->epoch = item.epoch;
    if (item.kind == SF_ITEM_SHARD) {
      const sf_shard *s = item.u.shard;
      assert_int_equal(s->epoch, item.epoch);
      r->index = s->index;
      r->pass = s->pass;
      r->samples_per_epoch = s->samples_per_epoch;
      r->allow_pipe = sf_shard_allow_pipe(s);
      /* The URL is the list's entry at index: printf is the reference for the expansion. */
      char want[32];
      snprintf(want, sizeof want, "s-%03llu.tar", (unsigned long long)s->index);
      assert_string_equal(s->url, want);
    } else {
      assert_int_equal(item.kind, SF_ITEM_EPOCH_END);
    }
    sf_item_clear(&item);
  }
  return o;
}

/* Runs a whole finite pipeline of one (rank, worker) and checks it ends with SF_EOF. */
static out run_all(const char *const *options, uint64_t seed, uint64_t epochs, int rank,
                   int world_size) {
  sf_harness *h = start(options, seed, epochs, rank, world_size);
  out o = run(h, 0);
  assert_int_equal(o.result, SF_EOF);
  sf_harness_destroy(&h);
  assert_null(h);
  return o;
}

/* The shard indices of epoch e, in order. Returns how many. */
static size_t epoch_order(const out *o, uint64_t e, uint64_t *order) {
  size_t n = 0;
  for (size_t i = 0; i < o->n; i++)
    if (o->recs[i].kind == SF_ITEM_SHARD && o->recs[i].epoch == e) order[n++] = o->recs[i].index;
  return n;
}

static bool is_permutation(const uint64_t *order, size_t n) {
  int seen[N_SHARDS] = {0};
  if (n != N_SHARDS) return false;
  for (size_t i = 0; i < n; i++)
    if (order[i] >= N_SHARDS || seen[order[i]]++) return false;
  return true;
}

static void test_shares_are_disjoint_and_cover(void **state) {
  for (int world = 1; world <= 5; world++) {
    for (int workers = 1; workers <= 3; workers++) {
      int seen[2][N_SHARDS] = {{0}};
      size_t smallest = SIZE_MAX, largest = 0;
      for (int rank = 0; rank < world; rank++) {
        for (int worker = 0; worker < workers; worker++) {
          char o_workers[32], o_worker[32], o_rank[32], o_world[32];
          snprintf(o_workers, sizeof o_workers, "workers=%d", workers);
          snprintf(o_worker, sizeof o_worker, "worker=%d", worker);
          snprintf(o_rank, sizeof o_rank, "rank=%d", rank);
          snprintf(o_world, sizeof o_world, "world_size=%d", world);
          /* Half the runs take rank and world size from options, half from the pipeline. */
          const char *with_rank[] = {URLS, o_workers, o_worker, o_rank, o_world, NULL};
          const char *without_rank[] = {URLS, o_workers, o_worker, NULL};
          out o = (rank + worker) % 2 ? run_all(with_rank, 7, 2, 0, 1)
                                      : run_all(without_rank, 7, 2, rank, world);
          /* Each epoch: its shards, then exactly one EPOCH_END, then the next epoch. */
          uint64_t epoch = 0;
          size_t per_epoch[2] = {0, 0};
          for (size_t i = 0; i < o.n; i++) {
            rec *r = &o.recs[i];
            assert_int_equal(r->epoch, epoch);
            if (r->kind == SF_ITEM_EPOCH_END) {
              epoch++;
              continue;
            }
            assert_int_equal(r->pass, 0);
            assert_int_equal(r->samples_per_epoch, 0);
            assert_false(r->allow_pipe);
            seen[r->epoch][r->index]++;
            per_epoch[r->epoch]++;
          }
          assert_int_equal(epoch, 2);
          assert_int_equal(per_epoch[0], per_epoch[1]);
          if (per_epoch[0] < smallest) smallest = per_epoch[0];
          if (per_epoch[0] > largest) largest = per_epoch[0];
          free(o.recs);
        }
      }
      for (int e = 0; e < 2; e++)
        for (int i = 0; i < N_SHARDS; i++)
          if (seen[e][i] != 1)
            fail_msg("world %d, workers %d, epoch %d: shard %d read %d times", world, workers, e,
                     i, seen[e][i]);
      /* Round-robin over one order: shares differ by at most one shard. */
      assert_true(largest - smallest <= 1);
    }
  }
}

static void test_order_follows_seed_and_epoch(void **state) {
  const char *options[] = {URLS, NULL};
  out a = run_all(options, 1, 2, 0, 1), b = run_all(options, 1, 2, 0, 1);
  out c = run_all(options, 2, 2, 0, 1);
  uint64_t a0[N_SHARDS], a1[N_SHARDS], b0[N_SHARDS], b1[N_SHARDS], c0[N_SHARDS];
  assert_int_equal(epoch_order(&a, 0, a0), N_SHARDS);
  assert_int_equal(epoch_order(&a, 1, a1), N_SHARDS);
  assert_int_equal(epoch_order(&b, 0, b0), N_SHARDS);
  assert_int_equal(epoch_order(&b, 1, b1), N_SHARDS);
  assert_int_equal(epoch_order(&c, 0, c0), N_SHARDS);
  assert_true(is_permutation(a0, N_SHARDS));
  assert_true(is_permutation(a1, N_SHARDS));
  assert_true(is_permutation(c0, N_SHARDS));

  uint64_t identity[N_SHARDS];
  for (int i = 0; i < N_SHARDS; i++) identity[i] = (uint64_t)i;
  assert_memory_not_equal(a0, identity, sizeof a0);        /* shuffled at all */
  assert_memory_not_equal(a0, a1, sizeof a0);              /* reshuffled each epoch */
  assert_memory_equal(a0, b0, sizeof a0);                  /* the same seed repeats */
  assert_memory_equal(a1, b1, sizeof a1);
  assert_memory_not_equal(a0, c0, sizeof a0);              /* another seed, another order */

  /* Every rank computes the same order: rank r of 3 reads positions r, r+3, ... of it. */
  for (int rank = 0; rank < 3; rank++) {
    const char *ranked[] = {URLS, NULL};
    out r = run_all(ranked, 1, 2, rank, 3);
    uint64_t got[N_SHARDS];
    for (uint64_t e = 0; e < 2; e++) {
      size_t n = epoch_order(&r, e, got);
      const uint64_t *full = e == 0 ? a0 : a1;
      assert_int_equal(n, (N_SHARDS - rank + 2) / 3);
      for (size_t i = 0; i < n; i++) assert_int_equal(got[i], full[rank + 3 * i]);
    }
    free(r.recs);
  }
  free(a.recs);
  free(b.recs);
  free(c.recs);
}

static void test_no_shuffle_keeps_list_order(void **state) {
  const char *options[] = {URLS, "shuffle=false", "rank=1", "world_size=4", "workers=2",
                           "worker=1", NULL};
  out o = run_all(options, 5, 2, 0, 1);
  uint64_t order[N_SHARDS];
  for (uint64_t e = 0; e < 2; e++) {
    size_t n = epoch_order(&o, e, order);
    /* rank 1, worker 1 of 2 is slot 3 of 8: shards 3, 11, 19, ..., 99 */
    assert_int_equal(n, 13);
    for (size_t i = 0; i < n; i++) assert_int_equal(order[i], 3 + 8 * i);
  }
  free(o.recs);
}

static void test_epoch_ends(void **state) {
  const char *options[] = {URLS, "world_size=2", "rank=0", "allow_pipe=true", NULL};
  out o = run_all(options, 3, 3, 0, 1);
  uint64_t ends = 0, shards = 0;
  for (size_t i = 0; i < o.n; i++) {
    if (o.recs[i].kind == SF_ITEM_EPOCH_END) {
      assert_int_equal(o.recs[i].epoch, ends);
      assert_int_equal(shards, 50 * (ends + 1)); /* after all shards of its epoch */
      ends++;
    } else {
      assert_true(o.recs[i].allow_pipe);
      shards++;
    }
  }
  assert_int_equal(ends, 3);
  assert_int_equal(o.recs[o.n - 1].kind, SF_ITEM_EPOCH_END);
  free(o.recs);

  /* epochs = 2: SF_EOF after the second EPOCH_END, and again on every later run. */
  sf_harness *h = start((const char *[]){URLS, NULL}, 3, 2, 0, 1);
  out two = run(h, 0);
  assert_int_equal(two.result, SF_EOF);
  assert_int_equal(two.n, 2 * N_SHARDS + 2);
  assert_int_equal(two.recs[two.n - 1].kind, SF_ITEM_EPOCH_END);
  assert_int_equal(two.recs[two.n - 1].epoch, 1);
  out after = run(h, 10);
  assert_int_equal(after.result, SF_EOF);
  assert_int_equal(after.n, 0);
  sf_harness_destroy(&h);
  free(two.recs);
  free(after.recs);

  /* epochs = 0 runs until stopped: ten epochs' worth of steps, ten epoch ends, no SF_EOF. */
  h = start((const char *[]){"urls=s-{000..009}.tar", NULL}, 3, 0, 0, 1);
  out forever = run(h, 10 * 11);
  assert_int_equal(forever.result, 0);
  assert_int_equal(forever.n, 110);
  for (size_t i = 0; i < forever.n; i++)
    assert_int_equal(forever.recs[i].kind, i % 11 == 10 ? SF_ITEM_EPOCH_END : SF_ITEM_SHARD);
  assert_int_equal(forever.recs[109].epoch, 9);
  sf_harness_destroy(&h);
  free(forever.recs);
}

static void test_samples_per_epoch_repeats_passes(void **state) {
  /* One rank: every pass is a fresh permutation of all shards; the epoch never ends by itself. */
  sf_harness *h = start((const char *[]){URLS, "samples_per_epoch=5000", NULL}, 9, 1, 0, 1);
  out o = run(h, 3 * N_SHARDS);
  assert_int_equal(o.result, 0);
  assert_int_equal(o.n, 3 * N_SHARDS);
  uint64_t pass[3][N_SHARDS];
  for (size_t i = 0; i < o.n; i++) {
    assert_int_equal(o.recs[i].kind, SF_ITEM_SHARD);
    assert_int_equal(o.recs[i].epoch, 0);
    assert_int_equal(o.recs[i].samples_per_epoch, 5000);
    assert_int_equal(o.recs[i].pass, i / N_SHARDS);
    pass[i / N_SHARDS][i % N_SHARDS] = o.recs[i].index;
  }
  for (int p = 0; p < 3; p++) assert_true(is_permutation(pass[p], N_SHARDS));
  assert_memory_not_equal(pass[0], pass[1], sizeof pass[0]);
  assert_memory_not_equal(pass[1], pass[2], sizeof pass[0]);
  out more = run(h, 1000);
  assert_int_equal(more.result, 0); /* still going: only tar_split may close the epoch */
  assert_int_equal(more.n, 1000);
  assert_int_equal(more.recs[999].epoch, 0);
  sf_harness_destroy(&h);
  free(o.recs);
  free(more.recs);

  /* Four ranks: within every pass the shares are disjoint and cover the list. */
  int seen[3][N_SHARDS] = {{0}};
  for (int rank = 0; rank < 4; rank++) {
    h = start((const char *[]){URLS, "samples_per_epoch=1k", NULL}, 9, 1, rank, 4);
    out r = run(h, 3 * 25);
    assert_int_equal(r.n, 75);
    for (size_t i = 0; i < r.n; i++) {
      assert_int_equal(r.recs[i].kind, SF_ITEM_SHARD);
      assert_int_equal(r.recs[i].pass, i / 25);
      assert_int_equal(r.recs[i].samples_per_epoch, 1000);
      seen[r.recs[i].pass][r.recs[i].index]++;
    }
    sf_harness_destroy(&h);
    free(r.recs);
  }
  for (int p = 0; p < 3; p++)
    for (int i = 0; i < N_SHARDS; i++) assert_int_equal(seen[p][i], 1);
}

static char dir[64];

/* Expects init to fail with code and a message containing needle. */
static void expect_init_error(const char *const *options, int rank, int world_size, int code,
                              const char *needle) {
  sf_harness *h = (sf_harness *)1;
  sf_error error;
  memset(&error, 0, sizeof error);
  int r = sf_harness_new(&h, "shard_source", options, 1, 1, rank, world_size, &error);
  if (r == 0) fail_msg("init succeeded; expected \"%s\"", needle);
  assert_null(h);
  if (code) assert_int_equal(r, code);
  if (!strstr(error.message, needle))
    fail_msg("message \"%s\" does not mention \"%s\"", error.message, needle);
}

static void test_bad_options(void **state) {
  expect_init_error((const char *[]){NULL}, 0, 1, SF_EOPTION, "urls is empty");
  expect_init_error((const char *[]){"urls=", NULL}, 0, 1, SF_EOPTION, "urls is empty");
  expect_init_error((const char *[]){"urls=s-{000..", NULL}, 0, 1, SF_EOPTION,
                    "\"s-{000..\" at column 3");
  expect_init_error((const char *[]){"urls=s-{0..99999999}", NULL}, 0, 1, SF_ETOOBIG,
                    "10,000,000");
  expect_init_error((const char *[]){"urls=@/nonexistent/shards.txt", NULL}, 0, 1, SF_ENOENT,
                    "cannot open");

  char empty[128], option[140];
  snprintf(empty, sizeof empty, "%s/empty.txt", dir);
  FILE *f = fopen(empty, "w");
  assert_non_null(f);
  fputs("# no shards yet\n\n", f);
  fclose(f);
  snprintf(option, sizeof option, "urls=@%s", empty);
  expect_init_error((const char *[]){option, NULL}, 0, 1, SF_ENOENT, "expands to no shard");

  expect_init_error((const char *[]){URLS, "rank=4", "world_size=4", NULL}, 0, 1, SF_EOPTION,
                    "rank 4 is out of range for world_size 4");
  expect_init_error((const char *[]){URLS, NULL}, 5, 2, 0, "rank");
  expect_init_error((const char *[]){URLS, "world_size=0", NULL}, 0, 1, SF_EOPTION, "world_size");
  expect_init_error((const char *[]){URLS, "worker=3", "workers=3", NULL}, 0, 1, SF_EOPTION,
                    "worker 3 is out of range for workers 3");
  /* Range checks of the options table itself (the engine's parser names the option). */
  expect_init_error((const char *[]){URLS, "workers=0", NULL}, 0, 1, 0, "workers");
  expect_init_error((const char *[]){URLS, "rank=-2", NULL}, 0, 1, 0, "rank");
  expect_init_error((const char *[]){URLS, "shuffle=maybe", NULL}, 0, 1, 0, "shuffle");

  expect_init_error((const char *[]){"urls=s-{0..1}.tar", "rank=3", "world_size=4", NULL}, 0, 1,
                    SF_EOPTION,
                    "rank 3 of 4 (worker 0 of 1) gets no shard: 2 shards for 4 ranks x 1 "
                    "workers; use fewer ranks/workers or more shards");
  expect_init_error((const char *[]){"urls=s-{0..4}.tar", "workers=3", "worker=2", NULL}, 1, 2,
                    SF_EOPTION, "rank 1 of 2 (worker 2 of 3) gets no shard: 5 shards");
  /* The last slot that still gets a shard initialises. */
  sf_harness *h = start((const char *[]){"urls=s-{0..4}.tar", "workers=3", "worker=1", NULL}, 1,
                        1, 1, 2);
  sf_harness_destroy(&h);
}

static int setup(void **state) {
  snprintf(dir, sizeof dir, "%s", "/tmp/sf-shard-source-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  char path[128];
  snprintf(path, sizeof path, "%s/empty.txt", dir);
  unlink(path);
  return rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shares_are_disjoint_and_cover),
      cmocka_unit_test(test_order_follows_seed_and_epoch),
      cmocka_unit_test(test_no_shuffle_keeps_list_order),
      cmocka_unit_test(test_epoch_ends),
      cmocka_unit_test(test_samples_per_epoch_repeats_passes),
      cmocka_unit_test(test_bad_options),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
