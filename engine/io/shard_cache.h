/*
 * A local shard cache: a directory of whole shards downloaded before, with a
 * size cap and least-recently-used eviction, safe when several processes
 * share the directory (flock(2) on an index lock; files appear by rename(2)).
 *
 * Layout of the directory:
 *   <64 hex digits of SHA-256(url)>.shard   a complete shard (never partial) after a short
 *                                           header naming its version (below)
 *   .tmp-<pid>-<n>                          a shard being written by process pid
 *   .lock                                   flock(2) target serialising publish + evict
 * Recency is the entry's mtime, set explicitly (nanoseconds from
 * CLOCK_REALTIME) when it is published and on every hit, so no index file
 * can go stale: the directory itself is the index. Publishing (evict, then
 * rename) runs under an exclusive flock of .lock, opened afresh each time so
 * that threads of one process exclude each other too. Lookups take no lock:
 * an open fd stays valid when another process evicts (unlinks) the file.
 * The cap counts published entries only; shards still being written (temp
 * files) are not counted until they are published. Temp files of dead
 * processes are removed by the next publish.
 *
 * An entry is served only after the server confirmed that its version is
 * still current (a conditional GET answered 304), so a shard replaced on the
 * server is never read stale. The version travels inside the entry, so that
 * one rename publishes shard and version together:
 *   "SFCACHE1\n" ["ETag: <etag>\n"] ["Last-Modified: <date>\n"] "\n" <the shard's bytes>
 * A file without this header (written by an older shardflow) is a miss.
 */
#ifndef SF_ENGINE_SHARD_CACHE_H
#define SF_ENGINE_SHARD_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "prefetch.h"
#include "shardflow/error.h"
#include "shardflow/shard_io.h"

/* sf_shard_cache_open, _close, _lookup and _stats_get are public (shardflow/shard_io.h); the reader's part is here. */

/** Length of an entry's file name (64 hex digits + ".shard"), without the NUL. */
#define SF_SHARD_CACHE_NAME_LEN 70

/*
 * The file name (relative to the cache directory) under which url is cached:
 * SF_SHARD_CACHE_NAME_LEN characters + NUL written to name. Callers should
 * pass a stable key (no presigned-query signatures: they change per request).
 */
void sf_shard_cache_name(const char *url, char name[SF_SHARD_CACHE_NAME_LEN + 1]);

/* Counts what the server said of a looked-up entry: current (a hit) or not (stale: downloaded again). */
void sf_shard_cache_revalidated(sf_shard_cache *cache, bool current);

typedef struct sf_shard_cache_entry sf_shard_cache_entry;

/*
 * Starts storing url at version (the response's validators): creates a new
 * temporary file in the cache directory, writes the header and returns its fd
 * (owned by *entry: do not close it; the caller may write the shard to it
 * directly or through sf_shard_cache_write), with *entry set; or -1 with
 * *entry NULL (the cache then just is not used for this shard) — also for a
 * version with neither an ETag nor a date, which could never be revalidated.
 */
int sf_shard_cache_begin(sf_shard_cache *cache, const char *url, const sf_object_version *version,
                         sf_shard_cache_entry **entry);

/* Appends size bytes to the entry (errors make the entry abort quietly at end). NULL entry: no-op. */
void sf_shard_cache_write(sf_shard_cache_entry *entry, const void *data, size_t size);

/*
 * Ends *entry (NULL is fine) and sets it to NULL. complete: the whole shard
 * was written; the file is flushed (fdatasync), least-recently-used entries
 * are evicted until it fits under the cap, and it is renamed into place
 * (replacing an equal copy another process may have published). A shard
 * larger than the whole cap, a write error, or !complete discards it.
 * Never fails visibly: a cache is an optimisation.
 */
void sf_shard_cache_end(sf_shard_cache *cache, sf_shard_cache_entry **entry, bool complete);

#endif
