/* Nodes and the pipeline-wide context they share; used by the executor and the test harness. */
#ifndef SF_ENGINE_NODE_H
#define SF_ENGINE_NODE_H

#include <pthread.h>
#include <stdatomic.h>

#include "graph.h"
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
  sf_error last_error;             /* the last record, or the verdict that stopped the run (budget, empty epoch) */
  bool has_error;
  bool last_printed;               /* last_error is a record that was logged, not a verdict nobody saw yet */
  bool verdict;                    /* last_error is the verdict that stopped the run: later records keep it */
  sf_error first_error;            /* the first record: what a consequence of it refers to */
  bool uniform;                    /* every record so far has first_error's stage, code and message */
  struct sf_node *first_node;      /* the node that raised first_error, or NULL (a worker's, a context's own) */
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
  uint64_t position;   /* samples and holes popped so far (markers not counted): names lent rows (node.c) */
} sf_port;

struct sf_node {
  const sf_stage_def *def;
  void *priv;
  char name[32];
  int replica, replicas;
  sf_node *const *stage_replicas; /* the stage's replicas[0..replicas), this one among them (NULL slots while the
                                     pipeline is built); NULL under the test harness */
  bool replicas_planned;   /* the plan chose replicas (the graph file does not pin them): see graph_plan.h */
  bool may_defer;          /* the plan lets its output carry deferred fields (sf_node_may_defer) */
  const sf_graph_node *graph_node; /* its node in the pipeline's graph (owned there), or NULL (test harness) */
  sf_context *ctx;
  sf_port in, out;
  /* Input ports after the first (fan-in, e.g. mix): more_in[p - 1] is port p; n_inputs counts all connected ports. */
  sf_port *more_in;
  int n_inputs;
  const char *input_names[SF_GRAPH_MAX_INPUTS]; /* the feeding nodes' names (the pipeline's graph owns them) */
  atomic_uint_fast64_t input_items[SF_GRAPH_MAX_INPUTS]; /* sf_node_count_input() */
  /* A node on a branch (before a mix) closes epochs for its branch only: one branch's samples_per_epoch
   * cut must not end the others'.  It still sees the pipeline's closes (the mix's).  NULL: the pipeline's. */
  atomic_uint_fast64_t *branch_closed;
  struct sf_pipeline *pipeline;  /* NULL under the test harness */
  const sf_graph *group_stages;  /* a group's head node's stages (owned by the pipeline's graph), or NULL */
  atomic_bool running;           /* a pool worker is stepping it */
  atomic_bool done;              /* returned SF_EOF or failed; outputs closed */
  /* map stages: samples taken and given this step, so a dropped sample leaves a hole */
  int popped, pushed;
  uint64_t out_items;      /* samples and holes it put on its output so far: names lent rows (node.c) */
  /* metrics */
  atomic_uint_fast64_t items, bytes, errors, skipped;
  atomic_uint_fast64_t filtered; /* samples a stage dropped on purpose (not errors, outside the error budget) */
  /* The stage's own counters (sf_node_counter_add): counter_names[0 .. n_counters) are written before the
   * count that publishes them (release; readers acquire) and never change after, so readers take no lock. */
  char counter_names[SF_NODE_COUNTERS][SF_COUNTER_NAME_MAX];
  atomic_uint_fast64_t counters[SF_NODE_COUNTERS];
  atomic_int n_counters;
  atomic_uint_fast64_t busy_ns;  /* wall time inside step(), added by whichever worker ran it */
  atomic_uint_fast64_t wait_ns;  /* wall time from a step that found no input to the next one that did */
  double starved_since;          /* when the current wait for input began, or 0 */
  struct sf_lazy_clock *deferred;    /* time other nodes spent writing this node's deferred fields */
  struct sf_lent_rows *lends;        /* the rows it lends its producers (sf_node_lend_rows), or NULL */
};

void sf_context_init(sf_context *ctx);
void sf_context_destroy(sf_context *ctx);
/* Records an error raised outside any stage call, e.g. a failing init. */
void sf_context_record(sf_context *ctx, const sf_error *error);
/*
 * Makes error the verdict that stops the run (an epoch that delivered nothing): the last error,
 * but not a record: not counted, not printed (the front end says it once, as why the run stopped).
 */
void sf_context_set_verdict(sf_context *ctx, const sf_error *error);
/*
 * What the records so far point to, for a verdict's message: "every sample failed in STAGE with the same
 * error: ...; the stage's code or options are wrong, not the input" when a stage of the user's (a plugin's,
 * a Python function) let no sample through and failed every time alike, else "the first: WHERE" (stage,
 * shard URL, offset, key of the first record; its text was printed with it), or "" without records.
 * Sets *code_wrong when it blames the stage's code. Takes the context's error lock.
 */
void sf_context_cause(sf_context *ctx, char *buf, size_t size, bool *code_wrong);
/* True when the last error is a record that was printed (the front end then refers to it, not repeats it). */
bool sf_pipeline_last_error_printed(const sf_pipeline *pipeline);
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
/* The pipeline's nodes, every replica in chain order (borrowed, valid until sf_pipeline_destroy), their count in *n. */
sf_node *const *sf_pipeline_nodes(sf_pipeline *pipeline, int *n);
/* Seconds since the pipeline started, and seconds the trainer spent waiting inside sf_pipeline_next(). */
double sf_pipeline_elapsed(const sf_pipeline *pipeline);
/*
 * Adds what node's stage reports of its own (its stats callback) to *sum: replica 0 (first) sets it, a later
 * replica adds its counts (reads, downloads) and flags. Nothing for a stage without the callback. Any thread.
 */
void sf_node_stage_stats_add(sf_node *node, sf_stage_stats *sum, bool first);
/* The CPUs this process may use (engine/core/cpu_budget.h), read when the pipeline was made: the pool's
 * threads unless the graph's `threads` sets them, and what the plan spreads replicas over. */
int sf_pipeline_cpu_budget(const sf_pipeline *pipeline);
double sf_pipeline_trainer_wait(const sf_pipeline *pipeline);
/* sf_pipeline_bottleneck's line in buf, and in *named (when not NULL) the name of the node the line names, so that
 * a drawing marks the same node: the CPU-bound stage, a group's node (named after the group) or the network-bound
 * reader; NULL when the line names none (the consumer, nothing saturated, no stage run yet). The name is borrowed
 * from the pipeline (valid until sf_pipeline_destroy). Returns the line's length as snprintf does. */
int sf_pipeline_bottleneck_named(sf_pipeline *pipeline, char *buf, size_t size, const char **named);
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

/* The group's stages of a group's head node (engine/graph/graph_groups.h), borrowed for the pipeline's life; NULL for other nodes. */
const sf_graph *sf_node_group_stages(const sf_node *node);
uint64_t sf_node_deferred_ns(const sf_node *node);
uint64_t sf_thread_deferred_ns(void);
/* Drops the node's clock (the recipes still queued keep theirs alive) and the rows it lends. */
void sf_node_release_deferred(sf_node *node);

#endif
