/* Parallel downloads of whole shards over http(s), s3:// and gs:// on one libcurl multi handle and one thread, with retries and Range resume. */
#ifndef SF_ENGINE_PREFETCH_H
#define SF_ENGINE_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "shardflow/error.h"

/*
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
typedef struct sf_prefetch sf_prefetch;

/* One version of a remote object: the validators of the response that brought it (either may be empty). */
typedef struct sf_object_version {
  char etag[200];
  char last_modified[64];
} sf_object_version;

/* One shard's download, owned by whoever started it until sf_fetch_close(). */
typedef struct sf_fetch sf_fetch;

typedef struct sf_prefetch_options {
  int max_transfers;        /* downloads running at once; 0 = 3 */
  int64_t max_bytes;        /* bytes held for unread data over all downloads; 0 = 64 MiB */
  double connect_timeout;   /* seconds; 0 = 10 s */
  double stall_timeout;     /* seconds under 1 byte/s before an attempt fails; 0 = 30 s */
  int retries;              /* retries after failures that brought no new byte; 0 = none */
  double retry_wait;        /* seconds, first backoff (doubles each time); 0 = 0.1 s */
  double retry_max_wait;    /* seconds, longest single wait (Retry-After included); 0 = 30 s */
  /* Called (may be NULL) on the download thread, with no lock held, after bytes became readable or a
   * download ended, failed or began a backoff: a caller polling with sf_fetch_ready() (a step that
   * must not block) is told to look again.  wake_opaque is passed through (borrowed). */
  void (*wake)(void *opaque);
  void *wake_opaque;
  /* A server that has served no shard yet and failed this many shards in a row the same hard way
   * (connection refused or otherwise impossible, a name that does not resolve, a TLS failure, HTTP
   * 401 or 403) is dead: those downloads and every later one from it fail at once with
   * SF_EHOSTDOWN, one message naming the server, the cause and what to do.  0: never. */
  int dead_host_shards;
  const char *ca_file;      /* PEM file of the CAs trusted for https (copied); NULL: see sf_http_easy_new() */
} sf_prefetch_options;

/* Counters over the prefetcher's life (all downloads). */
typedef struct sf_prefetch_stats {
  uint64_t shards;          /* downloads started */
  uint64_t bytes;           /* body bytes received */
  uint64_t refetched_bytes; /* of which were received a second time and discarded */
  uint64_t retries;         /* attempts made after a failure */
  uint64_t resumes;         /* of which asked for a Range from a byte > 0 */
  uint64_t failed;          /* downloads that failed for good */
  uint64_t not_modified;    /* of the shards, revalidations answered 304: the cached copy is current */
  uint64_t completed;       /* downloads that received their whole body (not the 304s) */
  uint64_t completed_bytes; /* the body bytes of those: their mean is a shard's size */
  uint64_t held_bytes;      /* bytes the blocks of every download hold now (a gauge, not a counter) */
} sf_prefetch_stats;

/*
 * Starts a prefetcher and its thread.  options may be NULL (defaults).
 * Returns 0; SF_ENET (libcurl did not initialise), SF_EMFILE (out of file
 * descriptors), SF_ENOMEM.  The caller
 * owns *prefetch and frees it with sf_prefetch_destroy().
 */
int sf_prefetch_new(sf_prefetch **prefetch, const sf_prefetch_options *options, sf_error *error);

/*
 * Stops the thread and frees the prefetcher; downloads not yet closed are
 * closed too (their sf_fetch pointers must not be used afterwards).  Sets
 * *prefetch to NULL.  NULL-safe.
 */
void sf_prefetch_destroy(sf_prefetch **prefetch);

/* Copies the counters into *stats.  Thread-safe. */
void sf_prefetch_stats_get(sf_prefetch *prefetch, sf_prefetch_stats *stats);

/*
 * Changes how many downloads run at once (options' max_transfers; < 1 is
 * taken as 1) while the prefetcher runs: a tuner raising or lowering the
 * shards read ahead.  Downloads already running beyond a lowered count finish;
 * no new one starts until fewer run.  Thread-safe (the fetcher thread reads it
 * under the prefetcher's lock).
 */
void sf_prefetch_set_max_transfers(sf_prefetch *prefetch, int max_transfers);

/*
 * The bytes a download of `bytes` body bytes holds against max_bytes once it
 * is complete and unread: data moves in blocks of 512 KiB, so a 20 KB shard
 * holds one whole block.  A tuner counts how many shards the budget holds with it.
 */
int64_t sf_prefetch_footprint(int64_t bytes);

/*
 * Queues a download of url (sf_url_is_remote(): http, https, s3 or gs; s3/gs requests are signed
 * through sf_object_request_prepare() for every attempt).  It starts as soon
 * as fewer than max_transfers run.  cached (may be NULL; copied) is the
 * version of a copy the caller holds: the request is then conditional
 * (If-None-Match with its ETag, else If-Modified-Since with its date), and a
 * 304 answer ends the download with no body (sf_fetch_not_modified()).
 * Returns 0 with *fetch (owned by the caller: close it with sf_fetch_close());
 * SF_EINVAL (not a remote URL), SF_ENOMEM.
 */
int sf_prefetch_start(sf_prefetch *prefetch, const char *url, const sf_object_version *cached, sf_fetch **fetch,
                      sf_error *error);

/*
 * Queues a download of the bytes [offset, offset + length) of url (an indexed read of samples), as
 * sf_prefetch_start() does a whole object's: the same retries, resumed inside the range. if_match (may be
 * NULL or empty; copied) is the ETag the object must still have (the index's): every request carries
 * If-Match with it (a strong one; a weak ETag, which If-Match never matches, is only compared with the
 * answer's), and an answer with another ETag, or a 412, fails the download with SF_EIO ("changed since
 * it was indexed"). A server that answers anything but 206 with these bytes fails it with
 * SF_EUNSUPPORTED. Returns 0 with *fetch (owned by the caller: sf_fetch_close()); SF_EINVAL (not a remote
 * URL, length < 1), SF_ENOMEM.
 */
int sf_prefetch_start_range(sf_prefetch *prefetch, const char *url, int64_t offset, int64_t length,
                            const char *if_match, sf_fetch **fetch, sf_error *error);

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

/*
 * The non-blocking check for callers that must not wait (a stage's step):
 * true when sf_fetch_wait() or the next sf_fetch_read()s would not wait for
 * `bytes` bytes (at least one): they are received and readable, or the
 * download ended (cleanly or not: the read reports it), or it is paused
 * because its buffers are full (reading frees them).  Marks fetch as the one
 * being read, like sf_fetch_wait().  When it returns false, the options' wake
 * hook is called once something changes.  Thread-safe.
 */
bool sf_fetch_ready(sf_fetch *fetch, int64_t bytes);

/*
 * True when the download has ended: every byte is received (or the server
 * answered 304), or it failed for good.  Unlike sf_fetch_ready() it does not
 * mark fetch as the one being read: a tuner may ask it of the downloads ahead.
 * Thread-safe.
 */
bool sf_fetch_done(sf_fetch *fetch);

/*
 * Returns the next bytes of the shard: > 0 with *data pointing at them
 * (borrowed, valid until the next call or close), 0 at the end, or a negative
 * SF_E* code once every byte received before the failure was handed out, with
 * *error naming the URL, the byte offset and what to do.  Waits like
 * sf_fetch_wait().
 */
ssize_t sf_fetch_read(sf_fetch *fetch, const void **data, bool (*cancelled)(void *),
                      void *cancel_opaque, sf_error *error);

/*
 * Ends the download (finished or not), frees what it holds and sets *fetch to
 * NULL.  NULL-safe.
 */
void sf_fetch_close(sf_fetch **fetch);

#endif
