/* shardflow public embedding API: graphs (descriptions) and pipelines (running graphs). */
#ifndef SHARDFLOW_SHARDFLOW_H
#define SHARDFLOW_SHARDFLOW_H

#include <stdbool.h>
#include <stdint.h>

#include "shardflow/buffer.h"
#include "shardflow/error.h"
#include "shardflow/log.h"
#include "shardflow/sample.h"
#include "shardflow/stage.h" /* SF_NODE_COUNTERS, SF_COUNTER_NAME_MAX */
#include "shardflow/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Version as "MAJOR.MINOR.PATCH" (static string). */
SF_API const char *sf_version_string(void);
/** Version as MAJOR*10000 + MINOR*100 + PATCH. */
SF_API int sf_version(void);

/**
 * A graph: stage instances (nodes), edges and settings, as read from a graph
 * file, with the source line of every value.  A graph is a description; it
 * runs nothing.  Not thread-safe; a pipeline keeps its own copy.
 */
typedef struct sf_graph sf_graph;

/**
 * Reads a YAML graph file (format: docs/graph-files.md).  A relative path
 * in its `plugins:` list is resolved against the file's directory.
 * On success *graph is a new graph the caller destroys with sf_graph_destroy().
 * Returns 0; SF_ENOENT when the file cannot be opened, SF_EIO when it cannot
 * be read, SF_ETOOBIG over 1 MiB; SF_EGRAPH for YAML, stage or structure
 * mistakes and SF_EOPTION for an unknown option or a bad value, with
 * error->url = path, error->line and a message listing the valid names;
 * SF_ENOMEM.  error may be NULL.
 */
SF_API int sf_graph_load_file(sf_graph **graph, const char *path, sf_error *error);

/** Same as sf_graph_load_file() for YAML text (relative plugin paths: from the current directory); name is used
 * in messages. */
SF_API int sf_graph_load_string(sf_graph **graph, const char *text, const char *name,
                                sf_error *error);

/**
 * Overrides an option: target is "NODE.OPTION" (a node's option), or a graph
 * setting ("seed", "epochs", "error_policy", "queue_size", "threads").  The value is text, parsed
 * by the option's own parser now, so a value that does not parse is refused here, where the
 * caller knows where it came from (the message says neither: a front end adds its own words).
 * Returns 0, or SF_EOPTION with a message naming the valid nodes or options, or why the value
 * does not parse.
 */
SF_API int sf_graph_set(sf_graph *graph, const char *target, const char *value, sf_error *error);

/**
 * Gives node `node`'s stage an object of the embedding program, which the stage reads with
 * sf_node_attachment (shardflow/stage.h): what a program hands a stage that a graph file cannot
 * say (the Python package gives each `type: python` node the sf_handoff its map thread serves).
 * Not an option: it never appears in graph files, `--set` or the fingerprint.  Copies of the graph
 * (replicas, the plan) carry it; a group's workers, in other processes, do not.  Borrowed: object
 * must outlive the pipelines built from graph.  Attaching again replaces it; NULL removes it.
 * Returns 0, or SF_ENOENT when the graph has no node of that name.
 */
SF_API int sf_graph_attach(sf_graph *graph, const char *node, void *object);

/**
 * Checks the whole graph as a pipeline would (stage types, options, ranges,
 * edges, replicas) without starting anything.  Returns 0 or SF_EGRAPH/SF_EOPTION.
 */
SF_API int sf_graph_validate(const sf_graph *graph, sf_error *error);

/** Number of nodes, and the name / stage type of node i (borrowed strings). */
SF_API int sf_graph_node_count(const sf_graph *graph);
SF_API const char *sf_graph_node_name(const sf_graph *graph, int i);
SF_API const char *sf_graph_node_type(const sf_graph *graph, int i);

/**
 * The node feeding input port `port` (0-based) of node i: the previous node of a chain, or the
 * port-th name of the node's `inputs:` list (docs/graph-files.md).  Returns the index of that node
 * (file order), or -1 when the port is not connected, i is a source, or the graph does not resolve
 * (sf_graph_validate says why).  Used by `shardflow dot` to draw branches.
 */
SF_API int sf_graph_node_input(const sf_graph *graph, int i, int port);

/**
 * The value option of node i will run with, as text: the graph file's or
 * --set's value, else the option's default.  Returns a borrowed string valid
 * until the graph changes, or NULL for an unknown node or option.
 */
SF_API const char *sf_graph_node_option(const sf_graph *graph, int i, const char *option);

/**
 * The number of samples in the dataset of the graph's (first) shard_source: the sum over its
 * expanded shard list of each shard's index (SHARD.sfidx in its index_dir or beside the shard,
 * Megatron-Energon's SHARD.tar.idx, else made from the shard and kept, as order: global reads them;
 * docs/data.md). Dataset index i, 0 <= i < *samples, is sample i of the shards in list order (what
 * Python's shardflow.Dataset[i] reads). Returns 0 with *samples; SF_ENOENT when the graph has no
 * shard_source; a shard list's or index's errors (SF_EINVAL, SF_ENOENT, SF_EIO for a stale index,
 * SF_EFORMAT, SF_EUNSUPPORTED, SF_EOPTION...) with *error (may be NULL) naming the file and the fix.
 */
SF_API int sf_graph_dataset_size(const sf_graph *graph, uint64_t *samples, sf_error *error);

/**
 * The mixed positions of epoch (all ranks together) of the graph's mix when the plan makes it deal by position
 * with stop: first (its inputs each shard_source order: global with deal; docs/resume.md, "mix by position"):
 * the positions before the first whose seeded draw would be an input's sample past its dataset size, capped by
 * the mix's samples_per_epoch x world_size when set (world_size: the run's ranks, >= 1). Reads the inputs'
 * indexes as sf_graph_dataset_size does. Returns 0 with *positions; SF_ENOENT when no mix of the graph deals
 * by position with stop: first; an index's errors with *error (may be NULL) naming the file.
 */
SF_API int sf_graph_mix_positions(const sf_graph *graph, uint64_t epoch, int world_size, uint64_t *positions,
                                  sf_error *error);

/**
 * Writes `shardflow help STAGE` for stage (summary, ports, every option with
 * type, default, range and meaning; from the options table) into buf, cut to
 * size bytes with a NUL.  Returns the full length, or SF_ENOENT for an
 * unknown stage.  stage NULL lists the stages, one "name: summary" a line.
 */
SF_API int sf_stage_help(const char *stage, char *buf, size_t size);

/** True when node i's stage has an option called option (for bindings that map keyword arguments). */
SF_API bool sf_graph_node_has_option(const sf_graph *graph, int i, const char *option);

/** Frees *graph and sets it to NULL. NULL-safe. */
SF_API void sf_graph_destroy(sf_graph **graph);

/** Bytes sf_graph_order_fingerprint() writes: 64 hex digits and a NUL. */
#define SF_ORDER_FINGERPRINT_SIZE 65

/**
 * The order fingerprint of graph: what decides which samples each batch of an
 * epoch holds and in which order, hashed, so that a saved position (epoch,
 * step) is resumed only by a graph that rebuilds the same batches (Python's
 * state_dict() carries it and load_state_dict() compares it; docs/resume.md).
 *
 * Covered: the graph's seed; every node, in execution order, with its name
 * (it seeds the node's random stream), its stage type and the nodes feeding
 * its input ports; and every option's value as the stage's options table
 * parses it (the graph file's, --set's or the default; "10k" and "10000" are
 * the same) -- shard list, shuffle, samples_per_epoch, worker split, tar_split's
 * key rule and size limits, decode's limits, shuffle buffer, batch size,
 * partial, buckets, mix weights, a python stage's function, every option of a
 * plugin's stage -- each only where it differs from its default, so an option
 * added by a later version leaves earlier fingerprints unchanged.  Left out, because they never change which samples an
 * epoch holds, their order or where batches are cut: rank and world size
 * (a state says them itself), replicas, threads, groups and a node's group,
 * queue sizes, epochs, error policy and budgets, metrics; and the options
 * that change only a sample's bytes, where data is kept, or speed (every
 * option of augment and device_sink; decode's mode, min_size, depth and
 * defer_jpeg; batch's ragged, pad and pin_memory; tar_split's timeouts,
 * retries, prefetch, cache, mmap, ca_file, dead_host_shards; shard_source's allow_pipe, plan, start and index_dir;
 * python's in_flight).  A shard list is hashed as written: the
 * lines of an @FILE list and the objects under a store prefix are not read.
 *
 * The hash is SHA-256 (libcrypto) over a versioned, length-prefixed text of
 * those values: the same for the same graph in every run, process and host,
 * independent of how the graph file is laid out (key order, comments, number
 * spelling).  A later version that changes what counts changes the version
 * tag, so it gives other fingerprints, never equal ones by accident.
 *
 * Writes 64 lowercase hex digits and a NUL into buf.  Returns 0; SF_EINVAL
 * when graph or buf is NULL or size < SF_ORDER_FINGERPRINT_SIZE; SF_EGRAPH /
 * SF_EOPTION for a graph that does not validate, with error saying why (as
 * sf_graph_validate()); SF_ENOMEM.  On failure buf holds "" (when size > 0).
 * error may be NULL.
 */
SF_API int sf_graph_order_fingerprint(const sf_graph *graph, char *buf, size_t size, sf_error *error);

/** How a pipeline is placed: rank and world size (negative = from the environment). */
typedef struct sf_pipeline_options {
  int rank;             /**< -1: RANK, else SLURM_PROCID, else 0 */
  int world_size;       /**< -1: WORLD_SIZE, else SLURM_NTASKS, else 1 */
  int64_t epochs;       /**< epochs of the whole run, from epoch 0; -1: the graph's `epochs` (0 = unlimited) */
  uint64_t first_epoch; /**< epoch to start at (0-based) */
  uint64_t first_step;  /**< batches of first_epoch already consumed: they are rebuilt, not returned (resumption) */
} sf_pipeline_options;

/** Fills options with the defaults (everything from the graph or environment). */
SF_API void sf_pipeline_options_init(sf_pipeline_options *options);

/** A running graph. */
typedef struct sf_pipeline sf_pipeline;

/**
 * Creates a pipeline from graph (copied; the graph may be destroyed after)
 * and starts its threads.  options may be NULL for the defaults.
 * Returns 0; SF_EGRAPH/SF_EOPTION for a graph that does not validate; the
 * error of a stage whose init failed (e.g. SF_ENOENT for an empty shard list);
 * SF_ENOMEM.  On failure *pipeline is NULL and error (if not NULL) says why.
 */
SF_API int sf_pipeline_new(sf_pipeline **pipeline, const sf_graph *graph,
                           const sf_pipeline_options *options, sf_error *error);

/**
 * Waits up to timeout seconds (negative: forever) for the next batch.
 * Returns 0 with *batch set (caller owns it; free with sf_batch_destroy());
 * SF_EOF at the end of each epoch (the next call goes on with the next epoch,
 * or returns SF_EOF again after the last one); SF_ETIMEDOUT when no batch came
 * within timeout; the error that stopped the pipeline (see
 * sf_pipeline_last_error()), which may be SF_ETIMEDOUT too (a stalled download
 * under error_policy: fail): sf_pipeline_failed() tells the two apart; or
 * SF_ECANCELED once sf_pipeline_stop() was called.
 */
SF_API int sf_pipeline_next(sf_pipeline *pipeline, sf_batch **batch, double timeout);

/**
 * The error code that stopped the pipeline (a failed run; sf_pipeline_last_error() has its
 * record), or 0 while it runs, after its last epoch and after sf_pipeline_stop().  A caller
 * that waits in slices (a binding that runs signal handlers between them) checks it after
 * SF_ETIMEDOUT: 0 means its own wait ran out, SF_ETIMEDOUT the run's failure.  Thread-safe.
 */
SF_API int sf_pipeline_failed(const sf_pipeline *pipeline);

/**
 * Stops the pipeline from any thread, e.g. a trainer's close() while another thread waits in
 * sf_pipeline_next(): the nodes stop stepping, and sf_pipeline_next() (the call waiting now and
 * every later one) returns SF_ECANCELED at once, or the error that had already stopped the run;
 * the fd (sf_pipeline_fd) turns readable.  Safe to call concurrently with any other
 * sf_pipeline_* call on the same pipeline, and more than once.  It frees nothing: call
 * sf_pipeline_destroy() once no other thread is inside a call on the pipeline.  NULL-safe.
 */
SF_API void sf_pipeline_stop(sf_pipeline *pipeline);

/** Epoch of the batches sf_pipeline_next() currently returns (0-based). */
SF_API uint64_t sf_pipeline_epoch(const sf_pipeline *pipeline);

/** Batches sf_pipeline_next() has returned in the current epoch (the trainer's step). */
SF_API uint64_t sf_pipeline_step(const sf_pipeline *pipeline);

/*
 * Exact resumption.  Every batch is a function of the graph, seed, rank, world
 * size, epoch and its position in the epoch (shard order, crops and the
 * shuffle buffer all draw from the seed), so the position is the whole state:
 * save epoch and step (sf_pipeline_epoch, sf_pipeline_step) with the rank and
 * world size; to resume, create the pipeline with first_epoch = epoch and
 * first_step = step.  The engine then re-reads the epoch's first `step`
 * batches' samples without building them (no augment, no copies) and returns
 * exactly the batches the uninterrupted run would have returned next.
 * Save sf_pipeline_order_fingerprint() with them and compare it before resuming:
 * a graph with another seed, shard list, batch size or any other option that
 * decides the order would silently repeat or skip samples.
 * Resuming with another world size (or worker split) changes which shards a
 * rank reads and is not supported: bindings refuse it.
 */

/**
 * A file descriptor for trainers with an event loop of their own (poll,
 * epoll, asyncio's add_reader): it is readable while sf_pipeline_next() would
 * return without waiting (a batch, an epoch end, or the error that stopped
 * the pipeline).  Never read from or close it; it stays valid until
 * sf_pipeline_destroy().  Level-triggered: after next() has taken the last
 * ready item, it is no longer readable.  Linux eventfd(2).
 */
SF_API int sf_pipeline_fd(const sf_pipeline *pipeline);

/**
 * sf_graph_order_fingerprint() of the graph the pipeline was created from
 * (before any groups split it): save it with epoch and step, and resume only
 * where it is equal.  Returns a borrowed string of 64 hex digits, valid until
 * sf_pipeline_destroy().
 */
SF_API const char *sf_pipeline_order_fingerprint(const sf_pipeline *pipeline);

/** Rank and world size the pipeline runs as. */
SF_API int sf_pipeline_rank(const sf_pipeline *pipeline);
SF_API int sf_pipeline_world_size(const sf_pipeline *pipeline);

/** Per-node counters (summed over replicas). */
typedef struct sf_node_stats {
  char name[32];          /**< node name */
  char type[32];          /**< stage type */
  int replicas;
  uint64_t items;         /**< items produced */
  uint64_t bytes;         /**< payload bytes produced (as the stage counts them) */
  double busy_seconds;    /**< wall-clock seconds inside step() (steps do not wait on I/O: tar_split returns until a download's bytes arrive) */
  double wait_seconds;    /**< wall-clock seconds the node waited, from a step that made no progress (empty input, a download's bytes not yet arrived) to the next that did */
  uint64_t errors;        /**< error records raised */
  uint64_t skipped;       /**< samples dropped under the skip policy */
  uint64_t filtered;      /**< samples the stage dropped on purpose (a filter): not errors, outside max_errors / max_error_rate */
  int n_inputs;           /**< connected input ports (fan-in: several) */
  char input_names[SF_NODE_INPUTS_MAX][32]; /**< the node feeding each input port */
  uint64_t input_items[SF_NODE_INPUTS_MAX]; /**< items taken per input port, as the stage counts them (sf_node_count_input; mix does) */
  int n_counters;            /**< the stage's own counters (sf_node_counter_add), in the order they were first added */
  char counter_names[SF_NODE_COUNTERS][SF_COUNTER_NAME_MAX]; /**< their names */
  uint64_t counters[SF_NODE_COUNTERS]; /**< their values, summed over the replicas */
  sf_stage_stats stage;      /**< what the stage reports of its own (its definition's stats callback): counts
                                  summed over the replicas, the rest replica 0's; zero when it reports nothing */
} sf_node_stats;

/**
 * Copies up to max node stats into stats. Returns the number of nodes (may
 * exceed max).
 */
SF_API int sf_pipeline_stats(const sf_pipeline *pipeline, sf_node_stats *stats, int max);

/**
 * The workers of the node called `node` (a group's node, named after the group), alive or gone, as its head
 * knows them: up to max of them into workers (may be NULL when max is 0).  Any thread while the pipeline runs.
 * Returns how many there are (may exceed max); 0 for a node that is not a group's or an unknown name.
 */
SF_API int sf_pipeline_workers(sf_pipeline *pipeline, const char *node, sf_worker_stats *workers, int max);

/**
 * sizeof(sf_node_stats) in bytes as this library was built: bindings that
 * mirror the struct (Python's ctypes) check theirs against it once at load.
 */
SF_API size_t sf_node_stats_size(void);

/**
 * The TCP port /metrics is served on (graph setting `metrics: HOST:PORT`, Prometheus text format
 * 0.0.4, metric names in docs/metrics.md): the bound port, also when the setting asked for port 0.
 * Returns 0 when the graph has no `metrics` setting.
 */
SF_API int sf_pipeline_metrics_port(const sf_pipeline *pipeline);

/**
 * Writes one line naming the stage that limits throughput and the remedy (rule and reasoning:
 * docs/bottleneck.md), e.g. "bottleneck: decode (busy 97% of 1 replica): CPU-bound; set
 * decode.replicas: 2", into buf (cut to size bytes with a NUL; no newline).  Judged from the
 * counters since the pipeline started; callable from any thread while the pipeline runs, and
 * after its last epoch.  Returns the full length of the line.
 */
SF_API int sf_pipeline_bottleneck(sf_pipeline *pipeline, char *buf, size_t size);

/** Total error records and skipped samples so far. */
SF_API uint64_t sf_pipeline_error_count(const sf_pipeline *pipeline);
SF_API uint64_t sf_pipeline_skipped(const sf_pipeline *pipeline);

/** Copies the last error record into *error. Returns false when there is none. */
SF_API bool sf_pipeline_last_error(const sf_pipeline *pipeline, sf_error *error);

/**
 * Stops the threads, frees everything, sets *pipeline to NULL. NULL-safe.  Not while another thread
 * is inside a call on the pipeline: wake that one with sf_pipeline_stop() and wait for it first.
 */
SF_API void sf_pipeline_destroy(sf_pipeline **pipeline);

#ifdef __cplusplus
}
#endif
#endif
