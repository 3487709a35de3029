/* shardflow sample indexes: each shard's samples by byte span, and the seeded bijection that orders them (shard_source's order: global / block). */
#ifndef SHARDFLOW_INDEX_H
#define SHARDFLOW_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * The index of one shard. Sample i spans the bytes [offsets[i], offsets[i + 1]) of the shard: its
 * first member's header up to the next sample's first header (or the end-of-archive blocks), so the
 * members passed over between samples (directories, __meta__) travel with the sample before them
 * and a tar reader over the span yields exactly that sample, as reading the whole shard does.
 * Filled by sf_shard_index_load(); freed with sf_shard_index_clear().
 */
typedef struct sf_shard_index {
  char *url;          /**< the shard as indexed (owned) */
  int64_t size;       /**< the shard's bytes when it was indexed */
  int64_t mtime_ns;   /**< a local shard's modification time then, nanoseconds since 1970; 0 for remote ones */
  char etag[200];     /**< a remote shard's ETag then ("" when the server sent none) */
  size_t count;       /**< samples */
  int64_t *offsets;   /**< count + 1 ascending byte offsets (owned) */
  char **keys;        /**< count keys (owned), or NULL (an index that records none: Megatron-Energon's) */
} sf_shard_index;

/** The file name suffix of shardflow's indexes (Megatron-Energon's `.tar.idx` is another format). */
#define SF_SHARD_INDEX_SUFFIX ".sfidx"

/**
 * The index of the shard at url as shard_source reads it: SHARD.sfidx in index_dir (NULL or empty:
 * beside the shard), checked against the shard (a local shard's size and mtime; a remote one's ETag
 * is checked by every ranged read); else, beside a local shard without index_dir,
 * Megatron-Energon's SHARD.tar.idx (stale when older than the shard); else made by reading the
 * shard once and written there, where a failure to write is not an error: *unsaved (may be NULL)
 * gets it (code 0 when the index was kept or not made). Returns 0 with *index (the caller frees it
 * with sf_shard_index_clear); SF_EOPTION for a remote shard without index_dir; SF_EIO for a stale
 * index (the message names the index and the shard, and the command that rebuilds it); SF_EFORMAT
 * for a malformed one (its file and line); SF_EUNSUPPORTED for a compressed, TFRecord or pipe:
 * shard; the shard's read errors (SF_ENOENT, SF_ENET, SF_EFORMAT...); SF_ENOMEM. *error says what.
 */
SF_API int sf_shard_index_load(sf_shard_index *index, const char *url, const char *index_dir, sf_error *unsaved,
                               sf_error *error);

/** Frees what index holds and zeroes it. NULL-safe. */
SF_API void sf_shard_index_clear(sf_shard_index *index);

/**
 * Where the index of url lives: with dir NULL or empty, next to the shard (its path plus
 * SF_SHARD_INDEX_SUFFIX); else in dir, named by the shard's file name and a hash of the whole URL
 * (two shards of one name in different folders get different files). Returns a malloc'd path
 * (caller frees), or NULL when out of memory.
 */
SF_API char *sf_shard_index_path(const char *url, const char *dir);

/**
 * A seeded bijection of [0, n): position i of an epoch's order maps to sample sf_index_permute(i)
 * (a Feistel network on the smallest even number of bits that covers n, six rounds keyed by key,
 * walked until it lands below n). O(1) memory, so any position of any epoch is found without the
 * rest: resumes and rank splits need no table. Returns i itself for n < 2 or i >= n.
 */
SF_API uint64_t sf_index_permute(uint64_t i, uint64_t n, uint64_t key);

/** The inverse of sf_index_permute(): the position at which sample j comes. */
SF_API uint64_t sf_index_unpermute(uint64_t j, uint64_t n, uint64_t key);

/**
 * Dealing an epoch's positions in rounds (shard_source's and mix's deal): the k-th position (from 0) of rank
 * `rank` of `ranks`, loader worker `worker` of `workers`, among the positions [base, limit). Round i of deal x
 * ranks positions from base gives rank r positions base + i x deal x ranks + r x deal .. + deal - 1, read by
 * worker i mod workers; the short last round (the rest below deal x ranks) is dealt a position at a time, so
 * rank r takes its positions r, r + ranks, ... Returns limit when the slot has no k-th position. deal >= 1.
 */
SF_API uint64_t sf_index_deal_position(uint64_t k, uint64_t base, uint64_t limit, uint64_t deal, uint64_t ranks,
                                       uint64_t rank, uint64_t workers, uint64_t worker);

/**
 * mix by position (its inputs each shard_source order: global, dealt): the input that mixed position p of
 * epoch comes from, a weighted choice of [0, n) that depends only on (seed, epoch, p), so any rank finds any
 * position's input without the others' draws. h = sf_seed_mix(sf_seed_mix(sf_seed_mix(seed, epoch),
 * 0x6d6978), p); u = (h >> 11) x 2^-53 in [0, 1); with w_i = weights[i] / max(weights) and T their sum,
 * the first i with u x T < w_0 + ... + w_i (an input of weight 0 is never chosen; rounding past the sum gives
 * the last input of weight > 0). weights: n finite values >= 0, one > 0 (mix checks them).
 */
SF_API int sf_index_mix_pick(uint64_t seed, uint64_t epoch, uint64_t p, const double *weights, int n);

/**
 * mix by position with stop: first: the mixed positions of epoch, at most limit: those before the first
 * position p whose pick j = sf_index_mix_pick(seed, epoch, p, weights, n) was already drawn sizes[j] times
 * before p (it would be input j's sizes[j] + 1-th sample, one more than its dataset holds), or limit when
 * no such p comes before it. Every rank and worker replays the same draws, so all find the same end; the
 * cost is one pick per position. sizes: n dataset sizes (samples); weights as sf_index_mix_pick's;
 * 1 <= n <= SF_NODE_INPUTS_MAX (0 otherwise).
 */
SF_API uint64_t sf_index_mix_end(uint64_t seed, uint64_t epoch, const double *weights, const uint64_t *sizes, int n,
                                 uint64_t limit);

#ifdef __cplusplus
}
#endif

#endif
