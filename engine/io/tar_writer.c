/* Writing WebDataset shards with libarchive: numbered ustar files, cut by sample count or size, uploaded for URLs. */
#include "tar_writer.h"

#include <archive.h>
#include <archive_entry.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "shardflow/storage.h"

struct sf_tar_writer {
  sf_shard_pattern pattern;
  int64_t max_count, max_bytes;
  struct archive *a; /* the open shard, or NULL */
  struct archive_entry *entry;
  char path[PATH_MAX];
  bool remote;          /* the pattern is a URL: each shard goes to a local temporary file, then up */
  char local[PATH_MAX]; /* that temporary file */
  int64_t count;        /* samples in the open shard */
  int64_t bytes;        /* tar bytes in the open shard (headers, padding, end blocks) */
  sf_tar_writer_stats stats;
};

int sf_shard_pattern_parse(sf_shard_pattern *p, const char *text, sf_error *error) {
  memset(p, 0, sizeof *p);
  char *dst = p->prefix;
  size_t len = 0;
  int conversions = 0;
  for (const char *s = text; *s; s++) {
    if (*s == '%' && s[1] == '%') {
      s++;
    } else if (*s == '%') {
      const char *q = s + 1;
      bool zero = *q == '0';
      if (zero) q++;
      int width = 0;
      while (*q >= '0' && *q <= '9' && width < 100)
        width = width * 10 + (*q++ - '0');
      if (*q != 'd' || width >= 100)
        return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                            "the shard pattern '%s' may contain only %%d or %%0Nd conversions (write %%%% for a "
                            "literal %%)",
                            text);
      if (++conversions > 1)
        return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                            "the shard pattern '%s' has more than one %%d conversion; it needs exactly one", text);
      p->zero = zero;
      p->width = width;
      dst[len] = 0;
      dst = p->suffix;
      len = 0;
      s = q;
      continue;
    }
    if (len + 1 >= sizeof p->prefix) return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "the shard pattern is too long");
    dst[len++] = *s;
  }
  dst[len] = 0;
  if (conversions != 1)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                        "the shard pattern '%s' needs one %%d conversion for the shard number, e.g. "
                        "out/train-%%06d.tar",
                        text);
  return 0;
}

void sf_shard_pattern_format(const sf_shard_pattern *p, int64_t shard, char *out, size_t size) {
  if (p->zero)
    snprintf(out, size, "%s%0*lld%s", p->prefix, p->width, (long long)shard, p->suffix);
  else
    snprintf(out, size, "%s%*lld%s", p->prefix, p->width, (long long)shard, p->suffix);
}

static int64_t member_bytes(size_t size) { return 512 + ((int64_t)size + 511) / 512 * 512; }

static bool is_url(const char *s) {
  return strncmp(s, "s3://", 5) == 0 || strncmp(s, "gs://", 5) == 0 || strncmp(s, "http://", 7) == 0 ||
         strncmp(s, "https://", 8) == 0;
}

int sf_tar_writer_new(sf_tar_writer **out, const sf_shard_pattern *pattern, int64_t max_count, int64_t max_bytes,
                      sf_error *error) {
  *out = NULL;
  if (max_count < 1 || max_bytes < 1)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                        "a shard needs room for at least one sample (max_count %lld, max_bytes %lld)",
                        (long long)max_count, (long long)max_bytes);
  sf_tar_writer *w = calloc(1, sizeof *w);
  if (w) w->entry = archive_entry_new();
  if (!w || !w->entry) {
    free(w);
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory");
  }
  w->pattern = *pattern;
  w->max_count = max_count;
  w->max_bytes = max_bytes;
  *out = w;
  return 0;
}

/* Ends the open shard; a URL pattern's shard is uploaded and its temporary file removed. */
static int close_shard(sf_tar_writer *w, sf_error *error) {
  if (!w->a) return 0;
  const char *written = w->remote ? w->local : w->path;
  int r = archive_write_close(w->a) == ARCHIVE_OK
              ? 0
              : sf_error_set(error, SF_EIO, SF_AT(.url = written), "cannot write: %s (check free disk space)",
                             archive_error_string(w->a));
  archive_write_free(w->a);
  w->a = NULL;
  w->stats.bytes += w->bytes;
  if (w->remote) {
    /* the same atomic, read-back-checked upload as `shardflow cp` (multipart for large shards) */
    if (r == 0) r = sf_storage_copy(w->local, w->path, true, error);
    unlink(w->local);
  }
  return r < 0 ? r : 0;
}

static int open_shard(sf_tar_writer *w, sf_error *error) {
  sf_shard_pattern_format(&w->pattern, w->stats.shards, w->path, sizeof w->path);
  w->remote = is_url(w->path);
  if (w->remote) {
    const char *tmp = getenv("TMPDIR");
    snprintf(w->local, sizeof w->local, "%s/shardflow-write-%d-%lld.tar", tmp && tmp[0] ? tmp : "/tmp", (int)getpid(),
             (long long)w->stats.shards);
  }
  int e = w->remote ? 0 : sf_make_dirs(w->path, true);
  if (e < 0)
    return sf_error_set(error, SF_EIO, SF_AT(.url = w->path),
                        "cannot create the directory for this shard: %s (check the shard pattern and permissions)",
                        strerror(-e));
  w->a = archive_write_new();
  if (!w->a) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory");
  /* Plain ustar: every tar reader knows it, and our names and sizes always fit (pax_restricted
   * would write the same headers but clones and charset-converts every entry to decide so). */
  archive_write_set_format_ustar(w->a);
  archive_write_add_filter_none(w->a);
  archive_write_set_bytes_per_block(w->a, 1 << 20);
  archive_write_set_bytes_in_last_block(w->a, 1); /* no padding after the end-of-archive blocks */
  const char *file = w->remote ? w->local : w->path;
  if (archive_write_open_filename(w->a, file) != ARCHIVE_OK) {
    int r = sf_error_set(error, SF_EIO, SF_AT(.url = file), "cannot create: %s (check the path and permissions)",
                         archive_error_string(w->a));
    archive_write_free(w->a);
    w->a = NULL;
    return r;
  }
  w->stats.shards++;
  w->count = 0;
  w->bytes = 1024; /* end-of-archive blocks */
  return 0;
}

static int add_member(sf_tar_writer *w, const char *name, const void *data, size_t size, sf_error *error) {
  struct archive_entry *e = archive_entry_clear(w->entry);
  archive_entry_set_pathname(e, name);
  archive_entry_set_size(e, (la_int64_t)size);
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_mtime(e, 0, 0);
  if (archive_write_header(w->a, e) != ARCHIVE_OK || (size && archive_write_data(w->a, data, size) != (la_ssize_t)size))
    return sf_error_set(error, SF_EIO, SF_AT(.url = w->path), "cannot write %s: %s (check free disk space)", name,
                        archive_error_string(w->a));
  w->bytes += member_bytes(size);
  return 0;
}

int sf_tar_writer_add(sf_tar_writer *w, const char *key, const sf_tar_field *fields, int n_fields, sf_error *error) {
  int64_t need = 0;
  for (int i = 0; i < n_fields; i++)
    need += member_bytes(fields[i].size);
  int r = 0;
  if (w->a && (w->count >= w->max_count || w->bytes + need > w->max_bytes)) r = close_shard(w, error);
  if (r == 0 && !w->a) r = open_shard(w, error);
  for (int i = 0; r == 0 && i < n_fields; i++) {
    char name[256];
    if (snprintf(name, sizeof name, "%s.%s", key, fields[i].name) >= (int)sizeof name)
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = w->path, .key = key), "the member name %s.%s is too long", key,
                          fields[i].name);
    r = add_member(w, name, fields[i].data, fields[i].size, error);
  }
  if (r == 0) {
    w->count++;
    w->stats.samples++;
  }
  return r;
}

int sf_tar_writer_close(sf_tar_writer **writer, sf_tar_writer_stats *stats, sf_error *error) {
  sf_tar_writer *w = *writer;
  if (!w) return 0;
  *writer = NULL;
  int r = close_shard(w, error);
  if (stats) *stats = w->stats;
  archive_entry_free(w->entry);
  free(w);
  return r;
}
