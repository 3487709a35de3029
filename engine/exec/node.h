/* Nodes and the pipeline-wide context they share; used by the executor and the test harness. */
#ifndef SF_ENGINE_NODE_H
#define SF_ENGINE_NODE_H

#include <pthread.h>
#include <stdatomic.h>

#include "queue.h"
#include "shardflow/shardflow.h"
#include "shardflow/stage.h"

/* What every node of one pipeline shares: settings, the epoch cut, error records. */
typedef struct sf_context {
  uint64_t seed;
  uint64_t epochs;
  uint64_t first_epoch;
  uint64_t first_step;             /* batches of first_epoch to rebuild without returning */
  int rank, world_size;
  int error_policy;                /* SF_POLICY_* */
  uint64_t max_errors;             /* error budget (graph settings): 0 = no limit */
  double max_error_rate;           /* skipped / samples_read; >= 1 never stops */
  atomic_uint_fast64_t samples_read; /* samples split from shards, kept or skipped */
  atomic_bool over_budget;         /* set once with its record; the executor stops the run */
  atomic_uint_fast64_t epochs_closed;
  atomic_bool stop;
  pthread_mutex_t error_lock;
  uint64_t error_count, skipped, printed;
  sf_error last_error;
  bool has_error;
  bool quiet;                      /* do not print records to stderr */
  /* Called with every record, under error_lock (a worker forwards its records to the head). */
  void (*on_record)(void *opaque, const sf_error *error);
  void *on_record_opaque;
} sf_context;

/* Where a node's items go or come from: one queue, or several in round-robin order. */
typedef struct sf_port {
  sf_queue **queues;
  int n;
  int rr;              /* next queue in round-robin order */
  int markers;         /* epoch-end markers collected from the queues (consumer side) */
} sf_port;

struct sf_node {
  const sf_stage_def *def;
  void *priv;
  char name[32];
  int replica, replicas;
  sf_context *ctx;
  sf_port in, out;
  struct sf_pipeline *pipeline;  /* NULL under the test harness */
  const sf_graph *group_stages;  /* a _remote node's group stages (owned by the pipeline's graph), or NULL */
  atomic_bool running;           /* a pool worker is stepping it */
  atomic_bool done;              /* returned SF_EOF or failed; outputs closed */
  /* map stages: samples taken and given this step, so a dropped sample leaves a hole */
  int popped, pushed;
  /* metrics */
  atomic_uint_fast64_t items, bytes, errors, skipped;
  atomic_uint_fast64_t busy_ns;  /* wall time inside step(), added by whichever worker ran it */
  atomic_uint_fast64_t wait_ns;  /* wall time from a step that found no input to the next one that did */
  double starved_since;          /* when the current wait for input began, or 0 */
  struct sf_deferred_clock *deferred; /* time other nodes spent writing this node's deferred fields */
};

void sf_context_init(sf_context *ctx);
void sf_context_destroy(sf_context *ctx);
/* Records an error raised outside any stage call, e.g. a failing init. */
void sf_context_record(sf_context *ctx, const sf_error *error);
/*
 * Checks the error budget (max_errors, max_error_rate). While samples are still
 * arriving the rate is judged only after enough of them; at an epoch's end
 * (final) always. Returns 0, or SF_EBUDGET once over budget, with a record that
 * says why and what to change (made the last error, printed once).
 */
int sf_context_check_budget(sf_context *ctx, bool final);

/*
 * Records an error raised elsewhere (a worker's record arriving at the head)
 * as this node's: counts it, keeps the record's own stage name, prints it like
 * local records and applies the error policy.  Returns 0 (skip) or error->code (fail).
 */
int sf_node_error_record(sf_node *node, const sf_error *error);
/* The pipeline's shared context (a worker installs its error hook there). */
sf_context *sf_pipeline_context(sf_pipeline *pipeline);
/* The error code that stopped the pipeline, or 0 while it runs. */
int sf_pipeline_failed(const sf_pipeline *pipeline);
/* The first node (replica 0) whose stage is def, or NULL. */
sf_node *sf_pipeline_find_node(sf_pipeline *pipeline, const sf_stage_def *def);
/* Runs one step and patches holes for map stages. Returns the step's result. */
int sf_node_step(sf_node *node);
/* True when the output port may take another item. */
bool sf_port_can_push(sf_port *port);
/*
 * Deferred fields (augment's output, written when batch collates) are timed where
 * they are written and charged to the node that made them: its deferred time, and
 * the time this thread spent on other nodes' fields (to take off the running node's).
 */
/*
 * Allocates the node's clock for deferred field writes (charged to it wherever they run). Done when
 * the node is built, not on its first sample: the stats reader on another thread then never sees
 * the pointer change. Returns 0 or SF_ENOMEM.
 */
int sf_node_new_deferred(sf_node *node);

/* The group's stages of a _remote node (engine/graph/graph_groups.h), borrowed for the pipeline's life; NULL for other nodes. */
const sf_graph *sf_node_group_stages(const sf_node *node);
uint64_t sf_node_deferred_ns(const sf_node *node);
uint64_t sf_thread_deferred_ns(void);
/* Drops the node's clock (the recipes still queued keep theirs alive). */
void sf_node_release_deferred(sf_node *node);

#endif
