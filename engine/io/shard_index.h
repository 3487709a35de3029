/* Per-shard sample indexes (the public part: include/shardflow/index.h): each sample's key and byte span in its tar shard, and the shard's size and mtime, so samples are read by range (shard_source's order: global / block). */
#ifndef SF_ENGINE_SHARD_INDEX_H
#define SF_ENGINE_SHARD_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shardflow/error.h"
#include "shardflow/index.h"


/*
 * Indexes a shard (a path or file:// URL, or an http(s), s3 or gs URL, of an uncompressed tar) by
 * reading it once through the tar reader (engine/io/tar_reader.h) with WebDataset's grouping rule; a
 * remote shard's ETag is recorded from the download. Returns 0 with *index filled (free with
 * sf_shard_index_clear); SF_EUNSUPPORTED for a pipe:, compressed or TFRecord shard (a byte range of
 * those is no sample); the reader's errors (SF_ENOENT, SF_ENET, SF_EFORMAT, SF_EDUP, SF_ETOOBIG...) for
 * a shard that does not read cleanly: an index must describe every sample. *error names the shard,
 * the offset and what to do.
 */
int sf_shard_index_build(sf_shard_index *index, const char *url, sf_error *error);

/*
 * Writes index to path (a temporary file renamed over it, so readers never see half an index).
 * Returns 0, or SF_EIO with *error naming path and the system's reason.
 */
int sf_shard_index_write(const sf_shard_index *index, const char *path, sf_error *error);

/*
 * Reads the index at path. Returns 0 with *index filled; SF_ENOENT when there is none;
 * SF_EFORMAT with *error naming the file and line of what is malformed; SF_ENOMEM.
 */
int sf_shard_index_read(sf_shard_index *index, const char *path, sf_error *error);

/* The same from an open stream (borrowed, read to where the index ends); path names it in messages. */
int sf_shard_index_read_stream(sf_shard_index *index, FILE *stream, const char *path, sf_error *error);

/*
 * Reads Megatron-Energon's index of a local shard (`energon prepare` writes SHARD.tar.idx next to
 * SHARD.tar: the byte offset of each sample's first member header, then the end of the last sample,
 * as native 64-bit integers; energon groups members by the same first-dot rule). It records no size
 * or mtime, so the shard's are taken, and an index older than its shard is stale. Returns 0 with
 * *index (keys NULL); SF_ENOENT when there is none; SF_EIO when it is older than the shard (the
 * message names both files); SF_EFORMAT when its offsets cannot be a tar's samples; SF_ENOMEM.
 */
int sf_shard_index_read_energon(sf_shard_index *index, const char *url, sf_error *error);

/*
 * Checks that index still describes the local shard at url: its size and modification time are
 * those the index recorded (a remote shard's ETag is checked by each ranged read instead: 0 here). Returns 0; SF_EIO (stale: the message names the shard and index_path, what
 * changed, and the `shardflow index` command that rebuilds it); SF_ENOENT when the shard is gone.
 */
int sf_shard_index_check(const sf_shard_index *index, const char *url, const char *index_path, sf_error *error);



#endif
