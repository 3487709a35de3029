/* Streaming reads of one shard by URL: local files, http(s)/s3/gs through the prefetcher (engine/prefetch.c), pipe:CMD. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "buffer_file.h"
#include "files.h"
#include "later.h"
#include "prefetch.h"
#include "shard_cache.h"
#include "shard_reader.h"
#include "url.h"

extern char **environ;

enum { FILE_CHUNK = 1 << 20 };

typedef enum kind { KIND_FILE, KIND_HTTP, KIND_PIPE } kind;

struct sf_shard_reader {
  kind kind;
  char *url;
  int64_t offset;   /* bytes handed out so far */
  bool (*cancelled)(void *opaque);
  void *cancel_opaque;
  bool at_end;
  /* waits when out of file descriptors (options' retries, retry_wait, retry_max_wait) */
  int retries;
  double retry_wait, retry_max_wait;
  /* file and pipe */
  int fd;
  uint8_t *chunk;
  sf_buffer *mapping; /* a mapped local file (options.mmap), read from instead of fd */
  uint64_t *read_ns;       /* options.read_ns (borrowed), or NULL */
  /* pipe */
  pid_t pid;
  const char *command; /* points into url */
  /* http(s), s3, gs */
  sf_fetch *fetch;
  sf_prefetch *own_prefetch; /* when the caller gave none */
  sf_shard_cache *cache;        /* borrowed */
  sf_shard_cache_entry *entry;  /* the shard being copied into the cache */
};


/* ---- local files ---- */

/*
 * Mapped shards, for the SIGBUS handler: a file cut short while mapped makes reads of its lost pages
 * fault, and the process would die without a word. The handler names the shard and what to do, then
 * lets the signal take its course (the previous handler, or the default: terminate). Slots are
 * claimed with a compare-and-swap and read lock-free, as a signal handler must; a mapping beyond the
 * slots still works, its fault is only not named.
 */
enum { MAPPED_SLOTS = 64 };
static struct {
  _Atomic(uintptr_t) start; /* 0: free; set last, after size and url */
  size_t size;
  char url[240];
} mapped[MAPPED_SLOTS];
static struct sigaction previous_sigbus;
static pthread_once_t sigbus_once = PTHREAD_ONCE_INIT;

static void say(const char *s) { (void)!write(STDERR_FILENO, s, strlen(s)); } /* both async-signal-safe */

static void on_sigbus(int sig, siginfo_t *info, void *context) {
  (void)sig, (void)context;
  uintptr_t at = (uintptr_t)info->si_addr;
  for (int i = 0; i < MAPPED_SLOTS; i++) {
    uintptr_t start = atomic_load_explicit(&mapped[i].start, memory_order_acquire);
    if (start <= 1 || at < start || at - start >= mapped[i].size) continue;
    char offset[24], *o = offset + sizeof offset;
    uintptr_t v = at - start;
    *--o = '\0';
    do *--o = (char)('0' + v % 10); while ((v /= 10) > 0);
    say("shardflow: shard ");
    say(mapped[i].url);
    say(" became shorter while it was read (byte ");
    say(o);
    say(" is gone; tar_split maps local shards): replace shards by renaming a new file over the old "
        "one, or set tar_split's mmap: false to read them with read()\n");
    break;
  }
  sigaction(SIGBUS, &previous_sigbus, NULL); /* the faulting read runs again and meets it */
}

static void install_sigbus(void) {
  struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &previous_sigbus);
}

static void remember_mapping(const void *start, size_t size, const char *url) {
  pthread_once(&sigbus_once, install_sigbus);
  for (int i = 0; i < MAPPED_SLOTS; i++) {
    uintptr_t expected = 0;
    /* Claimed with 1, which the handler passes over, until size and url are set. */
    if (!atomic_compare_exchange_strong(&mapped[i].start, &expected, (uintptr_t)1)) continue;
    mapped[i].size = size;
    snprintf(mapped[i].url, sizeof mapped[i].url, "%s", url);
    atomic_store_explicit(&mapped[i].start, (uintptr_t)start, memory_order_release);
    return;
  }
}

static void forget_mapping(const void *start) {
  for (int i = 0; i < MAPPED_SLOTS; i++) {
    uintptr_t s = (uintptr_t)start;
    if (atomic_compare_exchange_strong(&mapped[i].start, &s, (uintptr_t)0)) return;
  }
}

static void unmap(void *opaque, uint8_t *data) {
  forget_mapping(data);
  sf_unmap_later(data, (size_t)(uintptr_t)opaque);
}

/*
 * Maps a regular file: members become views of the page cache, with no read() copy into a chunk and
 * no copy of each member into a buffer of its own (a quarter of the CIFAR graph's cycles). Private
 * and writable, so a stage that writes into a buffer it holds alone never touches the file. Nothing
 * happens when the file is empty or the mapping fails: the file is then read.
 */
static void map_file(sf_shard_reader *r, const struct stat *st) {
  if (!S_ISREG(st->st_mode) || st->st_size <= 0 || (uint64_t)st->st_size > SIZE_MAX) return;
  size_t size = (size_t)st->st_size;
  void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, r->fd, 0);
  if (map == MAP_FAILED) return;
  /* A shard not yet in the page cache is then read into 2 MiB folios (where the filesystem has large folios, as
     ext4 and xfs do on recent kernels), which every later read maps a PMD at a time: 0.1 ms, not 1.4 ms, for a
     10 MB shard, whichever process mapped it first. No effect on pages already cached. */
  (void)madvise(map, size, MADV_HUGEPAGE);
  r->mapping = sf_buffer_wrap_file(map, size, unmap, (void *)(uintptr_t)size);
  if (!r->mapping) {
    munmap(map, size);
    return;
  }
  remember_mapping(map, size, r->url);
}

static bool cancelled(const sf_shard_reader *r) { return r->cancelled && r->cancelled(r->cancel_opaque); }

static int cancel_error(sf_shard_reader *r, sf_error *error) {
  return sf_error_set(error, SF_ECANCELED, SF_AT(.url = r->url, .offset = r->offset), "the pipeline is stopping");
}

/* SF_EMFILE for what (an open, a pipe) that failed with err (EMFILE, ENFILE): the message names the limit. */
static int fd_limit_error(sf_shard_reader *r, int err, const char *what, int retried, sf_error *error) {
  char limit[200];
  sf_fd_limit_text(err, limit, sizeof limit);
  if (retried > 0)
    return sf_error_set(error, SF_EMFILE, SF_AT(.url = r->url), "%s: %s; still so after %d retries", what, limit,
                        retried);
  return sf_error_set(error, SF_EMFILE, SF_AT(.url = r->url), "%s: %s", what, limit);
}

/*
 * Out of file descriptors (err is EMFILE or ENFILE) is a limit, not a bad path, and it passes when other
 * shards, connections or the trainer close theirs: waits before retry number `attempt` (1, 2, ...) with
 * the remote shards' backoff (retry_wait, doubling up to retry_max_wait), in slices so that a stopping
 * pipeline is not held up. Returns 0 to try again; SF_EMFILE once the retries are spent, naming the
 * limit; SF_ECANCELED.
 */
static int wait_for_descriptors(sf_shard_reader *r, int attempt, int err, const char *what, sf_error *error) {
  if (attempt > r->retries) return fd_limit_error(r, err, what, r->retries, error);
  double wait = r->retry_wait;
  for (int i = 1; i < attempt && wait < r->retry_max_wait; i++) wait *= 2;
  if (wait > r->retry_max_wait) wait = r->retry_max_wait;
  while (wait > 0) {
    if (cancelled(r)) return cancel_error(r, error);
    double slice = wait < 0.1 ? wait : 0.1;
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = (long)(slice * 1e9)}, NULL);
    wait -= slice;
  }
  return cancelled(r) ? cancel_error(r, error) : 0;
}

static int open_file(sf_shard_reader *r, const char *path, bool map, sf_error *error) {
  for (int attempt = 1; (r->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0; attempt++) {
    int e = errno, code = e == ENOENT || e == ENOTDIR ? SF_ENOENT : SF_EIO;
    if (sf_errno_is_fd_limit(e)) {
      if ((code = wait_for_descriptors(r, attempt, e, "cannot open shard", error)) < 0) return code;
      continue;
    }
    sf_error_set(error, code, SF_AT(.url = r->url), "cannot open shard: %s — check the path in the shard list",
                 strerror(e));
    return code;
  }
  struct stat st;
  if (fstat(r->fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    sf_error_set(error, SF_EIO, SF_AT(.url = r->url),
                 "is a directory, not a tar shard — list the .tar files inside it "
                 "(e.g. dir/shard-{0..9}.tar)");
    return SF_EIO;
  }
  /* Shards are read once front to back: let the kernel read ahead aggressively. */
  (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  if (map && fstat(r->fd, &st) == 0) map_file(r, &st);
  if (r->mapping) return 0;
  r->chunk = malloc(FILE_CHUNK);
  if (!r->chunk) return SF_ENOMEM;
  return 0;
}

/* Kernels before 5.14 lack MADV_POPULATE_READ: asked once, then the pages fault in where they are touched. */
static atomic_bool populate_unsupported;

/*
 * Maps the pages of the next chunk of a mapped file in one call (MADV_POPULATE_READ), waiting for those not in
 * the page cache: their faults are then taken here, timed as the read they stand for, and not one by one in
 * whichever stage touches them first (tar_split's headers, decode's pixels). A page it cannot map (the file
 * shrank) is left to fault where it is touched, as without it.
 */
static void populate(const uint8_t *data, size_t n) {
#ifdef MADV_POPULATE_READ
  if (n == 0 || atomic_load_explicit(&populate_unsupported, memory_order_relaxed)) return;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)data & ~(page - 1);
  if (madvise((void *)start, (uintptr_t)data + n - start, MADV_POPULATE_READ) != 0 &&
      (errno == EINVAL || errno == ENOSYS))
    atomic_store_explicit(&populate_unsupported, true, memory_order_relaxed);
#else
  (void)data;
  (void)n;
#endif
}

static ssize_t read_fd(sf_shard_reader *r, const void **data, sf_error *error) {
  if (r->mapping) {
    size_t size = sf_buffer_size(r->mapping), at = (size_t)r->offset;
    size_t n = size - at < FILE_CHUNK ? size - at : FILE_CHUNK;
    *data = sf_buffer_data(r->mapping) + at;
    populate(*data, n);
    return (ssize_t)n;
  }
  for (;;) {
    if (r->kind == KIND_PIPE) {
      /* A command may take its time: wait in slices so a stopping pipeline is not held up. */
      struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
      int ready = poll(&pfd, 1, 100);
      if (ready < 0 && errno != EINTR)
        return sf_error_set(error, SF_EIO, SF_AT(.url = r->url, .offset = r->offset), "poll failed: %s",
                            strerror(errno));
      if (ready <= 0) {
        if (cancelled(r)) return cancel_error(r, error);
        continue;
      }
    }
    ssize_t n = read(r->fd, r->chunk, FILE_CHUNK);
    if (n >= 0) {
      *data = r->chunk;
      return n;
    }
    if (errno == EINTR) continue;
    sf_error_set(error, SF_EIO, SF_AT(.url = r->url, .offset = r->offset), "read failed: %s", strerror(errno));
    return SF_EIO;
  }
}

/* ---- pipe:CMD ---- */

static int open_pipe(sf_shard_reader *r, sf_error *error) {
  int fds[2];
  for (int attempt = 1; pipe2(fds, O_CLOEXEC) != 0; attempt++) {
    int e = errno, rc;
    if (!sf_errno_is_fd_limit(e))
      return sf_error_set(error, SF_EIO, SF_AT(.url = r->url), "cannot create a pipe: %s", strerror(e));
    if ((rc = wait_for_descriptors(r, attempt, e, "cannot create a pipe for the command", error)) < 0) return rc;
  }
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawnattr_init(&attr);
  /* The trainer may ignore SIGPIPE or block signals; the command should not inherit that. */
  sigset_t none, pipe_only;
  sigemptyset(&none);
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  sigaddset(&pipe_only, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &pipe_only);
  /* Its own process group: closing early stops the whole pipeline (curl | zstd -d), not just sh. */
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  char *argv[] = {"sh", "-c", (char *)r->command, NULL};
  int e = posix_spawn(&r->pid, "/bin/sh", &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (e != 0) {
    close(fds[0]);
    r->pid = 0;
    if (sf_errno_is_fd_limit(e)) return fd_limit_error(r, e, "cannot start the pipe command", 0, error);
    sf_error_set(error, SF_EIO, SF_AT(.url = r->url), "cannot start /bin/sh for the pipe command: %s", strerror(e));
    return SF_EIO;
  }
  r->fd = fds[0];
  r->chunk = malloc(FILE_CHUNK);
  return r->chunk ? 0 : SF_ENOMEM;
}

/* Waits for the command; a non-zero exit means the shard is incomplete. */
static int reap_pipe(sf_shard_reader *r, sf_error *error) {
  if (r->pid <= 0) return 0; /* never waitpid(0): that would reap the embedding program's children */
  int status;
  pid_t w;
  do {
    w = waitpid(r->pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  r->pid = 0;
  if (w < 0) return 0;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (WIFEXITED(status))
    sf_error_set(error, SF_EIO, SF_AT(.url = r->url, .offset = r->offset),
                 "pipe command `%s` exited with status %d — run it by hand to see why", r->command,
                 WEXITSTATUS(status));
  else
    sf_error_set(error, SF_EIO, SF_AT(.url = r->url, .offset = r->offset),
                 "pipe command `%s` was killed by signal %d — run it by hand to see why", r->command,
                 WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return SF_EIO;
}

/* Stops a command we no longer read from: SIGTERM, a short grace period, then SIGKILL. */
static void kill_pipe(sf_shard_reader *r) {
  if (r->pid <= 0) return;
  kill(-r->pid, SIGTERM);
  for (int i = 0; i < 200; i++) {
    pid_t w = waitpid(r->pid, NULL, WNOHANG);
    if (w == r->pid || (w < 0 && errno != EINTR)) {
      r->pid = 0;
      return;
    }
    nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
  }
  kill(-r->pid, SIGKILL);
  while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR) {
  }
  r->pid = 0;
}

/* ---- http(s), s3://, gs:// ---- */

/*
 * Remote shards come from a prefetcher: the caller's (tar_split's, shared by
 * the shards it reads ahead), or one of the reader's own for this shard.
 * With a cache, a cached copy is read only when the server answers the
 * conditional download 304 (the copy is current); otherwise the download
 * replaces it.
 */
static int open_remote(sf_shard_reader *r, const sf_shard_reader_options *o, sf_error *error) {
  sf_object_version version;
  int cached_fd = -1, rc = 0;
  if (o && o->cache) {
    r->cache = o->cache;
    cached_fd = o->cached_fd;
    /* A download started for a cached copy was made conditional on it; without one, look up here. */
    if (cached_fd >= 0 && !r->fetch) close(cached_fd);
    if (!r->fetch) cached_fd = sf_shard_cache_lookup(o->cache, r->url, NULL, &version);
  }
  if (!r->fetch) {
    sf_prefetch *p = o ? o->prefetch : NULL;
    if (!p) {
      sf_prefetch_options po = {
          .max_transfers = 1,
          .max_bytes = 2 << 20,
          .connect_timeout = o ? o->connect_timeout : 0,
          .stall_timeout = o ? o->stall_timeout : 0,
          .retries = o ? o->retries : 0,
          .retry_wait = o ? o->retry_wait : 0,
          .retry_max_wait = o ? o->retry_max_wait : 0,
          .ca_file = o ? o->ca_file : NULL,
      };
      rc = sf_prefetch_new(&r->own_prefetch, &po, error);
      p = r->own_prefetch;
    }
    if (rc == 0) rc = sf_prefetch_start(p, r->url, cached_fd >= 0 ? &version : NULL, &r->fetch, error);
  }
  /* The first bytes or the failure: a 404 or a dead host shows at open. */
  if (rc == 0) rc = sf_fetch_wait(r->fetch, r->cancelled, r->cancel_opaque, error);
  if (rc == 0 && sf_fetch_not_modified(r->fetch, &version)) {
    sf_shard_cache_revalidated(r->cache, true);
    sf_fetch_close(&r->fetch);
    r->kind = KIND_FILE;
    r->fd = cached_fd;
    r->chunk = malloc(FILE_CHUNK);
    return r->chunk ? 0 : SF_ENOMEM;
  }
  if (cached_fd >= 0) {
    close(cached_fd);
    if (rc == 0) sf_shard_cache_revalidated(r->cache, false);
  }
  if (rc == 0 && r->cache) (void)sf_shard_cache_begin(r->cache, r->url, &version, &r->entry); /* -1: not cached */
  return rc;
}

/* ---- dispatch ---- */

int sf_shard_reader_open(sf_shard_reader **reader, const char *url,
                         const sf_shard_reader_options *options, sf_error *error) {
  *reader = NULL;
  sf_fetch *given = options ? options->fetch : NULL; /* consumed whatever happens */
  if (!url || !*url) {
    sf_fetch_close(&given);
    sf_error_set(error, SF_EINVAL, SF_AT(.url = ""), "empty shard URL — check the shard list");
    return SF_EINVAL;
  }
  sf_shard_reader *r = calloc(1, sizeof *r);
  if (!r || !(r->url = strdup(url))) {
    sf_fetch_close(&given);
    free(r);
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory opening the shard");
    return SF_ENOMEM;
  }
  r->fd = -1;
  r->retry_wait = 0.1;
  r->retry_max_wait = 30;
  if (options) {
    r->cancelled = options->cancelled;
    r->cancel_opaque = options->cancel_opaque;
    r->read_ns = options->read_ns;
    r->retries = options->retries > 0 ? options->retries : 0;
    if (options->retry_wait > 0) r->retry_wait = options->retry_wait;
    if (options->retry_max_wait > 0) r->retry_max_wait = options->retry_max_wait;
  }
  int rc;
  sf_url_kind scheme = sf_url_kind_of(url);
  bool remote = scheme == SF_URL_HTTP || scheme == SF_URL_STORE;
  if (given && !remote) sf_fetch_close(&given);
  if (options && options->cache && options->cached_fd >= 0 && !remote) close(options->cached_fd);
  if (scheme == SF_URL_PIPE) {
    r->kind = KIND_PIPE;
    r->command = r->url + 5;
    if (!options || !options->allow_pipe) {
      sf_error_set(error, SF_EDENIED, SF_AT(.url = url),
                   "pipe: URLs run shell commands and are off by default — set `allow_pipe: true` "
                   "on shard_source if you trust the shard list");
      rc = SF_EDENIED;
    } else {
      rc = open_pipe(r, error);
    }
  } else if (remote) {
    r->kind = KIND_HTTP;
    r->fetch = given;
    given = NULL;
    rc = open_remote(r, options, error);
  } else if (scheme == SF_URL_FILE) {
    r->kind = KIND_FILE;
    char *path = sf_url_local_path(url); /* file:///path, file://localhost/path; %XX decoded */
    if (!path) {
      sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "a file URL needs an absolute path (file:///data/shard.tar)");
      rc = SF_EINVAL;
    } else {
      rc = open_file(r, path, options && options->mmap, error);
      free(path);
    }
  } else if (scheme == SF_URL_OTHER) {
    sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = url),
                 "unsupported URL scheme — use a path, file://, http://, https:// or "
                 "pipe:CMD (e.g. pipe:aws s3 cp URL - with allow_pipe)");
    rc = SF_EUNSUPPORTED;
  } else {
    r->kind = KIND_FILE;
    rc = open_file(r, url, options && options->mmap, error);
  }
  if (rc < 0) {
    if (rc == SF_ENOMEM && error && error->code != SF_ENOMEM)
      sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory opening the shard");
    sf_shard_reader_close(&r);
    return rc;
  }
  *reader = r;
  return 0;
}

ssize_t sf_shard_reader_read(sf_shard_reader *r, const void **data, sf_error *error) {
  *data = NULL;
  if (r->at_end) return 0;
  ssize_t n;
  if (r->kind == KIND_HTTP) {
    n = sf_fetch_read(r->fetch, data, r->cancelled, r->cancel_opaque, error);
    if (n < 0) {
      if (n != SF_ECANCELED) sf_shard_cache_end(r->cache, &r->entry, false);
      return n;
    }
    if (n > 0) sf_shard_cache_write(r->entry, *data, (size_t)n);
    if (n == 0) sf_shard_cache_end(r->cache, &r->entry, true); /* the whole shard: publish it */
  } else {
    struct timespec t0, t1;
    if (r->read_ns) clock_gettime(CLOCK_MONOTONIC, &t0);
    n = read_fd(r, data, error);
    if (r->read_ns) {
      clock_gettime(CLOCK_MONOTONIC, &t1);
      int64_t ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
      if (ns > 0) __atomic_fetch_add(r->read_ns, (uint64_t)ns, __ATOMIC_RELAXED);
    }
    if (n == 0 && r->kind == KIND_PIPE) {
      r->at_end = true; /* reaped once, whatever the command's status */
      int rc = reap_pipe(r, error);
      if (rc < 0) return rc;
    }
  }
  if (n == 0) r->at_end = true;
  if (n > 0) r->offset += n;
  return n;
}

bool sf_shard_reader_ready(sf_shard_reader *r, int64_t bytes) {
  return r->kind != KIND_HTTP || r->at_end || !r->fetch || sf_fetch_ready(r->fetch, bytes);
}

int64_t sf_shard_reader_offset(const sf_shard_reader *r) { return r->offset; }

sf_buffer *sf_shard_reader_mapping(const sf_shard_reader *r) { return r->mapping; }

void sf_shard_reader_close(sf_shard_reader **reader) {
  if (!reader || !*reader) return;
  sf_shard_reader *r = *reader;
  if (r->fd >= 0) close(r->fd);
  kill_pipe(r);
  sf_shard_cache_end(r->cache, &r->entry, false); /* not read to its end: not cached */
  sf_fetch_close(&r->fetch);
  sf_prefetch_destroy(&r->own_prefetch);
  free(r->chunk);
  sf_buffer_unref(&r->mapping); /* unmapped once the last member view goes */
  free(r->url);
  free(r);
  *reader = NULL;
}
