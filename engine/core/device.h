/* Batches moved to a GPU: pinned staging buffers, device buffers, a stream and events of their own, reused. */
#ifndef SF_ENGINE_DEVICE_H
#define SF_ENGINE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_driver.h"
#include "shardflow/sample.h"

/*
 * A device pool moves batches from host to GPU memory for the device sink (stages/device_sink.c):
 * each batch is packed into a pinned host buffer (cuMemHostAlloc; a few, reused once their copy is
 * done), copied with one cuMemcpyHtoDAsync on the pool's own stream into one device buffer (reused
 * when the trainer has dropped every tensor of its batch), and an event recorded after the copy
 * orders the trainer's stream (sf_dlpack_wait). Reference-counted: the owner's reference and one per
 * device buffer out, so tensors the trainer still holds stay valid after the sink is gone.
 * Everything goes through an sf_cuda_api table: the driver (sf_cuda_load) or a unit test's fake.
 */
typedef struct sf_device_pool sf_device_pool;

/*
 * Opens GPU `ordinal` through api: its primary context (shared with PyTorch and JAX), a non-blocking
 * stream. Returns 0 with *pool (the caller owns it: sf_device_pool_destroy), SF_EOPTION when there is
 * no such GPU (the message gives how many there are), SF_EUNSUPPORTED for another driver error,
 * SF_ENOMEM; *error says which. Borrows api (static or outliving every buffer).
 */
int sf_device_pool_new(sf_device_pool **pool, const sf_cuda_api *api, int ordinal, sf_error *error);

/* Drops the owner's reference (buffers still out keep the rest until released). NULL-safe; sets *pool to NULL. */
void sf_device_pool_destroy(sf_device_pool **pool);

/*
 * wake(arg) is called (any thread, under the pool's lock: it must not call back into the pool) each
 * time the trainer takes a batch (its first DLPack export) or drops it untaken, so that a sink waiting
 * on sf_device_pool_ahead() steps again. NULL stops the calls: after it returns, none is running.
 */
void sf_device_pool_set_wake(sf_device_pool *pool, void (*wake)(void *arg), void *arg);

/* Batches moved by this pool that the trainer has not taken yet (prefetched). */
int sf_device_pool_ahead(sf_device_pool *pool);

/* Normalising one uint8 image field on the device: values through per-channel tables (augment's). */
typedef struct sf_device_normalize {
  int field;          /* index of the batch field: uint8, [B,H,W,C] (hwc) or [B,C,H,W]; -1 = none */
  bool hwc;           /* the field's layout */
  sf_dtype dtype;     /* SF_DTYPE_FLOAT32 or SF_DTYPE_BFLOAT16 */
  const void *tables; /* C tables of 256 values of dtype, one per channel, contiguous (borrowed) */
} sf_device_normalize;

/*
 * Moves every field of *batch to the GPU, in place: on return each field's tensor is a contiguous view
 * of the batch's device buffer (dtype and shape kept), except the normalised field (nm non-NULL with
 * field >= 0), which becomes [B,C,H,W] of nm->dtype. Keys, origins, epoch and index stay. The copy
 * is asynchronous: the host may run ahead, and the trainer's stream waits through sf_dlpack_wait.
 * Returns 0; on failure the batch is unchanged and *error says why: SF_ENOMEM (pinned or device memory
 * exhausted: the message says how much was asked for and what to lower), SF_ESHAPE (a field that cannot
 * be normalised), SF_EUNSUPPORTED (another driver error, e.g. the kernel would not load).
 */
int sf_device_pool_move(sf_device_pool *pool, sf_batch *batch, const sf_device_normalize *nm, sf_error *error);

/* What a pool holds, for tests and leak checks. */
typedef struct sf_device_pool_stats {
  size_t pinned_buffers, pinned_bytes;   /* staging buffers allocated (cuMemHostAlloc) */
  size_t device_buffers, device_bytes;   /* device buffers allocated (cuMemAlloc), out and idle */
  size_t idle_buffers;                   /* of those, on the free list */
  uint64_t batches;                      /* batches moved */
  uint64_t pinned_allocs, device_allocs; /* allocations ever made (a steady run stops adding to them) */
} sf_device_pool_stats;

void sf_device_pool_stats_get(sf_device_pool *pool, sf_device_pool_stats *stats);

#endif
