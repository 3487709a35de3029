/* Per-shard sample indexes: each sample's key and byte span in its tar shard, and the shard's size and mtime, so samples are read by range (shard_source's order: global / block). */
#ifndef SF_ENGINE_SHARD_INDEX_H
#define SF_ENGINE_SHARD_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shardflow/error.h"

/*
 * The index of one shard. Sample i spans the bytes [offsets[i], offsets[i + 1]) of the shard: its
 * first member's header up to the next sample's first header (or the end-of-archive blocks), so the
 * members passed over between samples (directories, __meta__) travel with the sample before them
 * and a tar reader over the span yields exactly that sample, as reading the whole shard does.
 */
typedef struct sf_shard_index {
  char *url;          /* the shard as indexed (owned) */
  int64_t size;       /* the shard's bytes when it was indexed */
  int64_t mtime_ns;   /* a local shard's modification time then, nanoseconds since 1970; 0 for remote ones */
  char etag[200];     /* a remote shard's ETag then ("" when the server sent none) */
  size_t count;       /* samples */
  int64_t *offsets;   /* count + 1 ascending byte offsets (owned) */
  char **keys;        /* count keys (owned) */
} sf_shard_index;

/* The file name suffix of shardflow's indexes (Megatron-Energon's `.tar.idx` is another format). */
#define SF_SHARD_INDEX_SUFFIX ".sfidx"

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
 * Where the index of url lives: with dir NULL or empty, next to the shard (its path plus
 * SF_SHARD_INDEX_SUFFIX); else in dir, named by the shard's file name and a hash of the whole URL
 * (two shards of one name in different folders get different files). Returns a malloc'd path
 * (caller frees), or NULL when out of memory.
 */
char *sf_shard_index_path(const char *url, const char *dir);

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

/*
 * The index of url as shard_source reads it: SHARD.sfidx in index_dir (NULL or empty: beside the
 * shard), checked against the shard (sf_shard_index_check); else, beside a local shard without
 * index_dir, Megatron-Energon's SHARD.tar.idx; else made from the shard (sf_shard_index_build) and
 * written there, where a failure to write is not an error: *unsaved (may be NULL) gets it (code 0
 * when the index was kept or not made). Returns 0 with *index; SF_EOPTION for a remote shard without
 * index_dir; or the reading, checking and building errors above, in *error.
 */
int sf_shard_index_load(sf_shard_index *index, const char *url, const char *index_dir, sf_error *unsaved,
                        sf_error *error);

/* The local path a shard URL names (a path, or file:///path decoded), malloc'd; NULL for other URLs. */
char *sf_shard_local_path(const char *url);

/*
 * A seeded bijection of [0, n): the position i of an epoch's order maps to sample permute(i) (a
 * Feistel network on the smallest even number of bits that covers n, six rounds keyed by key, walked
 * until it lands below n). O(1) memory, so any position of any epoch is found without the rest:
 * resumes and rank splits need no table. n = 0 or 1 returns i.
 */
uint64_t sf_index_permute(uint64_t i, uint64_t n, uint64_t key);

/* The inverse of sf_index_permute: the position at which sample j comes. */
uint64_t sf_index_unpermute(uint64_t j, uint64_t n, uint64_t key);

/* Frees what index holds and zeroes it. NULL-safe. */
void sf_shard_index_clear(sf_shard_index *index);

#endif
