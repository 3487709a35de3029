/* shardflow refcounted byte buffers: one allocation handed along the graph without copies. */
#ifndef SHARDFLOW_BUFFER_H
#define SHARDFLOW_BUFFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * A refcounted, immutable-when-shared byte buffer (FFmpeg's AVBufferRef rule:
 * writable only while it holds a single reference).  Thread-safe refcount.
 */
typedef struct sf_buffer sf_buffer;

/** Called when the last reference goes; releases data allocated elsewhere. */
typedef void (*sf_buffer_free_fn)(void *opaque, uint8_t *data);

/**
 * Allocates a buffer of size bytes (uninitialised; header and data in one
 * allocation, data aligned to 16 bytes).  size may be 0.
 * Returns a new buffer with one reference (caller owns it), or NULL when out
 * of memory.
 */
SF_API sf_buffer *sf_buffer_new(size_t size);

/**
 * Wraps memory owned elsewhere; free_fn(opaque, data) runs when the last
 * reference is dropped (free_fn may be NULL for static memory).
 * Returns a new buffer with one reference, or NULL when out of memory (then
 * free_fn is NOT called: the caller still owns data).
 */
SF_API sf_buffer *sf_buffer_wrap(uint8_t *data, size_t size, sf_buffer_free_fn free_fn,
                                 void *opaque);

/** Adds a reference.  Returns buffer (transfer: the caller owns the new reference). */
SF_API sf_buffer *sf_buffer_ref(sf_buffer *buffer);

/** Drops the reference *buffer and sets *buffer to NULL.  NULL-safe. */
SF_API void sf_buffer_unref(sf_buffer **buffer);

/** First byte of the buffer (borrowed; valid while a reference is held). */
SF_API uint8_t *sf_buffer_data(const sf_buffer *buffer);

/** Size in bytes. */
SF_API size_t sf_buffer_size(const sf_buffer *buffer);

/** True when only one reference exists, i.e. the holder may write into it. */
SF_API bool sf_buffer_is_writable(const sf_buffer *buffer);

/**
 * Shrinks the visible size (never grows it; the memory stays allocated).
 * Returns 0, or SF_EINVAL when size is larger than the current size.
 */
SF_API int sf_buffer_set_size(sf_buffer *buffer, size_t size);

#ifdef __cplusplus
}
#endif
#endif
