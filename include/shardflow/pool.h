/* shardflow buffer pools: batch-sized buffers reused instead of freshly mapped for every batch. */
#ifndef SHARDFLOW_POOL_H
#define SHARDFLOW_POOL_H

#include <stddef.h>

#include "shardflow/buffer.h"
#include "shardflow/error.h"
#include "shardflow/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * A thread-safe pool of buffers, reused by exact size (a batch stage asks for
 * the same size every time).  A buffer taken from the pool
 * goes back to it when its last reference is dropped, from any thread; the
 * pool itself is refcounted by its buffers, so a buffer (and a tensor over it)
 * that outlives the pipeline stays valid.  Fresh pages cost a page fault each
 * (about a quarter of a millisecond per 1 MiB): reuse keeps that off the hot path.
 */
typedef struct sf_pool sf_pool;

/**
 * Creates a pool that keeps at most max_free idle buffers (extra ones are freed).
 * Returns the pool (caller owns one reference) or NULL when out of memory.
 */
SF_API sf_pool *sf_pool_new(size_t max_free);

/**
 * Takes a buffer of exactly size bytes (contents undefined), reusing an idle
 * one of that size when there is one.  Returns a new reference (caller owns
 * it) or NULL when out of memory.
 */
SF_API sf_buffer *sf_pool_get(sf_pool *pool, size_t size);

/**
 * True when buffer came from pool (sf_pool_get, sf_pool_tensor): so, for a pinned pool, pinned memory. False
 * for NULL and for any other buffer.
 */
SF_API bool sf_pool_owns(const sf_pool *pool, const sf_buffer *buffer);

/** Number of buffers the pool has allocated in all (for tests: reuse keeps it flat). */
SF_API size_t sf_pool_allocated(const sf_pool *pool);

/**
 * Makes *tensor a fresh contiguous tensor whose buffer comes from pool
 * (contents undefined).  Returns 0, SF_EINVAL for a bad shape, SF_ENOMEM.
 * The caller owns the tensor (sf_tensor_clear() returns the buffer to the pool).
 */
SF_API int sf_pool_tensor(sf_pool *pool, sf_tensor *tensor, sf_dtype dtype, int ndim, const int64_t *shape);

/**
 * Pins the buffers the pool allocates from now on (page-locked host memory, registered with the CUDA
 * runtime's cudaHostRegister, so that copies to a GPU run asynchronously and at full speed). The CUDA
 * runtime (libcudart.so.13, .12, .11 or libcudart.so) is loaded at run time, never a build dependency; the
 * first call checks that it can pin memory here. Call it before the pool hands out buffers. Returns 0, or
 * SF_EUNSUPPORTED with *error saying what is missing (the library, a GPU, a driver) and what to do, or
 * SF_ENOMEM; the pool is then unchanged.
 */
SF_API int sf_pool_pin(sf_pool *pool, sf_error *error);

/** Drops the caller's reference; the pool goes when its last buffer returns. NULL-safe. */
SF_API void sf_pool_unref(sf_pool **pool);

#ifdef __cplusplus
}
#endif
#endif
