/* engine/exec/bottleneck.c's rule on made-up runs whose answer is known, for the cases a live run cannot make
 * certain: a saturated stage the engine cannot replicate (tar_split, mix), a reader that waits in reads, a run
 * too short to judge a group, and a stage that already runs one replica per CPU of the budget (set by the plan
 * or by the graph file). test_bottleneck.py runs the live cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bottleneck.h"

enum { SOURCE, SPLIT, DECODE, BATCH, SINK, N_CHAIN };

/* shard_source, tar_split, decode (one replica), batch, device_sink: nothing busy yet. */
static void chain(sf_bottleneck_node *n) {
  memset(n, 0, N_CHAIN * sizeof *n);
  const char *names[N_CHAIN] = {"shard_source", "tar_split", "decode", "batch", "device_sink"};
  for (int i = 0; i < N_CHAIN; i++) {
    n[i].name = n[i].stage = names[i];
    n[i].replicas = 1;
    n[i].inputs = i > 0;
  }
  n[SOURCE].source = true;
  n[DECODE].replicable = true;
  n[SPLIT].stats.reads = true;
}

static char line[512];

/* The line for the run; *named the node it names (-1: none). */
static const char *judge(const sf_bottleneck_node *nodes, int n, double elapsed, double waited, int budget,
                         int *named) {
  sf_bottleneck_run run = {
      .elapsed = elapsed, .trainer_wait = waited, .cpu_budget = budget, .nodes = nodes, .n_nodes = n};
  int len = sf_bottleneck_judge(&run, line, sizeof line, named);
  assert_true(len > 0 && (size_t)len < sizeof line);
  printf("  %s\n", line);
  return line;
}

static void assert_has(const char *text, const char *part) {
  if (!strstr(text, part)) fail_msg("expected \"%s\" in: %s", part, text);
}

static void assert_lacks(const char *text, const char *part) {
  if (strstr(text, part)) fail_msg("did not expect \"%s\" in: %s", part, text);
}

/* tar_split keeps state between samples: the graph refuses replicas for it, so the line must not ask for them. */
static void test_stateful_stage_gets_no_replicas(void **state) {
  sf_bottleneck_node n[N_CHAIN];
  chain(n);
  n[SPLIT].busy = 6.7; /* of a 10 s run, computing (no read waits) */
  n[DECODE].busy = 2.0;
  int named;
  const char *s = judge(n, N_CHAIN, 10, 6, 8, &named);
  assert_int_equal(named, SPLIT);
  assert_has(s, "bottleneck: tar_split (tar_split, busy 67% of its one thread");
  assert_has(s, "CPU-bound");
  assert_has(s, "cannot run as replicas");
  assert_lacks(s, "replicas:");
  assert_lacks(s, "group");
  assert_lacks(s, "I/O-bound");
}

/* A node merging inputs (mix) runs once, whatever its stage. */
static void test_merging_node_gets_no_replicas(void **state) {
  sf_bottleneck_node n[3] = {
      {.name = "a", .stage = "shard_source", .replicas = 1, .source = true},
      {.name = "b", .stage = "shard_source", .replicas = 1, .source = true},
      {.name = "both", .stage = "mix", .replicas = 1, .inputs = 2, .busy = 9},
  };
  int named;
  const char *s = judge(n, 3, 10, 8, 8, &named);
  assert_int_equal(named, 2);
  assert_has(s, "bottleneck: both (mix, busy 90% of its one thread");
  assert_has(s, "merges 2 inputs");
  assert_lacks(s, "replicas:");
  assert_lacks(s, "group");
}

/* Time tar_split spent waiting for shard bytes is the storage's, not its CPU's. */
static void test_reads_are_io(void **state) {
  sf_bottleneck_node n[N_CHAIN];
  chain(n);
  n[SPLIT].busy = 9;
  n[SPLIT].read = 7.5;
  n[DECODE].busy = 7; /* busy, but less than the reader's thread */
  int named;
  const char *s = judge(n, N_CHAIN, 10, 8, 8, &named);
  assert_int_equal(named, SPLIT);
  assert_has(s, "bottleneck: tar_split (tar_split, busy 90% of its one thread, 75% of the run in reads");
  assert_has(s, "I/O-bound");
  assert_has(s, "storage");
  assert_lacks(s, "CPU-bound");
  assert_lacks(s, "replicas:");
  /* The same busy time without read waits is the reader's CPU: named as the limit, on one thread. */
  n[SPLIT].read = 0.5;
  s = judge(n, N_CHAIN, 10, 8, 8, &named);
  assert_int_equal(named, SPLIT);
  assert_has(s, "CPU-bound");
  assert_has(s, "one thread");
  assert_lacks(s, "I/O-bound");
  assert_lacks(s, "replicas:");
  /* Reads that do not saturate the reader leave the CPU-bound decode named. */
  n[SPLIT].busy = 3;
  n[SPLIT].read = 2.5;
  n[DECODE].busy = 9;
  s = judge(n, N_CHAIN, 10, 8, 8, &named);
  assert_int_equal(named, DECODE);
  assert_has(s, "set decode.replicas: ");
}

/* A run of 0.05 s says nothing about decode workers on other hosts: advice stays within this host. */
static void test_short_run_gets_no_group(void **state) {
  sf_bottleneck_node n[N_CHAIN];
  chain(n);
  n[DECODE].busy = 0.045;
  int named;
  const char *s = judge(n, N_CHAIN, 0.05, 0.045, 2, &named);
  assert_int_equal(named, DECODE);
  assert_has(s, "set decode.replicas: 2");
  assert_has(s, "too short");
  assert_lacks(s, "group");
  /* The same shares over 10 s: the group is advised, after filling this host. */
  n[DECODE].busy = 9;
  s = judge(n, N_CHAIN, 10, 9, 2, &named);
  assert_has(s, "set decode.replicas: 2 here, and move it into a group with ");
  assert_lacks(s, "too short");
  /* Within the budget, a short run still gets its replicas. */
  n[DECODE].busy = 0.045;
  s = judge(n, N_CHAIN, 0.05, 0.02, 16, &named);
  assert_has(s, "set decode.replicas: 2");
  assert_lacks(s, "group");
}

/* decode already runs one replica per CPU of the budget: no more replicas here; a group once the run is long enough. */
static void test_replicas_already_fill_the_budget(void **state) {
  sf_bottleneck_node n[N_CHAIN];
  chain(n);
  n[DECODE].replicas = 4;
  n[DECODE].replicas_planned = true;
  n[DECODE].busy = 0.95 * 4 * 10;
  int named;
  const char *s = judge(n, N_CHAIN, 10, 8, 4, &named);
  assert_int_equal(named, DECODE);
  assert_has(s, "already runs one replica per CPU");
  assert_has(s, "chosen by the plan");
  assert_has(s, "move it into a group with ");
  assert_lacks(s, "decode.replicas:");
  /* Written in the graph file: the same, without the plan. */
  n[DECODE].replicas_planned = false;
  s = judge(n, N_CHAIN, 10, 8, 4, &named);
  assert_has(s, "already runs one replica per CPU");
  assert_lacks(s, "chosen by the plan");
  assert_lacks(s, "decode.replicas:");
  /* More replicas than CPUs (the file pins 6 on 4): still no more replicas. */
  n[DECODE].replicas = 6;
  n[DECODE].busy = 0.95 * 6 * 10;
  s = judge(n, N_CHAIN, 10, 8, 4, &named);
  assert_has(s, "already runs more than one replica per CPU");
  assert_lacks(s, "decode.replicas:");
  /* A short run: no group either. */
  n[DECODE].replicas = 4;
  n[DECODE].replicas_planned = true;
  n[DECODE].busy = 0.95 * 4 * 0.3;
  s = judge(n, N_CHAIN, 0.3, 0.25, 4, &named);
  assert_int_equal(named, DECODE);
  assert_has(s, "already runs one replica per CPU");
  assert_has(s, "chosen by the plan");
  assert_has(s, "too short");
  assert_lacks(s, "group");
  assert_lacks(s, "decode.replicas:");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stateful_stage_gets_no_replicas),
      cmocka_unit_test(test_merging_node_gets_no_replicas),
      cmocka_unit_test(test_reads_are_io),
      cmocka_unit_test(test_short_run_gets_no_group),
      cmocka_unit_test(test_replicas_already_fill_the_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
