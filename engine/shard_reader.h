/* Streaming reads of one shard by URL: plain path, file://, http(s):// (libcurl), pipe:CMD. */
#ifndef SF_ENGINE_SHARD_READER_H
#define SF_ENGINE_SHARD_READER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "shardflow/error.h"

typedef struct sf_shard_reader sf_shard_reader;

typedef struct sf_shard_reader_options {
  bool allow_pipe;          /* pipe:CMD runs only when the graph opted in */
  double connect_timeout;   /* seconds; 0 = default (10 s) */
  double stall_timeout;     /* seconds without a byte before giving up; 0 = default (30 s) */
  /* Asked every ~100 ms while a read waits (pipe output, the network): true ends the
   * wait with SF_ECANCELED, so a stopping pipeline never waits on a hung source. */
  bool (*cancelled)(void *opaque);
  void *cancel_opaque;
} sf_shard_reader_options;

/*
 * Opens url for sequential reading. Never reads the whole shard into memory.
 * Returns 0; SF_ENOENT (missing file, HTTP 404), SF_ENET (unreachable host,
 * other HTTP errors), SF_EDENIED (pipe: without allow_pipe), SF_EINVAL (bad
 * URL), SF_ENOMEM. On failure *error names the URL and what to do.
 * options may be NULL.
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

/* Bytes delivered so far. */
int64_t sf_shard_reader_offset(const sf_shard_reader *reader);

/* Closes (kills and reaps a pipe: child, frees curl handles) and sets *reader to NULL. */
void sf_shard_reader_close(sf_shard_reader **reader);

#endif
