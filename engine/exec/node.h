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
} sf_port;

/*
 * An option a stage tunes while it runs (autotune: tar_split's prefetch), as sf_node_extra reports it for the
 * stage table, --stats-json (docs/stats-json.md) and /metrics.
 */
typedef struct sf_node_tuned {
  const char *option;      /* the option's name, static storage ("prefetch") */
  int64_t value;           /* in force now */
  int64_t initial;         /* what the run started with: the default, or the value written */
  bool pinned;             /* the graph (or --set, or the API) wrote it: the stage leaves it as it is */
  uint64_t changes;        /* times the stage changed it */
  double changed_at;       /* seconds since the pipeline started at the last change; 0 when it never changed */
} sf_node_tuned;

enum { SF_NODE_TUNED_MAX = 4 };

/*
 * Counters a stage keeps beyond the common ones, for /metrics (engine/exec/metrics.c) and the bottleneck
 * report (engine/exec/bottleneck.c). A stage that has them sets sf_node.extra in its init; the function
 * is then called from other threads (the metrics server's, the trainer's) while the node runs, so it
 * reads only thread-safe state. Zero-filled before the call.
 */
typedef struct sf_node_extra {
  bool group;                  /* a group's head-side node: the next three are set */
  uint64_t workers;            /* workers alive now */
  uint64_t reassigned;         /* units handed to another worker after theirs died, left or was late */
  uint64_t duplicates;         /* results dropped because their unit was already done */
  bool reader;                 /* a shard reader with remote downloads started: the next five are set */
  uint64_t downloaded_bytes;   /* body bytes received over the network */
  uint64_t refetched_bytes;    /* of which were received a second time and discarded */
  uint64_t retries;            /* download attempts after a failure */
  uint64_t cache_hits;         /* shards served from the shard cache */
  uint64_t prefetch;           /* the reader's `prefetch` (downloads ahead) in force now, for the remedy */
  bool reads;                  /* a shard reader (tar_split), remote or not: read_ns is set */
  uint64_t read_ns;            /* wall time its steps spent in reads of shard bytes (read() of a file or pipe,
                                * the page faults of a mapped shard's next window): storage, not its CPU */
  int n_tuned;                 /* entries of tuned[] set */
  sf_node_tuned tuned[SF_NODE_TUNED_MAX]; /* the options the stage tunes while it runs, pinned ones included */
} sf_node_extra;

struct sf_node {
  const sf_stage_def *def;
  void *priv;
  char name[32];
  int replica, replicas;
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
  const sf_graph *group_stages;  /* a _remote node's group stages (owned by the pipeline's graph), or NULL */
  atomic_bool running;           /* a pool worker is stepping it */
  atomic_bool done;              /* returned SF_EOF or failed; outputs closed */
  /* map stages: samples taken and given this step, so a dropped sample leaves a hole */
  int popped, pushed;
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
  void (*extra)(sf_node *node, sf_node_extra *out); /* set by a stage's init, or NULL (sf_node_extra) */
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
/* The first node (replica 0) whose stage is def, or NULL. */
sf_node *sf_pipeline_find_node(sf_pipeline *pipeline, const sf_stage_def *def);
/* The pipeline's nodes, every replica in chain order (borrowed, valid until sf_pipeline_destroy), their count in *n. */
sf_node *const *sf_pipeline_nodes(sf_pipeline *pipeline, int *n);
/* Seconds since the pipeline started, and seconds the trainer spent waiting inside sf_pipeline_next(). */
double sf_pipeline_elapsed(const sf_pipeline *pipeline);
/* The options the node called name (replica 0) tunes while it runs, up to max of them into out (see
 * sf_node_tuned: option names are static). Returns how many; 0 for an unknown name. Any thread. */
int sf_pipeline_node_tuned(sf_pipeline *pipeline, const char *name, sf_node_tuned *out, int max);
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

/* The group's stages of a _remote node (engine/graph/graph_groups.h), borrowed for the pipeline's life; NULL for other nodes. */
const sf_graph *sf_node_group_stages(const sf_node *node);
uint64_t sf_node_deferred_ns(const sf_node *node);
uint64_t sf_thread_deferred_ns(void);
/* Drops the node's clock (the recipes still queued keep theirs alive). */
void sf_node_release_deferred(sf_node *node);

#endif
