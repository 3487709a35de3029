/* Test harness: runs one stage alone with in-memory ports (GstHarness, in spirit). For tests only. */
#ifndef SF_ENGINE_HARNESS_H
#define SF_ENGINE_HARNESS_H

#include "shardflow/stage.h"

typedef struct sf_harness sf_harness;

/*
 * Creates one node of stage type `stage` with options given as "name=value"
 * strings (NULL-terminated array, may be NULL), parsed by the stage's options
 * table, and calls init. seed is the graph seed; epochs the pipeline's epoch
 * count (0 = unlimited); rank/world_size as the node should see them.
 * Returns 0, or the option/init error in *error (the harness is then NULL).
 */
int sf_harness_new(sf_harness **harness, const char *stage, const char *const *options,
                   uint64_t seed, uint64_t epochs, int rank, int world_size, sf_error *error);

/*
 * The same for a stage definition that is not in the built-in registry (a plugin's, taken from its
 * sf_plugin_entry()); def is borrowed and must outlive the harness.
 */
int sf_harness_new_def(sf_harness **harness, const sf_stage_def *def, const char *const *options,
                       uint64_t seed, uint64_t epochs, int rank, int world_size, sf_error *error);

/* Queues an input item (unbounded; consumes it). */
void sf_harness_push(sf_harness *harness, sf_item *item);

/* Closes the input: the stage's sf_node_pop() returns SF_EOF once drained. */
void sf_harness_close_input(sf_harness *harness);

/*
 * Calls step until it returns SF_EAGAIN, SF_EOF or an error, or max_steps
 * steps ran (0 = no limit). Returns that last result (0 when max_steps ran out).
 */
int sf_harness_run(sf_harness *harness, uint64_t max_steps);

/* Takes the next output item: 0, or SF_EAGAIN when none is queued. */
int sf_harness_pop(sf_harness *harness, sf_item *item);

/* Errors recorded and samples skipped by the node so far; the last record. */
uint64_t sf_harness_error_count(const sf_harness *harness);
uint64_t sf_harness_skipped(const sf_harness *harness);
const sf_error *sf_harness_last_error(const sf_harness *harness);

/* Sets the graph's error policy for the node: 0 = skip (default), 1 = fail. */
void sf_harness_set_error_policy(sf_harness *harness, int fail);

/* Calls uninit, frees queued items, sets *harness to NULL. */
void sf_harness_destroy(sf_harness **harness);

#endif
