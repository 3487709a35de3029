/* Streaming reads of one shard by URL: plain path, file://, http(s)://, s3://, gs:// (engine/io/prefetch.h), pipe:CMD. */
#ifndef SF_ENGINE_SHARD_READER_H
#define SF_ENGINE_SHARD_READER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "prefetch.h"
#include "shardflow/buffer.h"
#include "shardflow/error.h"
#include "shardflow/shard_io.h"

/* sf_shard_reader, its options, open, read, ready, offset and close are public (shardflow/shard_io.h). */

/*
 * A local file opened with options->mmap: the whole file as it was at open, mapped copy-on-write
 * (borrowed; take a reference to keep it past the reader). The chunks sf_shard_reader_read() returns
 * are consecutive pieces of it. NULL for other sources, empty files and when mapping failed.
 * A mapped file that shrinks while mapped makes a read of the lost pages raise SIGBUS: shards are
 * replaced by renaming a new file over the old one, which leaves the mapping intact.
 */
sf_buffer *sf_shard_reader_mapping(const sf_shard_reader *reader);

#endif
