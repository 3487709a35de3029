/* Unit tests of the shard cache: hit/miss, versions, the cap, LRU order, abandoned temp files, 4 processes and 4 threads at once. */
#include <dirent.h>
#include <ftw.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "shard_cache.h"

/* A fresh temporary directory for one test (removed by rm_tree). */
static char *make_tmpdir(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char *dir = malloc(strlen(base) + 32);
  assert_non_null(dir);
  snprintf(dir, strlen(base) + 32, "%s/sf-cache-XXXXXX", base);
  assert_non_null(mkdtemp(dir));
  return dir;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

/* Removes dir and everything under it, and frees the string. */
static void rm_tree(char *dir) {
  nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

/*
 * The bytes a URL's shard consists of: length 1..max_len from a hash of the URL,
 * content an xorshift stream seeded by it (independent of the cache's code).
 */
static size_t url_bytes(const char *url, unsigned char *out, size_t max_len) {
  uint64_t h = 14695981039346656037ull;
  for (const char *p = url; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  size_t len = max_len / 2 + h % (max_len / 2);
  uint64_t x = h | 1;
  for (size_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = (unsigned char)x;
  }
  return len;
}

/* The version the tests store, and the size of its entry header ("SFCACHE1\n" "ETag: \"v1\"\n" "\n"). */
static const sf_object_version V1 = {.etag = "\"v1\""};
enum { HEADER = 9 + 11 + 1 };

/* Stores data under url in `pieces` writes (sleeping between them when slow). */
static void store(sf_shard_cache *c, const char *url, const unsigned char *data, size_t len, int pieces, bool slow) {
  sf_shard_cache_entry *e;
  int fd = sf_shard_cache_begin(c, url, &V1, &e);
  assert_true(fd >= 0);
  assert_non_null(e);
  size_t step = len / (size_t)pieces + 1;
  for (size_t off = 0; off < len; off += step) {
    sf_shard_cache_write(e, data + off, off + step > len ? len - off : step);
    if (slow) usleep(200);
  }
  sf_shard_cache_end(c, &e, true);
  assert_null(e);
}

/* Reads the rest of fd (closing it) into a malloc'ed buffer; *len gets its size. */
static unsigned char *slurp(int fd, size_t *len) {
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  unsigned char *buf = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  ssize_t n;
  while ((n = read(fd, buf + got, (size_t)st.st_size - got + 1)) > 0) got += (size_t)n;
  close(fd);
  *len = got;
  return buf;
}

/* Sum of the sizes of the published entries, and their count. */
static int64_t dir_total(const char *dir, int *entries, int *temps) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int64_t total = 0;
  *entries = 0;
  if (temps) *temps = 0;
  struct dirent *de;
  char path[4096];
  while ((de = readdir(d))) {
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) continue;
    if (strstr(de->d_name, ".shard")) {
      total += st.st_size;
      (*entries)++;
    } else if (temps && !strncmp(de->d_name, ".tmp-", 5)) {
      (*temps)++;
    }
  }
  closedir(d);
  return total;
}

static void test_name(void **state) {
  char name[SF_SHARD_CACHE_NAME_LEN + 1];
  /* sha256("abc") from FIPS 180-2. */
  sf_shard_cache_name("abc", name);
  assert_string_equal(name, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad.shard");
  assert_int_equal(strlen(name), SF_SHARD_CACHE_NAME_LEN);
}

static void test_open_errors(void **state) {
  sf_shard_cache *c = (sf_shard_cache *)1;
  sf_error error;
  assert_int_equal(sf_shard_cache_open(&c, "/tmp/x", 0, &error), SF_EINVAL);
  assert_null(c);
  assert_non_null(strstr(error.message, "cache_size"));
  assert_int_equal(sf_shard_cache_open(&c, "", 10, &error), SF_EINVAL);
  assert_int_equal(sf_shard_cache_open(&c, "/proc/sf-no-such/cache", 10, &error), SF_EIO);
  assert_non_null(strstr(error.message, "/proc/sf-no-such/cache"));
  assert_null(c);
  /* Also without an error record. */
  assert_int_equal(sf_shard_cache_open(&c, "/proc/sf-no-such/cache", 10, NULL), SF_EIO);
}

static void test_hit_miss(void **state) {
  char *dir = make_tmpdir();
  char sub[4200];
  snprintf(sub, sizeof sub, "%s/a/b", dir); /* parents are created */
  sf_shard_cache *c;
  sf_error error;
  assert_int_equal(sf_shard_cache_open(&c, sub, 1 << 20, &error), 0);
  static unsigned char data[20000];
  size_t len = url_bytes("http://h/s-0.tar", data, sizeof data);
  int64_t size = -1;
  assert_int_equal(sf_shard_cache_lookup(c, "http://h/s-0.tar", &size, NULL), -1);
  store(c, "http://h/s-0.tar", data, len, 7, false);
  int fd = sf_shard_cache_lookup(c, "http://h/s-0.tar", &size, NULL);
  assert_true(fd >= 0);
  assert_int_equal(size, (int64_t)len);
  size_t got;
  unsigned char *buf = slurp(fd, &got);
  assert_int_equal(got, len);
  assert_memory_equal(buf, data, len);
  free(buf);
  assert_int_equal(sf_shard_cache_lookup(c, "http://h/s-1.tar", NULL, NULL), -1);

  /* An incomplete entry is discarded, and so is one that was never written. */
  sf_shard_cache_entry *e;
  assert_true(sf_shard_cache_begin(c, "http://h/s-1.tar", &V1, &e) >= 0);
  sf_shard_cache_write(e, data, 100);
  sf_shard_cache_end(c, &e, false);
  assert_null(e);
  assert_int_equal(sf_shard_cache_lookup(c, "http://h/s-1.tar", NULL, NULL), -1);
  sf_shard_cache_end(c, &e, true); /* NULL entry */
  sf_shard_cache_write(NULL, data, 1);

  /* A shard larger than the whole cap is not kept, and evicts nothing. */
  sf_shard_cache_close(&c);
  assert_int_equal(sf_shard_cache_open(&c, sub, 30000, &error), 0);
  static unsigned char big[40000];
  store(c, "http://h/big.tar", big, sizeof big, 3, false);
  assert_int_equal(sf_shard_cache_lookup(c, "http://h/big.tar", NULL, NULL), -1);
  fd = sf_shard_cache_lookup(c, "http://h/s-0.tar", NULL, NULL);
  assert_true(fd >= 0);
  close(fd);
  sf_shard_cache_revalidated(c, true);

  sf_shard_cache_stats stats;
  sf_shard_cache_stats_get(c, &stats);
  assert_int_equal(stats.hits, 1);
  assert_int_equal(stats.stale, 0);
  assert_int_equal(stats.misses, 1);
  assert_int_equal(stats.evicted_bytes, 0);
  int entries, temps;
  assert_int_equal(dir_total(sub, &entries, &temps), (int64_t)len + HEADER);
  assert_int_equal(entries, 1);
  assert_int_equal(temps, 0);
  sf_shard_cache_close(&c);
  assert_null(c);
  sf_shard_cache_close(&c);
  rm_tree(dir);
}

/* An entry keeps the version it was stored at; one without a validator, or with a forged header, is not stored. */
static void test_versions(void **state) {
  char *dir = make_tmpdir();
  sf_shard_cache *c;
  assert_int_equal(sf_shard_cache_open(&c, dir, 1 << 20, NULL), 0);
  const sf_object_version both = {.etag = "W/\"5f3c-1a2b\"", .last_modified = "Tue, 14 Nov 2023 22:13:20 GMT"};
  const sf_object_version date = {.last_modified = "Tue, 14 Nov 2023 22:13:20 GMT"};
  const sf_object_version none = {0}, forged = {.etag = "\"x\"\nETag: \"y\""};
  const sf_object_version *versions[] = {&both, &date};
  for (int i = 0; i < 2; i++) {
    sf_shard_cache_entry *e;
    assert_true(sf_shard_cache_begin(c, "http://h/v.tar", versions[i], &e) >= 0);
    sf_shard_cache_write(e, "shard bytes", 11);
    sf_shard_cache_end(c, &e, true);
    sf_object_version got;
    int64_t size;
    int fd = sf_shard_cache_lookup(c, "http://h/v.tar", &size, &got);
    assert_true(fd >= 0);
    assert_string_equal(got.etag, versions[i]->etag);
    assert_string_equal(got.last_modified, versions[i]->last_modified);
    assert_int_equal(size, 11);
    size_t len;
    unsigned char *buf = slurp(fd, &len);
    assert_int_equal(len, 11);
    assert_memory_equal(buf, "shard bytes", 11);
    free(buf);
  }
  sf_shard_cache_entry *e = (sf_shard_cache_entry *)1;
  assert_int_equal(sf_shard_cache_begin(c, "http://h/n.tar", &none, &e), -1);
  assert_null(e);
  assert_int_equal(sf_shard_cache_begin(c, "http://h/n.tar", &forged, &e), -1);
  /* A plain shard under an entry's name (an older shardflow's cache) is a miss, not a shard of unknown version. */
  char name[SF_SHARD_CACHE_NAME_LEN + 1], path[4200];
  sf_shard_cache_name("http://h/old.tar", name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("0000000.cls\n", f);
  fclose(f);
  assert_int_equal(sf_shard_cache_lookup(c, "http://h/old.tar", NULL, NULL), -1);
  sf_shard_cache_revalidated(c, false);
  sf_shard_cache_stats stats;
  sf_shard_cache_stats_get(c, &stats);
  assert_int_equal(stats.stale, 1);
  assert_int_equal(stats.hits, 0);
  assert_int_equal(stats.misses, 1);
  sf_shard_cache_close(&c);
  rm_tree(dir);
}

/* Cap and LRU order: 10 shards of 1000 bytes under a 4500-byte cap; a hit saves an old shard. */
static void test_lru(void **state) {
  char *dir = make_tmpdir();
  sf_shard_cache *c;
  assert_int_equal(sf_shard_cache_open(&c, dir, 4500, NULL), 0);
  unsigned char data[1000];
  char url[64];
  for (int i = 0; i < 4; i++) {
    memset(data, i, sizeof data);
    snprintf(url, sizeof url, "s3://b/%d.tar", i);
    store(c, url, data, sizeof data, 1, false);
  }
  /* Use 0: now 1 is the least recently used, then 2. */
  int fd = sf_shard_cache_lookup(c, "s3://b/0.tar", NULL, NULL);
  assert_true(fd >= 0);
  close(fd);
  memset(data, 4, sizeof data);
  store(c, "s3://b/4.tar", data, sizeof data, 1, false);
  int entries;
  assert_int_equal(dir_total(dir, &entries, NULL), 4 * (1000 + HEADER));
  assert_int_equal(entries, 4);
  assert_int_equal(sf_shard_cache_lookup(c, "s3://b/1.tar", NULL, NULL), -1);
  const int kept[] = {0, 2, 3, 4};
  for (int i = 0; i < 4; i++) {
    snprintf(url, sizeof url, "s3://b/%d.tar", kept[i]);
    fd = sf_shard_cache_lookup(c, url, NULL, NULL);
    if (fd < 0) fail_msg("%s was evicted", url);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, HEADER + 999), 1);
    assert_int_equal(b, kept[i]);
    close(fd);
  }
  /* Looked up in order 0, 2, 3, 4: adding two more evicts 0 and 2. */
  store(c, "s3://b/5.tar", data, sizeof data, 1, false);
  store(c, "s3://b/6.tar", data, sizeof data, 1, false);
  assert_int_equal(sf_shard_cache_lookup(c, "s3://b/0.tar", NULL, NULL), -1);
  assert_int_equal(sf_shard_cache_lookup(c, "s3://b/2.tar", NULL, NULL), -1);
  for (int i = 3; i <= 6; i++) {
    snprintf(url, sizeof url, "s3://b/%d.tar", i);
    fd = sf_shard_cache_lookup(c, url, NULL, NULL);
    if (fd < 0) fail_msg("%s was evicted", url);
    close(fd);
  }
  /* Re-storing a cached URL replaces it without counting it twice. */
  store(c, "s3://b/6.tar", data, sizeof data, 1, false);
  assert_int_equal(dir_total(dir, &entries, NULL), 4 * (1000 + HEADER));
  sf_shard_cache_stats stats;
  sf_shard_cache_stats_get(c, &stats);
  assert_int_equal(stats.evicted_bytes, 3 * (1000 + HEADER));
  /* An fd stays readable after its file is evicted. */
  fd = sf_shard_cache_lookup(c, "s3://b/3.tar", NULL, NULL);
  assert_true(fd >= 0);
  for (int i = 7; i < 12; i++) {
    snprintf(url, sizeof url, "s3://b/%d.tar", i);
    store(c, url, data, sizeof data, 1, false);
  }
  assert_int_equal(sf_shard_cache_lookup(c, "s3://b/3.tar", NULL, NULL), -1);
  size_t got;
  unsigned char *buf = slurp(fd, &got);
  assert_int_equal(got, 1000);
  assert_int_equal(buf[0], 3);
  free(buf);
  sf_shard_cache_close(&c);
  rm_tree(dir);
}

/* A writer killed mid-shard leaves a temp file: never visible as an entry, removed by the next publish. */
static void test_abandoned_tmp(void **state) {
  char *dir = make_tmpdir();
  sf_shard_cache *c;
  assert_int_equal(sf_shard_cache_open(&c, dir, 1 << 20, NULL), 0);
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    sf_shard_cache_entry *e;
    sf_shard_cache_begin(c, "http://h/killed.tar", &V1, &e);
    sf_shard_cache_write(e, "partial", 7);
    if (write(pipefd[1], "x", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char x;
  assert_int_equal(read(pipefd[0], &x, 1), 1);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  close(pipefd[0]);
  close(pipefd[1]);
  int entries, temps;
  dir_total(dir, &entries, &temps);
  assert_int_equal(entries, 0);
  assert_int_equal(temps, 1);
  assert_int_equal(sf_shard_cache_lookup(c, "http://h/killed.tar", NULL, NULL), -1);
  store(c, "http://h/other.tar", (const unsigned char *)"whole", 5, 1, false);
  dir_total(dir, &entries, &temps);
  assert_int_equal(entries, 1);
  assert_int_equal(temps, 0);
  sf_shard_cache_close(&c);
  rm_tree(dir);
}

enum { N_CHILDREN = 4, N_URLS = 24, ROUNDS = 150, MAX_SHARD = 24000 };

/*
 * One of 4 processes or threads sharing the directory: each round looks a
 * random URL up (checking a hit's bytes in full) or stores it on a miss, in
 * slow pieces so that writers overlap. Returns 0, or 1 + a message on a mismatch.
 */
static int hammer(sf_shard_cache *c, unsigned seed) {
  unsigned char *want = malloc(MAX_SHARD);
  if (!want) return 4;
  unsigned r = seed;
  int status = 0;
  for (int round = 0; round < ROUNDS && !status; round++) {
    char url[64];
    snprintf(url, sizeof url, "http://store/shard-%02d.tar", rand_r(&r) % N_URLS);
    size_t len = url_bytes(url, want, MAX_SHARD);
    int64_t size;
    int fd = sf_shard_cache_lookup(c, url, &size, NULL);
    if (fd >= 0) {
      sf_shard_cache_revalidated(c, true);
      size_t got;
      unsigned char *buf = slurp(fd, &got);
      if (got != len || (int64_t)got != size || memcmp(buf, want, len)) {
        fprintf(stderr, "worker %u: %s: %zu bytes cached, %zu expected or content differs\n", seed, url, got, len);
        status = 1;
      }
      free(buf);
    } else {
      sf_shard_cache_entry *e;
      if (sf_shard_cache_begin(c, url, &V1, &e) < 0) {
        status = 3;
        break;
      }
      for (size_t off = 0; off < len; off += 4096) {
        sf_shard_cache_write(e, want + off, off + 4096 > len ? len - off : 4096);
        if (rand_r(&r) % 4 == 0) usleep(100);
      }
      sf_shard_cache_end(c, &e, rand_r(&r) % 10 != 0); /* one in ten downloads "fails" */
    }
  }
  free(want);
  return status;
}

static void child(const char *dir, int64_t cap, unsigned seed) {
  sf_shard_cache *c;
  if (sf_shard_cache_open(&c, dir, cap, NULL)) _exit(2);
  int status = hammer(c, seed);
  sf_shard_cache_close(&c);
  _exit(status);
}

/* Every entry is the whole shard of some URL, the total is under the cap, no temp file is left. */
static void check_dir(const char *dir, int64_t cap) {
  int entries, temps;
  int64_t total = dir_total(dir, &entries, &temps);
  assert_true(total <= cap);
  assert_int_equal(temps, 0);
  assert_true(entries > 0);
  sf_shard_cache *c;
  assert_int_equal(sf_shard_cache_open(&c, dir, cap, NULL), 0);
  int found = 0;
  static unsigned char want[MAX_SHARD];
  for (int u = 0; u < N_URLS; u++) {
    char url[64];
    snprintf(url, sizeof url, "http://store/shard-%02d.tar", u);
    size_t len = url_bytes(url, want, sizeof want);
    int fd = sf_shard_cache_lookup(c, url, NULL, NULL);
    if (fd < 0) continue;
    found++;
    size_t got;
    unsigned char *buf = slurp(fd, &got);
    assert_int_equal(got, len);
    assert_memory_equal(buf, want, len);
    free(buf);
  }
  assert_int_equal(found, entries); /* no file that belongs to no URL */
  sf_shard_cache_close(&c);
}

/*
 * Holding the cache's lock as publishers do, checks that the directory is not
 * over the cap (without the lock two publishers could both evict for
 * themselves and then both rename). Returns 1 when it checked.
 */
static int check_cap_locked(const char *dir, int64_t cap) {
  char lock[4200];
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  int lfd = open(lock, O_RDWR | O_CLOEXEC), entries;
  if (lfd < 0) return 0;
  assert_int_equal(flock(lfd, LOCK_EX), 0);
  int64_t total = dir_total(dir, &entries, NULL);
  close(lfd);
  if (total > cap) fail_msg("%lld bytes cached under the lock, cap %lld", (long long)total, (long long)cap);
  return 1;
}

typedef struct thread_arg {
  sf_shard_cache *cache;
  unsigned seed;
  int status;
  _Atomic int *done;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg *a = p;
  a->status = hammer(a->cache, a->seed);
  atomic_fetch_add(a->done, 1);
  return NULL;
}

/* One cache object used by 4 threads at once (flock on a fresh open file description excludes threads too). */
static void test_threads(void **state) {
  char *dir = make_tmpdir();
  const int64_t cap = 8 * MAX_SHARD;
  sf_shard_cache *c;
  assert_int_equal(sf_shard_cache_open(&c, dir, cap, NULL), 0);
  pthread_t threads[N_CHILDREN];
  thread_arg args[N_CHILDREN];
  _Atomic int done = 0;
  for (int i = 0; i < N_CHILDREN; i++) {
    args[i] = (thread_arg){c, 2000u + (unsigned)i, -1, &done};
    assert_int_equal(pthread_create(&threads[i], NULL, thread_main, &args[i]), 0);
  }
  int checks = 0;
  while (atomic_load(&done) < N_CHILDREN) checks += check_cap_locked(dir, cap);
  assert_true(checks > 0);
  for (int i = 0; i < N_CHILDREN; i++) {
    pthread_join(threads[i], NULL);
    if (args[i].status) fail_msg("thread %d failed (%d)", i, args[i].status);
  }
  sf_shard_cache_stats stats;
  sf_shard_cache_stats_get(c, &stats);
  assert_int_equal(stats.hits + stats.misses, N_CHILDREN * ROUNDS);
  assert_true(stats.hits > 0);
  sf_shard_cache_close(&c);
  check_dir(dir, cap);
  rm_tree(dir);
}

static void test_processes(void **state) {
  char *dir = make_tmpdir();
  const int64_t cap = 8 * MAX_SHARD; /* about half of the 24 URLs' bytes */
  pid_t pids[N_CHILDREN];
  for (int i = 0; i < N_CHILDREN; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) child(dir, cap, 1000u + (unsigned)i);
  }
  /* Meanwhile the directory is never over the cap. */
  int running = N_CHILDREN, checks = 0;
  while (running) {
    checks += check_cap_locked(dir, cap);
    for (int i = 0; i < N_CHILDREN; i++) {
      int status;
      if (pids[i] <= 0 || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      if (!WIFEXITED(status) || WEXITSTATUS(status)) fail_msg("child %d failed (status %#x)", i, status);
      pids[i] = 0;
      running--;
    }
  }
  assert_true(checks > 0);
  check_dir(dir, cap);
  rm_tree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_name),          cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_hit_miss),      cmocka_unit_test(test_versions),
      cmocka_unit_test(test_lru),
      cmocka_unit_test(test_abandoned_tmp), cmocka_unit_test(test_processes),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
