/*
 * Buffers that map a file (a local shard, engine/io/shard_reader.c): their pages are the page cache's,
 * clean and reclaimable, so a view of a few bytes keeps little memory alive however large the
 * mapping is. Engine-internal: what augment weighs before deferring work that holds its source.
 */
#ifndef SF_BUFFER_FILE_H
#define SF_BUFFER_FILE_H

#include <stdbool.h>

#include "shardflow/buffer.h"

/** sf_buffer_wrap() of a file mapping: the same, and sf_buffer_is_file() says so. */
sf_buffer *sf_buffer_wrap_file(uint8_t *data, size_t size, sf_buffer_free_fn free_fn, void *opaque);

/** True for a buffer made by sf_buffer_wrap_file(); false for NULL and every other buffer. */
bool sf_buffer_is_file(const sf_buffer *buffer);

#endif
