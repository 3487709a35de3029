/*
 * A local shard cache: a directory of whole shards downloaded before, with a
 * size cap and least-recently-used eviction, safe when several processes
 * share the directory (flock(2) on an index lock; files appear by rename(2)).
 * Contract header: engine/shard_cache.c implements it.
 */
#ifndef SF_ENGINE_SHARD_CACHE_H
#define SF_ENGINE_SHARD_CACHE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "shardflow/error.h"

typedef struct sf_shard_cache sf_shard_cache;

/* Opens (creating) dir with a cap of max_bytes (> 0).  Returns 0, SF_EIO, SF_EINVAL. */
int sf_shard_cache_open(sf_shard_cache **cache, const char *dir, int64_t max_bytes, sf_error *error);
void sf_shard_cache_close(sf_shard_cache **cache);

/*
 * Looks url up: returns an open read-only fd of the cached shard (and marks
 * it recently used) or -1 when it is not cached.  An fd stays valid even if
 * another process evicts the file meanwhile.
 */
int sf_shard_cache_lookup(sf_shard_cache *cache, const char *url, int64_t *size);

/*
 * Starts storing url: returns an fd of a new temporary file in the cache
 * directory to write the shard to, or -1 (the cache then just is not used).
 */
typedef struct sf_shard_cache_entry sf_shard_cache_entry;
int sf_shard_cache_begin(sf_shard_cache *cache, const char *url, sf_shard_cache_entry **entry);
/* Appends bytes to the entry (errors make the entry abort quietly at commit). */
void sf_shard_cache_write(sf_shard_cache_entry *entry, const void *data, size_t size);
/* complete: the whole shard was written; publish it and evict LRU shards over the cap. Otherwise discard. */
void sf_shard_cache_end(sf_shard_cache *cache, sf_shard_cache_entry **entry, bool complete);

/* Counters: hits, misses, bytes evicted. */
void sf_shard_cache_stats(const sf_shard_cache *cache, uint64_t *hits, uint64_t *misses, uint64_t *evicted_bytes);

#endif
