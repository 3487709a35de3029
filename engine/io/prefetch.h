/* Parallel downloads of whole shards over http(s), s3:// and gs:// on one libcurl multi handle and one thread, with retries and Range resume. */
#ifndef SF_ENGINE_PREFETCH_H
#define SF_ENGINE_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "shardflow/error.h"
#include "shardflow/shard_io.h"

/*
 * The prefetcher's types and most of its functions are public (shardflow/shard_io.h); what only the shard
 * reader calls stays here.
 *
 * A prefetcher runs one thread that drives every download through one libcurl
 * multi handle (so connections to a server are reused from shard to shard).
 * Downloads are started in the order the shards will be read; at most
 * max_transfers run at once and the bytes they hold, not yet read, stay under
 * max_bytes (the download being read may always hold up to 2 MiB more, so it
 * never waits on the ones ahead of it).
 *
 * Faults: a download that fails with a 5xx, 429 or 408 status, a timeout, a
 * reset, a refused connection or a socket that could not be opened for want
 * of file descriptors (SF_EMFILE) is retried after an exponential backoff with
 * jitter (Retry-After is honoured).  When bytes were received before the
 * failure, the retry asks for `Range: bytes=N-` pinned with `If-Match: <ETag>`
 * of the first response (or If-Unmodified-Since with its Last-Modified when
 * there was no strong ETag), so the stream goes on with the byte after the
 * last one received.  A server that answers 200 instead of 206 is accepted
 * only when its ETag equals the first one: the first N bytes are received
 * again and discarded (counted as refetched).  A 412, a different ETag, or a
 * resume without any validator fails the download: two versions of an object
 * are never spliced.
 *
 * A dead server is told apart from a bad shard (options' dead_host_shards):
 * per server (host:port of the request), until one of its downloads brought
 * an answer that was not a hard failure, shards whose attempt failed the
 * same hard way are counted; at the count the server is dead and its
 * downloads fail with SF_EHOSTDOWN without their retries.  Timeouts, resets
 * and 5xx are never hard (they pass); neither is a 404, which a live server
 * sends.
 */

/*
 * After sf_fetch_wait() returned 0: true when the server answered a
 * conditional download 304 Not Modified (the caller's copy is current; there
 * is no body); otherwise *version (may be NULL) gets the validators of the
 * response whose body is being read (empty when the server sent none).
 */
bool sf_fetch_not_modified(sf_fetch *fetch, sf_object_version *version);

/*
 * Marks fetch as the one being read (it may then use its 2 MiB reserve) and
 * waits until its first bytes, its end or its failure.  cancelled (may be
 * NULL) is asked every ~100 ms: true ends the wait with SF_ECANCELED.
 * Returns 0 when bytes or a clean end are there; the download's error when it
 * failed before its first byte (SF_ENOENT for 404/410, SF_ENET, SF_ETIMEDOUT,
 * SF_EDENIED, SF_EIO for a changed object, SF_EMFILE when no socket could be
 * opened for want of file descriptors, after the retries; SF_EHOSTDOWN when its
 * server is dead, see above); *error names the URL (credentials redacted) and
 * what to do.
 */
int sf_fetch_wait(sf_fetch *fetch, bool (*cancelled)(void *), void *cancel_opaque, sf_error *error);

#endif
