/* What a group's head-side node (stages/remote.c) reports about its workers, for progress lines and summaries. */
#ifndef SF_ENGINE_REMOTE_H
#define SF_ENGINE_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"
#include "shardflow/stage.h"

enum { SF_REMOTE_MAX_REPORTED = 64 };

typedef struct sf_remote_worker_stats {
  char name[64];
  int64_t pid;
  bool live;
  uint64_t samples, units;       /* results taken from this worker */
  double rate;                   /* samples/s over the last second or so */
  sf_wire_stage_stats stats[SF_WIRE_MAX_STATS]; /* the worker's own per-stage table, as last reported */
  int n_stats;
} sf_remote_worker_stats;

typedef struct sf_remote_stats {
  int live;                      /* workers alive now */
  int n_workers;                 /* entries in workers: every worker seen, alive or not */
  sf_remote_worker_stats workers[SF_REMOTE_MAX_REPORTED];
  uint64_t duplicates;           /* results dropped because their unit was already done */
  uint64_t malformed;            /* messages dropped as malformed or not matching their unit */
  uint64_t reassigned;           /* units handed to another worker after theirs died, left or was late */
  uint64_t refused;              /* connections refused by authentication */
  uint64_t ring_bytes;           /* result payload bytes local processes passed through shared memory */
  uint64_t socket_bytes;         /* result payload bytes that came through the sockets (remote workers, full rings) */
} sf_remote_stats;

/* Fills *stats for a _remote node (the caller checks the node's type). Returns 0. */
int sf_remote_describe(sf_node *node, sf_remote_stats *stats);

/* The head-side stage definition, and the worker's ends of the group's chain (engine/group/worker.c). */
extern const sf_stage_def sf_stage_remote;
extern const sf_stage_def sf_stage_worker_source;
extern const sf_stage_def sf_stage_worker_sink;

#endif
