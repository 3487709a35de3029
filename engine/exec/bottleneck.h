/* The bottleneck rule (docs/bottleneck.md) judged on counters handed to it: the report gathers them from a running
 * pipeline (engine/exec/bottleneck.c), a test hands made-up runs whose answer it knows. */
#ifndef SF_ENGINE_BOTTLENECK_H
#define SF_ENGINE_BOTTLENECK_H

#include <stdbool.h>
#include <stddef.h>

#include "node.h"

/* One node as the rule sees it, summed over its replicas. */
typedef struct sf_bottleneck_node {
  const char *name;  /* the node's name (borrowed) */
  const char *stage; /* its stage's name (borrowed) */
  int replicas;
  bool replicas_planned; /* the plan chose its replicas (sf_node.replicas_planned) */
  bool replicable;       /* the engine accepts `replicas: N` for it: a map stage (SF_STAGE_MAP) with one input */
  int inputs;            /* input ports connected (more than one: it merges them, e.g. mix) */
  bool source;           /* it reads no input (shard_source) */
  double busy;           /* busy seconds over every replica */
  double read;           /* of busy, seconds spent waiting for shard bytes in reads (sf_stage_stats.read_ns) */
  sf_stage_stats stats;  /* what its stage reports (sf_node_stage_stats_add): replica 0's, counts summed */
} sf_bottleneck_node;

/* What a run measured so far. */
typedef struct sf_bottleneck_run {
  double elapsed;                  /* seconds since the pipeline started */
  double trainer_wait;             /* seconds the trainer waited inside sf_pipeline_next() */
  int cpu_budget;                  /* CPUs this process may use (sf_pipeline_cpu_budget) */
  const sf_bottleneck_node *nodes; /* borrowed, in chain order */
  int n_nodes;
} sf_bottleneck_run;

/*
 * Writes the bottleneck line for run into buf (cut to size bytes with a NUL; no newline) and in *named (when
 * not NULL) the index of the node the line names, or -1 when it names none. Returns the line's full length,
 * as snprintf does.
 */
int sf_bottleneck_judge(const sf_bottleneck_run *run, char *buf, size_t size, int *named);

#endif
