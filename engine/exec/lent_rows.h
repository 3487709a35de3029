/*
 * Lent rows: a consumer that stacks its samples' fields row by row into batch-sized buffers (batch) lends
 * those rows to its producers, so that a producer (augment) writes a field's values straight into the row
 * where the consumer would put it, on the producer's own thread, while they are in its cache; the consumer
 * then finds the rows already in place, one after the other, and its batch is a view of them (no copy, no
 * second pass over the bytes on another core). GStreamer's allocation query plays this part there.
 *
 * A row is named by the sample's position in the stream (sf_port.position: every sample and hole the
 * producers' round-robin lanes carried, in the order the consumer reads them). Position p lands in slab
 * (p - base) / rows at row (p - base) % rows, as long as nothing between producer and consumer drops a
 * sample or ends a batch early (a skipped sample, an epoch's short last batch). When the consumer finds a
 * sample at another row of its batch (sf_lent_rows_placed), the rows start afresh at the first batch past
 * where the producers have got to: the rows lent before then are copied as any row is. So the rows decide nothing about the output, only
 * where its bytes are written first: batches are the same with and without lending.
 * Thread-safe (one lock): producers on any thread, the consumer on its own.
 */
#ifndef SF_ENGINE_LENT_ROWS_H
#define SF_ENGINE_LENT_ROWS_H

#include <stdint.h>

#include "shardflow/pool.h"
#include "shardflow/tensor.h"

typedef struct sf_lent_rows sf_lent_rows;

/* Rows of `rows` a slab from pool (the caller keeps its reference: the slabs take their own). NULL: out of memory. */
sf_lent_rows *sf_lent_rows_new(sf_pool *pool, int64_t rows);
void sf_lent_rows_free(sf_lent_rows *l);

/*
 * The row of position p, for a field of that dtype and shape: *row becomes a view of it (C-contiguous, the
 * caller's reference). Not lent (0; *row untouched, or zeroed): another dtype or shape than the first row
 * borrowed since the rows last started afresh, a position before their start, one of a slab older than the
 * eight kept, a row lent already, or no memory for a new slab (the caller's own allocation then says so).
 * Returns 1 when lent, else 0.
 */
int sf_lent_rows_borrow(sf_lent_rows *l, uint64_t p, sf_dtype dtype, int ndim, const int64_t *shape, sf_tensor *row);

/*
 * The consumer put the sample of position p at row `at` of its batch. When that is not where p's row lies,
 * the rows start afresh at a later batch's first position, past every position producers asked for; else
 * the slabs wholly before p, which no producer can borrow from any more, go.
 */
void sf_lent_rows_placed(sf_lent_rows *l, uint64_t p, int64_t at);

/* Rows lent so far, and how many times the slabs started afresh (realigned). */
void sf_lent_rows_counts(sf_lent_rows *l, uint64_t *lent, uint64_t *realigned);

#endif
