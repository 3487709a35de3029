/* shardflow device pools: batches moved to GPU memory, for a sink that hands them to the trainer there. */
#ifndef SHARDFLOW_DEVICE_H
#define SHARDFLOW_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"
#include "shardflow/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * A device pool moves batches from host to GPU memory: each batch is packed into a pinned host
 * buffer (a few, reused once their copy is done), copied with one asynchronous host-to-device copy on
 * the pool's own stream into one device buffer (reused when the trainer has dropped every tensor of
 * its batch), and an event recorded after the copy orders the trainer's stream (sf_dlpack_wait,
 * dlpack.h). Reference-counted inside: the owner's reference and one per device buffer out, so
 * tensors the trainer still holds stay valid after the sink that made them is gone. device_sink's
 * `device: cuda[:N]` is built on it; a plugin's sink can use it the same way. The CUDA driver
 * (libcuda.so.1, or the file the SF_CUDA_LIBRARY environment variable names) is loaded at run time,
 * never a build dependency.
 */
typedef struct sf_device_pool sf_device_pool;

/**
 * Opens GPU `ordinal` (0 for the first; CUDA_VISIBLE_DEVICES applies) for moving batches: loads the
 * CUDA driver the first time (once per process), takes the GPU's primary context (shared with PyTorch
 * and JAX) and creates a non-blocking stream. Returns 0 with *pool (transfer full: release it with
 * sf_device_pool_destroy); SF_EOPTION when this machine cannot give that GPU (no CUDA driver, a driver
 * that does not start, or no GPU `ordinal`: the message says which, and how many GPUs there are), which
 * a stage reports against its device option; SF_EUNSUPPORTED for another driver error; SF_ENOMEM.
 * *error says which. Thread-safe.
 */
SF_API int sf_device_pool_open(sf_device_pool **pool, int ordinal, sf_error *error);

/**
 * Drops the owner's reference and stops the wake calls (sf_device_pool_set_wake); device buffers the
 * trainer still holds keep the pool's memory until released. NULL-safe; sets *pool to NULL.
 */
SF_API void sf_device_pool_destroy(sf_device_pool **pool);

/**
 * wake(arg) is called (on any thread, under the pool's lock: it must not call back into the pool) each
 * time the trainer takes a batch (its first DLPack export) or drops it untaken, so that a sink waiting
 * on sf_device_pool_ahead() steps again (sf_node_notify, stage.h). wake NULL stops the calls: once this
 * returns, none is running. arg is borrowed: it must outlive the calls.
 */
SF_API void sf_device_pool_set_wake(sf_device_pool *pool, void (*wake)(void *arg), void *arg);

/** Batches moved by pool that the trainer has not taken yet (prefetched), >= 0. Any thread. */
SF_API int sf_device_pool_ahead(sf_device_pool *pool);

/**
 * Normalising one uint8 image field on the GPU while it moves: each value x of channel c becomes
 * tables[c][x] (device_sink's tables hold (x/255 - mean[c]) / std[c], the values of augment's dtype
 * float32 or bfloat16), and the field becomes [B,C,H,W] of dtype.
 */
typedef struct sf_device_normalize {
  int field;          /* index of the batch field: uint8, [B,H,W,C] (hwc) or [B,C,H,W]; -1 = none */
  bool hwc;           /* the field's layout: true for [B,H,W,C] */
  sf_dtype dtype;     /* SF_DTYPE_FLOAT32 or SF_DTYPE_BFLOAT16 */
  const void *tables; /* C tables of 256 values of dtype, one per channel, contiguous (borrowed for the call) */
} sf_device_normalize;

/**
 * Moves every field of *batch to the GPU, in place: on return each field's tensor is a contiguous view
 * of the batch's device buffer (dtype and shape kept; DLPack exports say kDLCUDA and the pool's GPU),
 * except the normalised field (nm non-NULL with field >= 0), which becomes [B,C,H,W] of nm->dtype. Keys,
 * origins, epoch and index stay; the fields' host buffers are unreferenced. The copy is asynchronous: the host may
 * run ahead, and the trainer's stream waits for it through sf_dlpack_wait. Returns 0; on failure the
 * batch is unchanged (the caller still owns it) and *error says why: SF_ENOMEM (pinned or device memory
 * exhausted: the message says how much was asked for and what to lower), SF_ESHAPE (a field that cannot
 * be normalised), SF_EINVAL (nm names no field of the batch, has no tables or another dtype),
 * SF_EUNSUPPORTED (another driver error, e.g. the kernel would not load). nm is borrowed.
 */
SF_API int sf_device_pool_move(sf_device_pool *pool, sf_batch *batch, const sf_device_normalize *nm,
                               sf_error *error);

/** What a pool holds: for stats (a steady run stops adding to the allocation counts), tests and leak checks. */
typedef struct sf_device_pool_stats {
  size_t pinned_buffers, pinned_bytes;   /* pinned host staging buffers allocated, and their bytes */
  size_t device_buffers, device_bytes;   /* device buffers allocated (out and idle), and their bytes */
  size_t idle_buffers;                   /* of those, on the free list */
  uint64_t batches;                      /* batches moved */
  uint64_t pinned_allocs, device_allocs; /* allocations ever made (a steady run stops adding to them) */
} sf_device_pool_stats;

/** Fills *stats with what pool holds now (a snapshot, taken under the pool's lock). */
SF_API void sf_device_pool_stats_get(sf_device_pool *pool, sf_device_pool_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
