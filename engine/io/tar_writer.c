/* Writing WebDataset shards with libarchive: numbered ustar/pax files, cut by sample count or size (or uploaded). */
#include "tar_writer.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "shardflow/storage.h"
#include "url.h"

struct sf_tar_writer {
  sf_shard_pattern pattern;
  int64_t max_count, max_bytes;
  struct archive *a; /* the open shard, or NULL */
  struct archive_entry *entry;
  char path[PATH_MAX];
  bool remote; /* the pattern is a URL: each shard is staged in $TMPDIR, then uploaded */
  /* The file the open shard is written to: a partial next to path, renamed onto it when the shard is
   * done (a failed write leaves nothing under path), or the staging file of a URL pattern. */
  char local[PATH_MAX];
  int fd;                 /* local's descriptor (libarchive writes to it but does not close it) */
  locale_t utf8;          /* C.UTF-8 for libarchive's name conversion, or 0 where the C library lacks it */
  bool failed;            /* a write failed: the open shard is never published */
  char cleaned[PATH_MAX]; /* the output directory whose stale partials were removed last */
  int64_t count;          /* samples in the open shard */
  int64_t bytes;          /* tar bytes in the open shard (headers, padding, end blocks) */
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

/* Shards written to a URL (http(s), s3, gs, az) go to a local file first, then up with sf_storage_copy. */
static bool is_url(const char *s) { return sf_url_is_remote(s); }

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
  w->fd = -1;
  w->utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
  w->max_count = max_count;
  w->max_bytes = max_bytes;
  *out = w;
  return 0;
}

/*
 * Ends the open shard. publish: a local shard's partial file is renamed onto its path, a URL pattern's
 * is uploaded; otherwise (or when finishing fails) it is removed and nothing appears under the path.
 */
static int close_shard(sf_tar_writer *w, bool publish, sf_error *error) {
  if (!w->a) return 0;
  int r = 0;
  if (publish && archive_write_close(w->a) != ARCHIVE_OK)
    r = sf_error_set(error, SF_EIO, SF_AT(.url = w->path), "cannot write %s: %s (check free disk space)", w->local,
                     archive_error_string(w->a));
  archive_write_free(w->a);
  w->a = NULL;
  if (close(w->fd) != 0 && publish && r == 0) /* NFS reports a failed write at the latest here */
    r = sf_error_set(error, SF_EIO, SF_AT(.url = w->path), "cannot write %s: %s (check free disk space)", w->local,
                     strerror(errno));
  w->fd = -1;
  if (publish) w->stats.bytes += w->bytes;
  if (publish && r == 0 && w->remote) /* the same atomic, read-back-checked upload as `shardflow cp` */
    r = sf_storage_copy(w->local, w->path, true, error);
  else if (publish && r == 0 && rename(w->local, w->path) != 0)
    r = sf_error_set(error, SF_EIO, SF_AT(.url = w->path), "cannot rename %s onto the shard: %s", w->local,
                     strerror(errno));
  if (w->remote || !publish || r < 0) unlink(w->local);
  return r;
}

static int open_shard(sf_tar_writer *w, sf_error *error) {
  sf_shard_pattern_format(&w->pattern, w->stats.shards, w->path, sizeof w->path);
  w->remote = is_url(w->path);
  int fd;
  if (w->remote) {
    /* A fresh name nobody can predict, created exclusively: $TMPDIR is shared with other users. */
    const char *tmp = getenv("TMPDIR");
    char prefix[PATH_MAX];
    snprintf(prefix, sizeof prefix, "%s/shardflow-write-%ld-", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
    fd = sf_file_create_unique(prefix, w->local, sizeof w->local, 0600);
    if (fd < 0)
      return sf_error_set(error, SF_EIO, SF_AT(.url = w->path),
                          "cannot create a staging file %sXXXX for this shard: %s (set TMPDIR to a writable "
                          "directory with room for a shard)",
                          prefix, strerror(-fd));
  } else {
    /* Partials of killed writers are removed once per output directory, not for every shard. */
    char dir[PATH_MAX];
    const char *slash = strrchr(w->path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - w->path) : 0, w->path);
    if (w->stats.shards == 0 || strcmp(dir, w->cleaned) != 0) {
      sf_remove_stale_partials(w->path);
      memcpy(w->cleaned, dir, sizeof dir);
    }
    fd = sf_file_create_partial(w->path, w->local, sizeof w->local, 0666);
    if (fd < 0)
      return sf_error_set(error, SF_EIO, SF_AT(.url = w->path),
                          "cannot create this shard or its directory: %s (check the shard pattern and permissions)",
                          strerror(-fd));
  }
  w->fd = fd;
  w->a = archive_write_new();
  if (!w->a) {
    close(fd);
    unlink(w->local);
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory");
  }
  /* ustar headers where a name fits them (every tar reader knows it), a pax header where it does not
   * (long keys, non-ASCII names), as Python's tarfile (WebDataset's TarWriter) writes them. */
  archive_write_set_format_pax_restricted(w->a);
  archive_write_add_filter_none(w->a);
  archive_write_set_bytes_per_block(w->a, 1 << 20);
  archive_write_set_bytes_in_last_block(w->a, 1); /* no padding after the end-of-archive blocks */
  if (archive_write_open_fd(w->a, fd) != ARCHIVE_OK) {
    int r =
        sf_error_set(error, SF_EIO, SF_AT(.url = w->path), "cannot write %s: %s", w->local, archive_error_string(w->a));
    close_shard(w, false, error);
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
  /* A pax header holds a name as UTF-8, which libarchive converts from this thread's locale: "C" in
   * most programs, where any non-ASCII key would fail. Names are UTF-8 (WebDataset keys are text). */
  locale_t caller = w->utf8 ? uselocale(w->utf8) : (locale_t)0;
  int hr = archive_write_header(w->a, e);
  if (w->utf8) uselocale(caller);
  if (hr != ARCHIVE_OK || (size && archive_write_data(w->a, data, size) != (la_ssize_t)size) ||
      archive_write_finish_entry(w->a) != ARCHIVE_OK)
    return sf_error_set(error, SF_EIO, SF_AT(.url = w->path), "cannot write %s: %s (check free disk space)", name,
                        archive_error_string(w->a));
  w->bytes = archive_filter_bytes(w->a, 0) + 1024; /* what the format wrote, padding included, and the end */
  return 0;
}

/* Tar bytes of a member's headers: ustar's one block, plus a pax header (a block and its records) for a name
 * ustar cannot hold; an estimate on the high side (ustar also splits names of up to 255 bytes at a '/'). */
static int64_t header_bytes(const char *key, const char *field) {
  size_t len = strlen(key) + 1 + strlen(field);
  bool ascii = true;
  for (const char *s = key; *s && ascii; s++)
    ascii = (unsigned char)*s < 0x80;
  for (const char *s = field; *s && ascii; s++)
    ascii = (unsigned char)*s < 0x80;
  return len < 100 && ascii ? 512 : 512 + 512 + ((int64_t)len * 2 + 64 + 511) / 512 * 512;
}

int sf_tar_writer_add(sf_tar_writer *w, const char *key, const sf_tar_field *fields, int n_fields, sf_error *error) {
  if (w->failed) return sf_error_set(error, SF_EINVAL, SF_AT(.url = w->path), "the shard writer failed before");
  int64_t need = 0;
  for (int i = 0; i < n_fields; i++) {
    if (strlen(key) + 1 + strlen(fields[i].name) >= PATH_MAX) {
      w->failed = true;
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = w->path, .key = key),
                          "the member name of field %s is longer than %d bytes", fields[i].name, PATH_MAX - 1);
    }
    need += header_bytes(key, fields[i].name) - 512 + member_bytes(fields[i].size);
  }
  int r = 0;
  if (w->a && (w->count >= w->max_count || w->bytes + need > w->max_bytes)) r = close_shard(w, true, error);
  if (r == 0 && !w->a) r = open_shard(w, error);
  for (int i = 0; r == 0 && i < n_fields; i++) {
    char name[PATH_MAX];
    snprintf(name, sizeof name, "%s.%s", key, fields[i].name);
    r = add_member(w, name, fields[i].data, fields[i].size, error);
  }
  if (r < 0) {
    w->failed = true;
    return r;
  }
  w->count++;
  w->stats.samples++;
  return 0;
}

/* Frees the writer; the open shard is published when publish, else removed. */
static int finish(sf_tar_writer **writer, bool publish, sf_tar_writer_stats *stats, sf_error *error) {
  sf_tar_writer *w = *writer;
  if (!w) return 0;
  *writer = NULL;
  int r = close_shard(w, publish && !w->failed, error);
  if (stats) *stats = w->stats;
  if (w->utf8) freelocale(w->utf8);
  archive_entry_free(w->entry);
  free(w);
  return r;
}

int sf_tar_writer_close(sf_tar_writer **writer, sf_tar_writer_stats *stats, sf_error *error) {
  return finish(writer, true, stats, error);
}

void sf_tar_writer_discard(sf_tar_writer **writer) {
  sf_error ignored;
  finish(writer, false, NULL, &ignored);
}
