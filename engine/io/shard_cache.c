/* The local shard cache: whole shards named by SHA-256 of their URL with their version in a header, LRU by mtime, flock + rename. */
#include "shard_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "files.h"

#define LOCK_NAME ".lock"
#define TMP_PREFIX ".tmp-"
/* A temp file this old is abandoned even if its pid is alive again (a recycled pid). */
#define TMP_MAX_AGE_S (24 * 3600)
/* An entry's header (engine/io/shard_cache.h): magic, validators, a blank line; bounded by the fields' sizes. */
#define HEADER_MAGIC "SFCACHE1\n"
#define HEADER_MAX 512

struct sf_shard_cache {
  char *dir;
  int dir_fd;
  int64_t max_bytes;
  _Atomic uint64_t hits, stale, misses, evicted;
  _Atomic uint64_t tmp_counter;
};

struct sf_shard_cache_entry {
  int fd;
  bool failed;
  char tmp[64];
  char name[SF_SHARD_CACHE_NAME_LEN + 1];
};

void sf_shard_cache_name(const char *url, char name[SF_SHARD_CACHE_NAME_LEN + 1]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!EVP_Digest(url, strlen(url), md, &len, EVP_sha256(), NULL) || len != 32) {
    /* Cannot happen with a working libcrypto; FNV-1a keeps the name well-formed. */
    uint64_t h = 1469598103934665603ull;
    for (const char *p = url; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    memset(md, 0, 32);
    memcpy(md, &h, sizeof h);
  }
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    name[2 * i] = hex[md[i] >> 4];
    name[2 * i + 1] = hex[md[i] & 15];
  }
  memcpy(name + 64, ".shard", 7);
}

/* True for an entry's file name: 64 lowercase hex digits then ".shard". */
static bool is_entry_name(const char *name) {
  if (strlen(name) != SF_SHARD_CACHE_NAME_LEN || strcmp(name + 64, ".shard")) return false;
  for (int i = 0; i < 64; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
  return true;
}

int sf_shard_cache_open(sf_shard_cache **cache, const char *dir, int64_t max_bytes, sf_error *error) {
  *cache = NULL;
  if (!dir || !*dir || strlen(dir) > PATH_MAX - 80)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = dir), "cache_dir must be a directory path of 1 to %d bytes",
                        PATH_MAX - 80);
  if (max_bytes <= 0)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = dir),
                        "cache_size for cache directory %s must be > 0 (got %lld); give a size such as 10GiB", dir,
                        (long long)max_bytes);
  int r = sf_make_dirs(dir, false);
  if (r)
    return sf_error_set(error, SF_EIO, SF_AT(.url = dir),
                        "cannot create cache directory %s: %s; choose a writable cache_dir", dir, strerror(-r));
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return sf_error_set(error, SF_EIO, SF_AT(.url = dir), "cannot open cache directory %s: %s", dir, strerror(errno));
  int lfd = openat(dfd, LOCK_NAME, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (lfd < 0) {
    int e = errno;
    close(dfd);
    return sf_error_set(error, SF_EIO, SF_AT(.url = dir),
                        "cannot create the lock file %s/%s: %s; the cache directory must be writable", dir, LOCK_NAME,
                        strerror(e));
  }
  close(lfd);
  sf_shard_cache *c = calloc(1, sizeof *c);
  if (c) c->dir = strdup(dir);
  if (!c || !c->dir) {
    if (c) free(c);
    close(dfd);
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = dir), "out of memory opening cache %s", dir);
  }
  c->dir_fd = dfd;
  c->max_bytes = max_bytes;
  *cache = c;
  return 0;
}

void sf_shard_cache_close(sf_shard_cache **cache) {
  sf_shard_cache *c = *cache;
  if (!c) return;
  close(c->dir_fd);
  free(c->dir);
  free(c);
  *cache = NULL;
}

/* Now, strictly later than the last value this process handed out (file-time ties break LRU order). */
static struct timespec now_for_mtime(void) {
  static _Atomic int64_t last;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  int64_t prev = atomic_load(&last);
  for (;;) {
    int64_t want = ns > prev ? ns : prev + 1;
    if (atomic_compare_exchange_weak(&last, &prev, want)) {
      ns = want;
      break;
    }
  }
  return (struct timespec){.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
}

/* Marks fd's file most recently used (mtime = now; atime too, so relatime never matters). */
static void touch(int fd) {
  struct timespec t = now_for_mtime();
  struct timespec times[2] = {t, t};
  (void)futimens(fd, times); /* fails only for a file of another user: recency then just lags */
}

/* Reads an entry's header into *version; returns the offset of the shard's first byte, or -1 (no valid header). */
static int64_t read_header(int fd, sf_object_version *version) {
  char buf[HEADER_MAX];
  ssize_t n = pread(fd, buf, sizeof buf, 0);
  size_t magic = strlen(HEADER_MAGIC);
  if (n < (ssize_t)magic || memcmp(buf, HEADER_MAGIC, magic)) return -1;
  *version = (sf_object_version){0};
  char *line = buf + magic, *end;
  while ((end = memchr(line, '\n', (size_t)(buf + n - line))) && end > line) {
    *end = '\0';
    if (!strncmp(line, "ETag: ", 6))
      snprintf(version->etag, sizeof version->etag, "%s", line + 6);
    else if (!strncmp(line, "Last-Modified: ", 15))
      snprintf(version->last_modified, sizeof version->last_modified, "%s", line + 15);
    else
      return -1;
    line = end + 1;
  }
  return end ? end + 1 - buf : -1;
}

int sf_shard_cache_lookup(sf_shard_cache *cache, const char *url, int64_t *size, sf_object_version *version) {
  char name[SF_SHARD_CACHE_NAME_LEN + 1];
  sf_shard_cache_name(url, name);
  int fd = openat(cache->dir_fd, name, O_RDONLY | O_CLOEXEC);
  struct stat st;
  sf_object_version v;
  int64_t start = fd >= 0 && fstat(fd, &st) == 0 ? read_header(fd, &v) : -1;
  if (start < 0 || lseek(fd, start, SEEK_SET) != start) {
    if (fd >= 0) close(fd); /* an entry of an older shardflow is replaced like a stale one */
    atomic_fetch_add(&cache->misses, 1);
    return -1;
  }
  touch(fd);
  if (size) *size = st.st_size - start;
  if (version) *version = v;
  return fd;
}

void sf_shard_cache_revalidated(sf_shard_cache *cache, bool current) {
  atomic_fetch_add(current ? &cache->hits : &cache->stale, 1);
}

int sf_shard_cache_begin(sf_shard_cache *cache, const char *url, const sf_object_version *version,
                         sf_shard_cache_entry **entry) {
  *entry = NULL;
  /* Without a validator the entry could never be confirmed current; a line break would forge the header. */
  if ((!version->etag[0] && !version->last_modified[0]) || strpbrk(version->etag, "\r\n") ||
      strpbrk(version->last_modified, "\r\n"))
    return -1;
  sf_shard_cache_entry *e = calloc(1, sizeof *e);
  if (!e) return -1;
  sf_shard_cache_name(url, e->name);
  snprintf(e->tmp, sizeof e->tmp, TMP_PREFIX "%ld-%llu", (long)getpid(),
           (unsigned long long)atomic_fetch_add(&cache->tmp_counter, 1));
  e->fd = openat(cache->dir_fd, e->tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (e->fd < 0) {
    free(e);
    return -1;
  }
  char header[HEADER_MAX];
  int n = snprintf(header, sizeof header, HEADER_MAGIC "%s%s%s%s%s%s\n", version->etag[0] ? "ETag: " : "",
                   version->etag, version->etag[0] ? "\n" : "", version->last_modified[0] ? "Last-Modified: " : "",
                   version->last_modified, version->last_modified[0] ? "\n" : "");
  sf_shard_cache_write(e, header, (size_t)n);
  *entry = e;
  return e->fd;
}

void sf_shard_cache_write(sf_shard_cache_entry *entry, const void *data, size_t size) {
  if (!entry || entry->failed) return;
  const char *p = data;
  while (size) {
    ssize_t n = write(entry->fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      entry->failed = true;
      return;
    }
    p += n;
    size -= (size_t)n;
  }
}

typedef struct cached_file {
  int64_t mtime_ns;
  int64_t size;
  char name[SF_SHARD_CACHE_NAME_LEN + 1];
} cached_file;

static int by_mtime(const void *a, const void *b) {
  const cached_file *x = a, *y = b;
  if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* True when a temp file name's writer is gone (its pid does not exist) or the file is a day old. */
static bool tmp_abandoned(const char *name, const struct stat *st) {
  long pid = strtol(name + strlen(TMP_PREFIX), NULL, 10);
  if (pid <= 0 || (pid == (long)getpid())) return pid <= 0;
  if (kill((pid_t)pid, 0) && errno == ESRCH) return true;
  return time(NULL) - st->st_mtime > TMP_MAX_AGE_S;
}

/*
 * Under the lock: evicts least-recently-used entries (other than keep, which
 * is about to be replaced) until need more bytes fit under the cap, and
 * removes abandoned temp files. Returns the bytes evicted.
 */
static int64_t evict_for(sf_shard_cache *cache, const char *keep, int64_t need) {
  int fd = openat(cache->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return 0;
  }
  cached_file *files = NULL;
  size_t n = 0, cap = 0;
  int64_t total = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    bool entry = is_entry_name(de->d_name);
    bool tmp = !strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX));
    if (!entry && !tmp) continue;
    struct stat st;
    if (fstatat(cache->dir_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)) continue;
    if (tmp) {
      if (tmp_abandoned(de->d_name, &st)) unlinkat(cache->dir_fd, de->d_name, 0);
      continue;
    }
    if (!strcmp(de->d_name, keep)) continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      cached_file *grown = realloc(files, ncap * sizeof *files);
      if (!grown) break; /* evict among what was listed; the next publish sees the rest */
      files = grown;
      cap = ncap;
    }
    files[n].mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    files[n].size = st.st_size;
    memcpy(files[n].name, de->d_name, sizeof files[n].name);
    total += st.st_size;
    n++;
  }
  closedir(d);
  if (n) qsort(files, n, sizeof *files, by_mtime);
  int64_t evicted = 0;
  for (size_t i = 0; i < n && total + need > cache->max_bytes; i++) {
    if (unlinkat(cache->dir_fd, files[i].name, 0) == 0 || errno == ENOENT) {
      total -= files[i].size;
      evicted += files[i].size;
    }
  }
  free(files);
  return evicted;
}

void sf_shard_cache_end(sf_shard_cache *cache, sf_shard_cache_entry **entry, bool complete) {
  sf_shard_cache_entry *e = *entry;
  if (!e) return;
  *entry = NULL;
  struct stat st;
  bool publish = complete && !e->failed && fdatasync(e->fd) == 0 && fstat(e->fd, &st) == 0 &&
                 st.st_size <= cache->max_bytes;
  if (publish) {
    touch(e->fd);
    /* A fresh open file description: flock excludes other threads of this process as well. */
    int lfd = openat(cache->dir_fd, LOCK_NAME, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    int r = -1;
    while (lfd >= 0 && (r = flock(lfd, LOCK_EX)) && errno == EINTR) {
    }
    if (lfd >= 0 && r == 0) {
      atomic_fetch_add(&cache->evicted, (uint64_t)evict_for(cache, e->name, st.st_size));
      publish = renameat(cache->dir_fd, e->tmp, cache->dir_fd, e->name) == 0;
    } else {
      publish = false;
    }
    if (lfd >= 0) close(lfd); /* releases the lock */
  }
  if (!publish) unlinkat(cache->dir_fd, e->tmp, 0);
  close(e->fd);
  free(e);
}

void sf_shard_cache_stats_get(const sf_shard_cache *cache, sf_shard_cache_stats *stats) {
  *stats = (sf_shard_cache_stats){.hits = atomic_load(&cache->hits),
                                  .stale = atomic_load(&cache->stale),
                                  .misses = atomic_load(&cache->misses),
                                  .evicted_bytes = atomic_load(&cache->evicted)};
}
