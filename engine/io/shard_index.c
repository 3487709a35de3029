/* Per-shard sample indexes: built by the tar reader, kept as a small text file, checked against the shard's size and mtime. */
#include "shard_index.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "prefetch.h"
#include "shardflow/stage.h"
#include "tar_reader.h"
#include "url.h"

/*
 * The file, one record a line (text: a user can read it, diff it and tell what it covers):
 *
 *   shardflow-index 1
 *   url SHARD                  (percent-escaped like keys)
 *   size BYTES
 *   mtime NANOSECONDS          (0 for a remote shard)
 *   etag ETAG                  (a remote shard's, escaped; - for none)
 *   samples N
 *   OFFSET LENGTH KEY          (N lines, in shard order; LENGTH = next OFFSET - OFFSET)
 *
 * Keys are written with '%', bytes below 0x21 and 0x7f as %XX, so a key holding spaces or a newline
 * stays one line and one word.
 */
#define MAGIC "shardflow-index 1"


static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

static int64_t mtime_ns(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

void sf_shard_index_clear(sf_shard_index *index) {
  if (!index) return;
  for (size_t i = 0; index->keys && i < index->count; i++) free(index->keys[i]);
  free(index->keys);
  free(index->offsets);
  free(index->url);
  *index = (sf_shard_index){0};
}

/* Grows the arrays to hold one sample more. */
static int grow(sf_shard_index *index, size_t *cap) {
  if (index->count + 1 < *cap) return 0;
  size_t n = *cap ? *cap * 2 : 256;
  int64_t *offsets = realloc(index->offsets, (n + 1) * sizeof *offsets);
  if (!offsets) return SF_ENOMEM;
  index->offsets = offsets;
  char **keys = realloc(index->keys, n * sizeof *keys);
  if (!keys) return SF_ENOMEM;
  index->keys = keys;
  *cap = n;
  return 0;
}

/* The samples of the open shard into index (offsets and keys). */
static int index_samples(sf_shard_index *index, sf_tar_reader *tar, const char *url, sf_error *error);

int sf_shard_index_build(sf_shard_index *index, const char *url, sf_error *error) {
  *index = (sf_shard_index){0};
  char *path = sf_url_local_path(url);
  bool remote = sf_url_is_remote(url);
  char name[1024];
  snprintf(name, sizeof name, "%s", path ? path : url);
  if (remote) name[strcspn(name, "?#")] = '\0'; /* an http URL's query is not its name */
  bool compressed = ends_with(name, ".gz") || ends_with(name, ".tgz") || ends_with(name, ".zst");
  if (!path && !remote) {
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = url),
                        "only shards at a path, file://, http(s)://, s3:// or gs:// can be indexed and read by byte "
                        "range; read these with order: sequential");
  }
  if (compressed || sf_tar_reader_is_tfrecord(url)) {
    free(path);
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = url),
                        "a %s shard cannot be read by byte range; index uncompressed tar shards (or read these "
                        "with order: sequential)", compressed ? "compressed" : "TFRecord");
  }
  struct stat st = {0};
  if (path && stat(path, &st) != 0) {
    int e = errno;
    free(path);
    return sf_error_set(error, e == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = url), "cannot index the shard: %s",
                        strerror(e));
  }
  free(path);
  sf_prefetch *downloads = NULL;
  sf_fetch *fetch = NULL, *seen = NULL;
  sf_shard_reader_options o = {.mmap = true, .retries = 5, .cached_fd = -1};
  int rc = 0;
  if (remote) { /* our own download, so that its version (the ETag the index records) can be asked */
    rc = sf_prefetch_new(&downloads, &(sf_prefetch_options){.retries = 5}, error);
    if (rc == 0) rc = sf_prefetch_start(downloads, url, NULL, &fetch, error);
    seen = fetch; /* borrowed once the reader owns it, until the reader is closed */
    o.fetch = fetch;
    o.prefetch = downloads;
  }
  sf_tar_reader *tar = NULL;
  if (rc == 0) rc = sf_tar_reader_open(&tar, url, &o, error);
  if (rc == 0) {
    index->url = strdup(url);
    index->size = (int64_t)st.st_size;
    index->mtime_ns = mtime_ns(&st);
    rc = index->url ? index_samples(index, tar, url, error)
                    : sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory for the index");
  }
  if (rc == 0 && remote) {
    sf_object_version version = {0};
    (void)sf_fetch_not_modified(seen, &version);
    snprintf(index->etag, sizeof index->etag, "%s", version.etag);
    index->size = sf_tar_reader_source_bytes(tar);
    index->mtime_ns = 0;
  }
  sf_tar_reader_close(&tar);
  sf_prefetch_destroy(&downloads);
  if (rc < 0) sf_shard_index_clear(index);
  return rc;
}

static int index_samples(sf_shard_index *index, sf_tar_reader *tar, const char *url, sf_error *error) {
  size_t cap = 0;
  int rc = 0;
  while (rc == 0) {
    sf_sample *sample = NULL;
    rc = sf_tar_reader_next(tar, &sample, error);
    if (rc == SF_EOF) {
      rc = 0;
      break;
    }
    int64_t end = sample ? sf_tar_reader_next_offset(tar) : -1;
    if (rc == 0 && end < sample->offset)
      rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = url, .key = sample->key, .offset = sample->offset),
                        "cannot tell where sample %s ends (the shard is damaged after it); re-create the shard",
                        sample->key);
    if (rc == 0) rc = grow(index, &cap);
    if (rc == 0) {
      index->offsets[index->count] = sample->offset;
      index->offsets[index->count + 1] = end;
      index->keys[index->count] = strdup(sample->key);
      if (index->keys[index->count]) index->count++;
      else rc = SF_ENOMEM;
    }
    if (rc == SF_ENOMEM) sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory for the index");
    sf_sample_destroy(&sample);
  }
  if (rc == 0 && !index->offsets) { /* an empty shard: still one offset, its end */
    index->offsets = calloc(1, sizeof *index->offsets);
    if (!index->offsets) rc = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory for the index");
  }
  return rc;
}

/* 64-bit FNV-1a: a stable name for a URL's index in a directory of its own. */
static uint64_t fnv1a(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

char *sf_shard_index_path(const char *url, const char *dir) {
  char *local = sf_url_local_path(url);
  const char *name = local ? local : url;
  char *out = NULL;
  if (!dir || !dir[0]) {
    size_t n = strlen(name) + sizeof SF_SHARD_INDEX_SUFFIX;
    out = malloc(n);
    if (out) snprintf(out, n, "%s%s", name, SF_SHARD_INDEX_SUFFIX);
  } else {
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    size_t n = strlen(dir) + strlen(base) + 32 + sizeof SF_SHARD_INDEX_SUFFIX;
    out = malloc(n);
    if (out) snprintf(out, n, "%s/%s-%016" PRIx64 "%s", dir, base, fnv1a(url), SF_SHARD_INDEX_SUFFIX);
  }
  free(local);
  return out;
}

static void put_escaped(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p <= 0x20 || *p == 0x7f || *p == '%') fprintf(f, "%%%02X", *p);
    else fputc(*p, f);
  }
}

int sf_shard_index_write(const sf_shard_index *index, const char *path, sf_error *error) {
  /* A fresh name, created exclusively without following links: index directories may be shared. */
  size_t n = strlen(path) + 32;
  char *prefix = malloc(n), *tmp = malloc(n);
  if (!prefix || !tmp) {
    free(prefix);
    free(tmp);
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = path), "out of memory writing the index");
  }
  snprintf(prefix, n, "%s.tmp-", path);
  int fd = sf_file_create_unique(prefix, tmp, n, 0644);
  free(prefix);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    int e = fd < 0 ? -fd : errno;
    if (fd >= 0) {
      close(fd);
      unlink(tmp);
    }
    free(tmp);
    return sf_error_set(error, SF_EIO, SF_AT(.url = path),
                        "cannot write the index %s: %s; give a writable directory (shardflow index --out DIR, "
                        "shard_source's index_dir)", path, strerror(e));
  }
  fprintf(f, "%s\nurl ", MAGIC);
  put_escaped(f, index->url ? index->url : "");
  fprintf(f, "\nsize %" PRId64 "\nmtime %" PRId64 "\netag ", index->size, index->mtime_ns);
  put_escaped(f, index->etag[0] ? index->etag : "-");
  fprintf(f, "\nsamples %zu\n", index->count);
  for (size_t i = 0; i < index->count; i++) {
    fprintf(f, "%" PRId64 " %" PRId64 " ", index->offsets[i], index->offsets[i + 1] - index->offsets[i]);
    put_escaped(f, index->keys ? index->keys[i] : "");
    fputc('\n', f);
  }
  bool ok = !ferror(f);
  ok = fclose(f) == 0 && ok;
  int e = errno;
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) unlink(tmp);
  free(tmp);
  if (!ok) return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot write the index %s: %s", path, strerror(e));
  return 0;
}

static int hex(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Undoes put_escaped in place; false on a malformed escape. */
static bool unescape(char *s) {
  char *out = s;
  for (char *p = s; *p; p++) {
    if (*p != '%') {
      *out++ = *p;
      continue;
    }
    int hi = hex(p[1]), lo = hi < 0 ? -1 : hex(p[2]);
    if (lo < 0) return false;
    *out++ = (char)(hi * 16 + lo);
    p += 2;
  }
  *out = '\0';
  return true;
}

/* Reads a "NAME VALUE" header line into value (the rest of the line, newline cut). */
static bool header(FILE *f, const char *name, char *line, size_t size, char **value) {
  if (!fgets(line, (int)size, f)) return false;
  line[strcspn(line, "\n")] = '\0';
  size_t n = strlen(name);
  if (strncmp(line, name, n) != 0 || line[n] != ' ') return false;
  *value = line + n + 1;
  return true;
}

static bool parse_i64(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end || errno || v < 0) return false;
  *out = v;
  return true;
}

int sf_shard_index_read(sf_shard_index *index, const char *path, sf_error *error) {
  *index = (sf_shard_index){0};
  FILE *f = fopen(path, "r");
  if (!f) {
    int e = errno;
    return sf_error_set(error, e == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = path), "cannot read the index %s: %s",
                        path, strerror(e));
  }
  int r = sf_shard_index_read_stream(index, f, path, error);
  fclose(f);
  return r;
}

int sf_shard_index_read_stream(sf_shard_index *index, FILE *f, const char *path, sf_error *error) {
  *index = (sf_shard_index){0};
  char small[512], *value;
  long line = 1;
  int64_t count = 0;
  bool ok = fgets(small, sizeof small, f) && strncmp(small, MAGIC "\n", sizeof MAGIC) == 0;
  ok = ok && (line++, header(f, "url", small, sizeof small, &value)) && unescape(value) &&
       (index->url = strdup(value)) != NULL;
  ok = ok && (line++, header(f, "size", small, sizeof small, &value)) && parse_i64(value, &index->size);
  ok = ok && (line++, header(f, "mtime", small, sizeof small, &value)) && parse_i64(value, &index->mtime_ns);
  ok = ok && (line++, header(f, "etag", small, sizeof small, &value)) && unescape(value) &&
       strlen(value) < sizeof index->etag;
  if (ok && strcmp(value, "-") != 0) snprintf(index->etag, sizeof index->etag, "%s", value);
  ok = ok && (line++, header(f, "samples", small, sizeof small, &value)) && parse_i64(value, &count) &&
       count <= index->size / 512; /* a sample takes a 512-byte header at least: no huge allocation for a bad count */
  if (ok) {
    index->offsets = calloc((size_t)count + 1, sizeof *index->offsets);
    index->keys = calloc((size_t)count ? (size_t)count : 1, sizeof *index->keys);
    if (!index->offsets || !index->keys) {
      sf_shard_index_clear(index);
      return sf_error_set(error, SF_ENOMEM, SF_AT(.url = path), "out of memory reading the index");
    }
  }
  char *big = NULL;
  size_t big_size = 0;
  for (int64_t i = 0; ok && i < count; i++) {
    line++;
    ssize_t got = getline(&big, &big_size, f);
    ok = got > 0;
    if (!ok) break;
    big[strcspn(big, "\n")] = '\0';
    char *end;
    errno = 0;
    long long offset = strtoll(big, &end, 10), length = 0;
    ok = end != big && *end == ' ' && !errno && offset >= 0;
    char *p = end + 1;
    if (ok) length = strtoll(p, &end, 10);
    ok = ok && end != p && *end == ' ' && !errno && length >= 512 && offset + length <= index->size &&
         (i == 0 || offset == index->offsets[i]) && unescape(end + 1);
    if (ok) {
      index->offsets[i] = offset;
      index->offsets[i + 1] = offset + length;
      ok = (index->keys[i] = strdup(end + 1)) != NULL;
      if (ok) index->count++;
    }
  }
  free(big);
  if (!ok) {
    sf_shard_index_clear(index);
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = path, .line = line),
                        "%s:%ld: the index is malformed (not what `shardflow index` writes, or samples that "
                        "do not follow each other); delete the file and run shardflow index again", path, line);
  }
  return 0;
}

int sf_shard_index_read_energon(sf_shard_index *index, const char *url, sf_error *error) {
  *index = (sf_shard_index){0};
  char *shard = sf_url_local_path(url);
  if (!shard) return sf_error_set(error, SF_ENOENT, SF_AT(.url = url), "no Energon index for a remote shard");
  size_t n = strlen(shard) + 8;
  char *path = malloc(n);
  if (!path) {
    free(shard);
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  snprintf(path, n, "%s.idx", shard);
  struct stat st, ist;
  int rc = 0;
  FILE *f = fopen(path, "rb");
  if (!f) rc = sf_error_set(error, errno == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = path), "%s", strerror(errno));
  else if (fstat(fileno(f), &ist) != 0 || stat(shard, &st) != 0)
    rc = sf_error_set(error, SF_EIO, SF_AT(.url = url), "cannot stat the shard or %s: %s", path, strerror(errno));
  else if (mtime_ns(&ist) < mtime_ns(&st))
    rc = sf_error_set(error, SF_EIO, SF_AT(.url = url),
                      "the Energon index %s is stale for shard %s: the shard was modified after it; run `energon "
                      "prepare` again, or delete it and run `shardflow index %s`", path, url, url);
  size_t values = rc == 0 ? (size_t)ist.st_size / 8 : 0;
  if (rc == 0 && (ist.st_size % 8 != 0 || values < 1 || values - 1 > (size_t)st.st_size / 512))
    rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path), "not an Energon .tar.idx for %s (%lld bytes); delete "
                      "it and run shardflow index", url, (long long)ist.st_size);
  if (rc == 0) {
    index->url = strdup(url);
    index->offsets = malloc(values * sizeof *index->offsets);
    if (!index->url || !index->offsets) rc = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  for (size_t i = 0; rc == 0 && i < values; i++) {
    uint8_t b[8];
    uint64_t v = 0;
    if (fread(b, 1, 8, f) != 8) {
      rc = sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot read the index: %s", strerror(errno));
      break;
    }
    for (int k = 7; k >= 0; k--) v = v << 8 | b[k]; /* little-endian, as energon's struct "Q" on its hosts */
    bool ok = v <= (uint64_t)st.st_size && v % 512 == 0 && (i == 0 || v >= (uint64_t)index->offsets[i - 1] + 512);
    if (!ok) {
      rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path), "offset %zu (%llu) of the Energon index cannot be a "
                        "sample of %s (%lld bytes); delete the index and run shardflow index", i,
                        (unsigned long long)v, url, (long long)st.st_size);
      break;
    }
    index->offsets[i] = (int64_t)v;
  }
  if (f) fclose(f);
  if (rc == 0) {
    index->count = values - 1;
    index->size = (int64_t)st.st_size;
    index->mtime_ns = mtime_ns(&st);
  } else {
    sf_shard_index_clear(index);
  }
  free(path);
  free(shard);
  return rc;
}

int sf_shard_index_check(const sf_shard_index *index, const char *url, const char *index_path, sf_error *error) {
  if (sf_url_is_remote(url)) return 0; /* each ranged read carries If-Match with the index's ETag */
  char *path = sf_url_local_path(url);
  struct stat st;
  int e = !path ? ENOENT : stat(path, &st) == 0 ? 0 : errno;
  free(path);
  if (e)
    return sf_error_set(error, e == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = url), "cannot read the shard: %s",
                        strerror(e));
  if ((int64_t)st.st_size == index->size && mtime_ns(&st) == index->mtime_ns) return 0;
  char what[160];
  if ((int64_t)st.st_size != index->size)
    snprintf(what, sizeof what, "the shard has %lld bytes, the index was made for %lld", (long long)st.st_size,
             (long long)index->size);
  else
    snprintf(what, sizeof what, "the shard was modified after the index was made (its mtime changed)");
  return sf_error_set(error, SF_EIO, SF_AT(.url = url),
                      "the index %s is stale for shard %s: %s; run `shardflow index %s` again (or delete the index)",
                      index_path, url, what, url);
}

/* ---- the permutation ---- */

enum { ROUNDS = 6 };

static unsigned half_bits(uint64_t n) {
  unsigned bits = 1;
  while (bits < 32 && (1ull << (2 * bits)) < n) bits++;
  return bits;
}

static uint64_t feistel(uint64_t x, unsigned h, uint64_t key, bool inverse) {
  uint64_t mask = (1ull << h) - 1, l = x >> h, r = x & mask;
  for (int k = 0; k < ROUNDS; k++) {
    int round = inverse ? ROUNDS - 1 - k : k;
    if (!inverse) {
      uint64_t t = r;
      r = l ^ (sf_seed_mix(key, (uint64_t)round << 40 | r) & mask);
      l = t;
    } else {
      uint64_t t = l;
      l = r ^ (sf_seed_mix(key, (uint64_t)round << 40 | l) & mask);
      r = t;
    }
  }
  return l << h | r;
}

uint64_t sf_index_permute(uint64_t i, uint64_t n, uint64_t key) {
  if (n < 2 || i >= n) return i;
  unsigned h = half_bits(n);
  do i = feistel(i, h, key, false); /* cycle walking: the domain is under 4n, so few steps */
  while (i >= n);
  return i;
}

uint64_t sf_index_unpermute(uint64_t j, uint64_t n, uint64_t key) {
  if (n < 2 || j >= n) return j;
  unsigned h = half_bits(n);
  do j = feistel(j, h, key, true);
  while (j >= n);
  return j;
}

int sf_shard_index_load(sf_shard_index *index, const char *url, const char *index_dir, sf_error *unsaved,
                        sf_error *error) {
  *index = (sf_shard_index){0};
  if (unsaved) unsaved->code = 0;
  bool own_dir = index_dir && index_dir[0];
  if (sf_url_is_remote(url) && !own_dir)
    return sf_error_set(error, SF_EOPTION, SF_AT(.url = url),
                        "remote shards need index_dir: the directory where `shardflow index --out DIR` wrote their "
                        "indexes (a missing one is made there on first use)");
  char *path = sf_shard_index_path(url, index_dir);
  if (!path) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  int r = sf_shard_index_read(index, path, error);
  if (r == 0) r = sf_shard_index_check(index, url, path, error);
  if (r < 0 && r != SF_ENOENT) sf_shard_index_clear(index);
  /* A dataset `energon prepare` indexed (SHARD.tar.idx beside the shard) needs no index of ours. */
  if (r == SF_ENOENT && !own_dir) r = sf_shard_index_read_energon(index, url, error);
  if (r == SF_ENOENT) {
    /* Indexed on first use: the shard is read once, and the index kept for later runs where it can be. */
    r = sf_shard_index_build(index, url, error);
    sf_error why;
    if (r == 0 && sf_shard_index_write(index, path, &why) < 0 && unsaved) *unsaved = why;
  }
  free(path);
  return r;
}

uint64_t sf_index_deal_position(uint64_t k, uint64_t base, uint64_t limit, uint64_t deal, uint64_t ranks,
                                uint64_t rank, uint64_t workers, uint64_t worker) {
  if (base >= limit || deal == 0 || ranks == 0 || workers == 0) return limit;
  uint64_t round = deal * ranks, n = limit - base;
  uint64_t full = n / round, j = k / deal, m = k % deal;
  if (j > (UINT64_MAX - worker) / workers) return limit;
  uint64_t i = j * workers + worker;
  if (i < full) return base + i * round + rank * deal + m;
  if (i > full || rank + m * ranks >= n - full * round) return limit;
  return base + full * round + rank + m * ranks;
}

int sf_index_mix_pick(uint64_t seed, uint64_t epoch, uint64_t p, const double *weights, int n) {
  uint64_t h = sf_seed_mix(sf_seed_mix(sf_seed_mix(seed, epoch), 0x6d6978 /* "mix" */), p);
  double largest = 0, total = 0, u = (double)(h >> 11) * 0x1p-53;
  int last = 0;
  for (int i = 0; i < n; i++)
    if (weights[i] > largest) largest = weights[i];
  /* Scaled by the largest first, as mix normalises: weights near DBL_MAX would sum to infinity. */
  for (int i = 0; i < n; i++)
    if (weights[i] > 0) total += weights[i] / largest, last = i;
  double x = u * total;
  for (int i = 0; i < n; i++) {
    if (!(weights[i] > 0)) continue;
    double w = weights[i] / largest;
    if (x < w) return i;
    x -= w;
  }
  return last;
}

uint64_t sf_index_mix_end(uint64_t seed, uint64_t epoch, const double *weights, const uint64_t *sizes, int n,
                          uint64_t limit) {
  uint64_t drawn[SF_NODE_INPUTS_MAX] = {0};
  if (n < 1 || n > SF_NODE_INPUTS_MAX) return 0;
  uint64_t p = 0;
  for (; p < limit; p++) {
    int j = sf_index_mix_pick(seed, epoch, p, weights, n);
    if (drawn[j] == sizes[j]) break;
    drawn[j]++;
  }
  return p;
}
