/* Streaming reads of one shard by URL: plain path, file://, http(s)://, s3://, gs:// (engine/io/prefetch.h), pipe:CMD. */
#ifndef SF_ENGINE_SHARD_READER_H
#define SF_ENGINE_SHARD_READER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "prefetch.h"
#include "shardflow/buffer.h"
#include "shardflow/error.h"

typedef struct sf_shard_reader sf_shard_reader;

typedef struct sf_shard_reader_options {
  bool allow_pipe;          /* pipe:CMD runs only when the graph opted in */
  double connect_timeout;   /* seconds; 0 = default (10 s) */
  double stall_timeout;     /* seconds without a byte before giving up; 0 = default (30 s) */
  /* Retries after failures that brought no byte: remote shards', and any open, socket or pipe that
   * failed for want of file descriptors (EMFILE, ENFILE: they pass as others close theirs). */
  int retries;              /* 0 = none */
  double retry_wait;        /* first backoff in seconds, doubling; 0 = 0.1 s */
  double retry_max_wait;    /* longest single wait in seconds; 0 = 30 s */
  const char *ca_file;      /* https: PEM file of the CAs trusted (borrowed); NULL: see sf_http_easy_new() */
  /* Remote shards: the download already started for this URL (handed over: the reader owns it
   * from the call on, whatever the outcome), else a prefetcher to start it on (borrowed; it must
   * outlive the reader), else the reader runs a prefetcher of its own with the settings above. */
  sf_fetch *fetch;
  sf_prefetch *prefetch;
  /* Remote shards: a shard cache to read from (borrowed), and an fd of this shard already looked
   * up in it (handed over like fetch; -1 for none; only read when cache is set; fetch must then be
   * a download made conditional on the cached version). The cached copy is read when the server
   * answers 304 Not Modified; a shard not in the cache, or replaced on the server, is stored there
   * once it has been read to its end. */
  struct sf_shard_cache *cache;
  int cached_fd;
  /* Asked every ~100 ms while a read waits (pipe output, the network): true ends the
   * wait with SF_ECANCELED, so a stopping pipeline never waits on a hung source. */
  bool (*cancelled)(void *opaque);
  void *cancel_opaque;
  /* Local regular files: map the file (copy-on-write) instead of reading it, so that the tar reader
   * can hand out members as views of the mapping (sf_shard_reader_mapping) with no copy. */
  bool mmap;
  /* Where to add the wall time, in nanoseconds, that reads of a local file or a pipe: take (read(), a
   * pipe's poll, and a mapped file's page faults, taken at once as each chunk is handed out), so that
   * the bottleneck report tells waiting for storage from the caller's CPU (borrowed; NULL: not timed). */
  atomic_uint_fast64_t *read_ns;
} sf_shard_reader_options;

/*
 * Opens url for sequential reading. Never reads the whole shard into memory.
 * Remote shards (http, https, s3, gs) are retried and resumed as
 * engine/io/prefetch.h says; messages show them with credentials redacted.
 * Returns 0; SF_ENOENT (missing file, HTTP 404), SF_ENET (unreachable host,
 * other HTTP errors), SF_ETIMEDOUT, SF_EDENIED (pipe: without allow_pipe, a
 * redirect to another scheme), SF_EIO (the object changed while read),
 * SF_EMFILE (out of file descriptors, still after options->retries: the
 * message gives the process's limit; not a fault of the shard), SF_EHOSTDOWN
 * (the prefetcher took the shard's server as dead, see prefetch.h), SF_EINVAL
 * (bad URL), SF_ECANCELED, SF_ENOMEM. On failure *error names the URL and what
 * to do. options may be NULL; options->fetch is consumed in every case.
 */
int sf_shard_reader_open(sf_shard_reader **reader, const char *url,
                         const sf_shard_reader_options *options, sf_error *error);

/*
 * Returns the next chunk of bytes: > 0 bytes with *data pointing at them
 * (borrowed, valid until the next call), 0 at the end of the shard, or a
 * negative SF_E* code (SF_EIO, SF_ENET, SF_ENOENT, SF_ETIMEDOUT, SF_ECANCELED...)
 * with *error naming the URL and the byte offset reached.
 */
ssize_t sf_shard_reader_read(sf_shard_reader *reader, const void **data, sf_error *error);

/*
 * True when sf_shard_reader_read() would not wait for the next `bytes` bytes
 * (at least one): a remote shard's download has them readable, or ended, or
 * is paused with full buffers (sf_fetch_ready(); the prefetcher's wake hook
 * says when to ask again).  Always true for local files and pipes, which are
 * read synchronously, and at the end.
 */
bool sf_shard_reader_ready(sf_shard_reader *reader, int64_t bytes);

/*
 * A local file opened with options->mmap: the whole file as it was at open, mapped copy-on-write
 * (borrowed; take a reference to keep it past the reader). The chunks sf_shard_reader_read() returns
 * are consecutive pieces of it. NULL for other sources, empty files and when mapping failed.
 * A mapped file that shrinks while mapped makes a read of the lost pages raise SIGBUS: shards are
 * replaced by renaming a new file over the old one, which leaves the mapping intact.
 */
sf_buffer *sf_shard_reader_mapping(const sf_shard_reader *reader);

/* Bytes delivered so far. */
int64_t sf_shard_reader_offset(const sf_shard_reader *reader);

/* Closes (kills and reaps a pipe: child, ends the download) and sets *reader to NULL. NULL-safe. */
void sf_shard_reader_close(sf_shard_reader **reader);

#endif
