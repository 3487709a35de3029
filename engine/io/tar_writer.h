/* Writing WebDataset shards: samples as ustar members (pax where needed), numbered shards cut by count or size. */
#ifndef SF_ENGINE_TAR_WRITER_H
#define SF_ENGINE_TAR_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"

/* A shard path pattern split around its one %d / %0Nd conversion, so no user text is ever a printf format. */
typedef struct sf_shard_pattern {
  char prefix[1024];
  char suffix[1024];
  int width;
  bool zero;
} sf_shard_pattern;

/*
 * Parses text ("out/train-%06d.tar"; "%%" is a literal percent). Returns 0,
 * or SF_EINVAL with *error saying what the pattern needs (exactly one %d or
 * %0Nd; no other conversion; at most 1023 bytes around it).
 */
int sf_shard_pattern_parse(sf_shard_pattern *pattern, const char *text, sf_error *error);

/* Writes the path of shard number shard into out (cut to size). */
void sf_shard_pattern_format(const sf_shard_pattern *pattern, int64_t shard, char *out, size_t size);

/* One field of a sample: written as the member KEY.name. data is borrowed for the call. */
typedef struct sf_tar_field {
  const char *name;
  const void *data;
  size_t size;
} sf_tar_field;

typedef struct sf_tar_writer_stats {
  int64_t shards;  /* shards written (numbered 0..shards-1) */
  int64_t samples; /* samples in all of them */
  int64_t bytes;   /* tar bytes in all of them: headers, data, padding, end blocks */
} sf_tar_writer_stats;

typedef struct sf_tar_writer sf_tar_writer;

/*
 * A writer of shards named by pattern (copied): a sample goes into the open
 * shard unless it holds max_count samples or the sample would make it
 * exceed max_bytes, then the next shard is started. A local shard is
 * written to a partial file next to its path (its missing directories are
 * made) and renamed onto the path when done, so a shard appears whole or
 * not at all; a URL pattern (s3://, gs://, http(s)://) stages each shard in
 * $TMPDIR at a fresh name no other user can predict (engine/core/files.h)
 * and uploads it as `shardflow cp` does (atomic, read back) when the shard
 * is done. Members are ustar (every tar reader knows it), with a pax header
 * only for a name ustar cannot hold (long or non-ASCII); mode 0644 and
 * mtime 0, so the same samples give the same bytes.
 * Returns 0 with *writer (caller owns it, ends it with sf_tar_writer_close
 * or sf_tar_writer_discard), or SF_EINVAL (max_count or max_bytes < 1),
 * SF_ENOMEM.
 */
int sf_tar_writer_new(sf_tar_writer **writer, const sf_shard_pattern *pattern, int64_t max_count, int64_t max_bytes,
                      sf_error *error);

/*
 * Writes one sample: a member KEY.NAME per field, in order. Returns 0, or
 * SF_EIO (a shard cannot be created, written or uploaded: *error names the
 * path or URL and what to check), SF_ENOMEM. After an error the writer only
 * takes sf_tar_writer_close.
 */
int sf_tar_writer_add(sf_tar_writer *writer, const char *key, const sf_tar_field *fields, int n_fields,
                      sf_error *error);

/*
 * Finishes the open shard (renames it into place, or uploads it for a URL
 * pattern), fills *stats when not NULL, and frees the writer (sets *writer
 * to NULL, also on failure). After an error of sf_tar_writer_add the open
 * shard is removed instead, as by sf_tar_writer_discard. A temporary file
 * is always removed. Returns 0 or SF_EIO / the upload's error in *error.
 */
int sf_tar_writer_close(sf_tar_writer **writer, sf_tar_writer_stats *stats, sf_error *error);

/*
 * Frees the writer (sets *writer to NULL; NULL is fine) without finishing
 * its open shard: the shard's temporary file is removed and nothing appears
 * under its path or URL. Shards finished before stay. For a command that
 * failed part way through a shard.
 */
void sf_tar_writer_discard(sf_tar_writer **writer);

#endif
