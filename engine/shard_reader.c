/* Streaming reads of one shard by URL: local files, http(s) through libcurl (a fetcher thread per shard), pipe:CMD. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "engine/shard_reader.h"

/* An error about this shard: no stage, no key, no graph line. */
#define SET_ERROR(error, code, url, offset, ...) sf_error_set(error, code, NULL, url, NULL, offset, -1, __VA_ARGS__)

extern char **environ;

enum { FILE_CHUNK = 1 << 20 };
/* http: blocks of 512 KiB, four per shard being read (2 MiB in flight at most). */
enum { HTTP_BLOCK = 512 * 1024, HTTP_BLOCKS = 4 };

typedef enum kind { KIND_FILE, KIND_HTTP, KIND_PIPE } kind;

struct sf_shard_reader {
  kind kind;
  char *url;
  int64_t offset;   /* bytes handed out so far */
  bool (*cancelled)(void *opaque);
  void *cancel_opaque;
  bool at_end;
  /* file and pipe */
  int fd;
  uint8_t *chunk;
  /* pipe */
  pid_t pid;
  const char *command; /* points into url */
  /* http: a fetcher thread fills a ring of blocks while the reader's caller parses */
  CURLM *multi;
  CURL *easy;
  pthread_t fetcher;
  bool fetcher_started;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  uint8_t *blocks[HTTP_BLOCKS];
  size_t block_size[HTTP_BLOCKS];
  int read_idx;       /* the block the caller holds, or will take next */
  int write_idx;      /* the block the fetcher fills (or filled last, when !filling) */
  bool filling;       /* blocks[write_idx] is partly filled, not yet handed to the caller */
  int ready;          /* complete blocks not yet taken */
  bool held;          /* the caller holds blocks[read_idx] (returned by the last read) */
  bool paused;        /* on_data asked libcurl to hold data until a block frees */
  bool stop;          /* close: the fetcher must end the transfer */
  bool done;          /* the transfer ended (result says how) */
  CURLcode result;
  char curl_text[CURL_ERROR_SIZE];
};


/* ---- local files ---- */

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = tolower(c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* file:///path and file://localhost/path name a local path; %XX escapes are decoded. */
static char *file_url_path(const char *url) {
  const char *p = url + strlen("file://");
  if (strncmp(p, "localhost/", 10) == 0) p += 9;
  if (*p != '/') return NULL;
  char *out = malloc(strlen(p) + 1), *o = out;
  if (!out) return NULL;
  for (; *p; p++) {
    int hi, lo;
    if (*p == '%' && (hi = hexval((unsigned char)p[1])) >= 0 &&
        (lo = hexval((unsigned char)p[2])) >= 0) {
      *o++ = (char)(hi * 16 + lo);
      p += 2;
    } else {
      *o++ = *p;
    }
  }
  *o = '\0';
  return out;
}

static int open_file(sf_shard_reader *r, const char *path, sf_error *error) {
  r->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (r->fd < 0) {
    int e = errno, code = e == ENOENT || e == ENOTDIR ? SF_ENOENT : SF_EIO;
    SET_ERROR(error, code, r->url, -1, "cannot open shard: %s — check the path in the shard list",
              strerror(e));
    return code;
  }
  struct stat st;
  if (fstat(r->fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    SET_ERROR(error, SF_EIO, r->url, -1,
              "is a directory, not a tar shard — list the .tar files inside it "
              "(e.g. dir/shard-{0..9}.tar)");
    return SF_EIO;
  }
  /* Shards are read once front to back: let the kernel read ahead aggressively. */
  (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  r->chunk = malloc(FILE_CHUNK);
  if (!r->chunk) return SF_ENOMEM;
  return 0;
}

static bool cancelled(const sf_shard_reader *r) { return r->cancelled && r->cancelled(r->cancel_opaque); }

static int cancel_error(sf_shard_reader *r, sf_error *error) {
  return SET_ERROR(error, SF_ECANCELED, r->url, r->offset, "the pipeline is stopping");
}

static ssize_t read_fd(sf_shard_reader *r, const void **data, sf_error *error) {
  for (;;) {
    if (r->kind == KIND_PIPE) {
      /* A command may take its time: wait in slices so a stopping pipeline is not held up. */
      struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
      int ready = poll(&pfd, 1, 100);
      if (ready < 0 && errno != EINTR)
        return SET_ERROR(error, SF_EIO, r->url, r->offset, "poll failed: %s", strerror(errno));
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
    SET_ERROR(error, SF_EIO, r->url, r->offset, "read failed: %s", strerror(errno));
    return SF_EIO;
  }
}

/* ---- pipe:CMD ---- */

static int open_pipe(sf_shard_reader *r, sf_error *error) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    SET_ERROR(error, SF_EIO, r->url, -1, "cannot create a pipe: %s", strerror(errno));
    return SF_EIO;
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
    SET_ERROR(error, SF_EIO, r->url, -1, "cannot start /bin/sh for the pipe command: %s",
              strerror(e));
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
    SET_ERROR(error, SF_EIO, r->url, r->offset,
              "pipe command `%s` exited with status %d — run it by hand to see why",
              r->command, WEXITSTATUS(status));
  else
    SET_ERROR(error, SF_EIO, r->url, r->offset,
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

/* ---- http(s) ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void curl_init(void) { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* Room for n more bytes: the rest of the block being filled plus the free blocks. Lock held. */
static bool has_room(const sf_shard_reader *r, size_t n) {
  int free_blocks = HTTP_BLOCKS - r->ready - (r->held ? 1 : 0) - (r->filling ? 1 : 0);
  size_t room = (r->filling ? HTTP_BLOCK - r->block_size[r->write_idx] : 0) + (size_t)free_blocks * HTTP_BLOCK;
  return room >= n;
}

/* Hands the block being filled to the caller. Lock held. */
static void complete_block(sf_shard_reader *r) {
  r->ready++;
  r->filling = false;
  pthread_cond_broadcast(&r->changed);
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *opaque) {
  sf_shard_reader *r = opaque;
  size_t n = size * nmemb;
  pthread_mutex_lock(&r->lock);
  if (r->stop) {
    pthread_mutex_unlock(&r->lock);
    return 0; /* ends the transfer (CURLE_WRITE_ERROR, ignored on close) */
  }
  if (!has_room(r, n)) {
    /* The caller is behind: leave the data with libcurl and the socket (bounded memory). */
    r->paused = true;
    pthread_mutex_unlock(&r->lock);
    return CURL_WRITEFUNC_PAUSE;
  }
  pthread_mutex_unlock(&r->lock);
  /* Only this thread touches the block being filled, so the copy runs unlocked; has_room()
   * counted a free block for every block this chunk starts. */
  for (size_t done = 0; done < n;) {
    if (!r->filling) {
      r->write_idx = (r->write_idx + 1) % HTTP_BLOCKS;
      r->block_size[r->write_idx] = 0;
      r->filling = true;
    }
    size_t *filled = &r->block_size[r->write_idx];
    size_t take = n - done < HTTP_BLOCK - *filled ? n - done : HTTP_BLOCK - *filled;
    memcpy(r->blocks[r->write_idx] + *filled, ptr + done, take);
    *filled += take;
    done += take;
    if (*filled == HTTP_BLOCK) {
      pthread_mutex_lock(&r->lock);
      complete_block(r);
      pthread_mutex_unlock(&r->lock);
    }
  }
  return n;
}

/* Maps a finished transfer's result to an error record; 0 when it succeeded. */
static int http_result(sf_shard_reader *r, sf_error *error) {
  if (r->result == CURLE_OK) return 0;
  long status = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
  const char *text = r->curl_text[0] ? r->curl_text : curl_easy_strerror(r->result);
  switch (r->result) {
  case CURLE_HTTP_RETURNED_ERROR:
    if (status == 404 || status == 410) {
      SET_ERROR(error, SF_ENOENT, r->url, r->offset,
                "HTTP %ld: the server has no such shard (%s) — check the URL and the shard list",
                status, text);
      return SF_ENOENT;
    }
    SET_ERROR(error, SF_ENET, r->url, r->offset,
              "HTTP %ld from the server (%s) — check access rights and the server's logs", status,
              text);
    return SF_ENET;
  case CURLE_OPERATION_TIMEDOUT:
    SET_ERROR(error, SF_ETIMEDOUT, r->url, r->offset,
              "timed out (%s) — the server is unreachable or stalled; raise connect_timeout / "
              "stall_timeout on tar_split if it is just slow",
              text);
    return SF_ETIMEDOUT;
  case CURLE_OUT_OF_MEMORY:
  case CURLE_WRITE_ERROR:
    SET_ERROR(error, SF_ENOMEM, r->url, r->offset, "out of memory while downloading (%s)", text);
    return SF_ENOMEM;
  case CURLE_UNSUPPORTED_PROTOCOL:
    SET_ERROR(error, SF_EDENIED, r->url, r->offset,
              "refused to follow (%s): only http and https URLs are fetched, redirects included",
              text);
    return SF_EDENIED;
  default:
    if (status >= 400)
      SET_ERROR(error, SF_ENET, r->url, r->offset, "HTTP %ld, then: %s", status, text);
    else
      SET_ERROR(error, SF_ENET, r->url, r->offset,
                "download failed: %s — check that the host name resolves and the server is "
                "running and reachable",
                text);
    return SF_ENET;
  }
}

/*
 * The fetcher: drives the transfer with libcurl's multi interface, pausing
 * while the ring is full, until the transfer ends or close asks it to stop.
 */
static void *fetch(void *arg) {
  sf_shard_reader *r = arg;
  for (;;) {
    pthread_mutex_lock(&r->lock);
    while (r->paused && !r->stop && !has_room(r, HTTP_BLOCK)) pthread_cond_wait(&r->changed, &r->lock);
    bool resume = r->paused && !r->stop;
    r->paused = false;
    bool stop = r->stop;
    pthread_mutex_unlock(&r->lock);
    if (stop) break;
    if (resume) curl_easy_pause(r->easy, CURLPAUSE_CONT); /* may deliver the held chunk at once */
    int running = 0;
    CURLMcode mc = curl_multi_perform(r->multi, &running);
    CURLMsg *msg;
    int left;
    bool finished = mc != CURLM_OK;
    while ((msg = curl_multi_info_read(r->multi, &left)))
      if (msg->msg == CURLMSG_DONE) {
        finished = true;
        r->result = msg->data.result;
      }
    if (mc != CURLM_OK) {
      r->result = CURLE_FAILED_INIT;
      snprintf(r->curl_text, sizeof r->curl_text, "libcurl failed: %s", curl_multi_strerror(mc));
    }
    if (finished) break;
    pthread_mutex_lock(&r->lock);
    bool wait_for_network = !r->paused;
    pthread_mutex_unlock(&r->lock);
    if (wait_for_network) curl_multi_poll(r->multi, NULL, 0, 1000, NULL);
  }
  pthread_mutex_lock(&r->lock);
  if (r->filling && r->block_size[r->write_idx] > 0) complete_block(r);
  r->done = true;
  pthread_cond_broadcast(&r->changed);
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

/* Waits up to 100 ms for the fetcher (lock held). False when the caller asks to cancel. */
static bool wait_slice(sf_shard_reader *r) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_nsec += 100 * 1000 * 1000;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  if (pthread_cond_timedwait(&r->changed, &r->lock, &deadline) == 0) return true;
  return !cancelled(r);
}

/*
 * Takes the next block: releases the one handed out last time, then waits for
 * a complete block or the end of the transfer. Returns its size, 0 at the end,
 * or the transfer's error once every byte received before it was handed out.
 */
static ssize_t read_http(sf_shard_reader *r, const void **data, sf_error *error) {
  pthread_mutex_lock(&r->lock);
  if (r->held) {
    r->held = false;
    r->read_idx = (r->read_idx + 1) % HTTP_BLOCKS;
    pthread_cond_broadcast(&r->changed);
  }
  while (r->ready == 0 && !r->done) {
    if (!wait_slice(r)) {
      pthread_mutex_unlock(&r->lock);
      return cancel_error(r, error);
    }
  }
  ssize_t n = 0;
  if (r->ready > 0) {
    r->ready--;
    r->held = true;
    *data = r->blocks[r->read_idx];
    n = (ssize_t)r->block_size[r->read_idx];
  }
  pthread_mutex_unlock(&r->lock);
  if (n == 0) {
    int rc = http_result(r, error);
    if (rc < 0) return rc;
  }
  return n;
}

/* Waits for the first block or the end: a 404 or a dead host shows at open. */
static int wait_first(sf_shard_reader *r, sf_error *error) {
  pthread_mutex_lock(&r->lock);
  while (r->ready == 0 && !r->done) {
    if (!wait_slice(r)) {
      pthread_mutex_unlock(&r->lock);
      return cancel_error(r, error);
    }
  }
  bool empty_end = r->ready == 0 && r->done;
  pthread_mutex_unlock(&r->lock);
  return empty_end ? http_result(r, error) : 0;
}

/* A deep socket buffer: the sender streams on while this side parses, with fewer wake-ups. */
static int big_receive_buffer(void *opaque, curl_socket_t fd, curlsocktype purpose) {
  int size = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  return CURL_SOCKOPT_OK;
}

static int open_http(sf_shard_reader *r, const sf_shard_reader_options *o, sf_error *error) {
  pthread_once(&curl_once, curl_init);
  if (curl_init_result != CURLE_OK) {
    SET_ERROR(error, SF_ENET, r->url, -1, "libcurl did not initialise: %s",
              curl_easy_strerror(curl_init_result));
    return SF_ENET;
  }
  r->multi = curl_multi_init();
  r->easy = curl_easy_init();
  if (!r->multi || !r->easy) return SF_ENOMEM;
  double connect = o && o->connect_timeout > 0 ? o->connect_timeout : 10.0;
  double stall = o && o->stall_timeout > 0 ? o->stall_timeout : 30.0;
  long stall_s = (long)stall < stall ? (long)stall + 1 : (long)stall;
  CURL *e = r->easy;
  int bad = 0;
  bad |= curl_easy_setopt(e, CURLOPT_URL, r->url);
  bad |= curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  bad |= curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  bad |= curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
  bad |= curl_easy_setopt(e, CURLOPT_MAXREDIRS, 10L);
  bad |= curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L);
  bad |= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  bad |= curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L * 1024); /* fewer, larger deliveries */
  bad |= curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
  bad |= curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  bad |= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(connect * 1000));
  bad |= curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
  bad |= curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, stall_s < 1 ? 1L : stall_s);
  bad |= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->curl_text);
  bad |= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
  bad |= curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  bad |= curl_easy_setopt(e, CURLOPT_USERAGENT, "shardflow");
  bad |= curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, big_receive_buffer);
  if (bad) {
    SET_ERROR(error, SF_EINVAL, r->url, -1,
              "libcurl refused the transfer options (is libcurl older than 7.85?)");
    return SF_EINVAL;
  }
  if (curl_multi_add_handle(r->multi, e) != CURLM_OK) return SF_ENOMEM;
  for (int i = 0; i < HTTP_BLOCKS; i++)
    if (!(r->blocks[i] = malloc(HTTP_BLOCK))) return SF_ENOMEM;
  r->write_idx = HTTP_BLOCKS - 1; /* the first block filled is blocks[0] */
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->changed, NULL);
  if (pthread_create(&r->fetcher, NULL, fetch, r) != 0) {
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->changed);
    return SF_ENOMEM;
  }
  r->fetcher_started = true;
  return wait_first(r, error);
}

/* ---- dispatch ---- */

/* True when url starts with a scheme ("s3://"), so it is not a plain path. */
static bool has_scheme(const char *url) {
  const char *p = url;
  if (!isalpha((unsigned char)*p)) return false;
  while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.') p++;
  return strncmp(p, "://", 3) == 0;
}

int sf_shard_reader_open(sf_shard_reader **reader, const char *url,
                         const sf_shard_reader_options *options, sf_error *error) {
  *reader = NULL;
  if (!url || !*url) {
    SET_ERROR(error, SF_EINVAL, "", -1, "empty shard URL — check the shard list");
    return SF_EINVAL;
  }
  sf_shard_reader *r = calloc(1, sizeof *r);
  if (!r || !(r->url = strdup(url))) {
    free(r);
    SET_ERROR(error, SF_ENOMEM, url, -1, "out of memory opening the shard");
    return SF_ENOMEM;
  }
  r->fd = -1;
  if (options) {
    r->cancelled = options->cancelled;
    r->cancel_opaque = options->cancel_opaque;
  }
  int rc;
  if (strncmp(url, "pipe:", 5) == 0) {
    r->kind = KIND_PIPE;
    r->command = r->url + 5;
    if (!options || !options->allow_pipe) {
      SET_ERROR(error, SF_EDENIED, url, -1,
                "pipe: URLs run shell commands and are off by default — set `allow_pipe: true` "
                "on shard_source if you trust the shard list");
      rc = SF_EDENIED;
    } else {
      rc = open_pipe(r, error);
    }
  } else if (strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0) {
    r->kind = KIND_HTTP;
    rc = open_http(r, options, error);
  } else if (strncmp(url, "file://", 7) == 0) {
    r->kind = KIND_FILE;
    char *path = file_url_path(url);
    if (!path) {
      SET_ERROR(error, SF_EINVAL, url, -1,
                "a file URL needs an absolute path (file:///data/shard.tar)");
      rc = SF_EINVAL;
    } else {
      rc = open_file(r, path, error);
      free(path);
    }
  } else if (has_scheme(url)) {
    SET_ERROR(error, SF_EUNSUPPORTED, url, -1,
              "unsupported URL scheme — use a path, file://, http://, https:// or "
              "pipe:CMD (e.g. pipe:aws s3 cp URL - with allow_pipe)");
    rc = SF_EUNSUPPORTED;
  } else {
    r->kind = KIND_FILE;
    rc = open_file(r, url, error);
  }
  if (rc < 0) {
    if (rc == SF_ENOMEM && error && error->code != SF_ENOMEM)
      SET_ERROR(error, SF_ENOMEM, url, -1, "out of memory opening the shard");
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
    n = read_http(r, data, error);
    if (n < 0) return n;
  } else {
    n = read_fd(r, data, error);
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

int64_t sf_shard_reader_offset(const sf_shard_reader *r) { return r->offset; }

void sf_shard_reader_close(sf_shard_reader **reader) {
  if (!reader || !*reader) return;
  sf_shard_reader *r = *reader;
  if (r->fd >= 0) close(r->fd);
  kill_pipe(r);
  if (r->fetcher_started) {
    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    curl_multi_wakeup(r->multi); /* out of a poll that waits on the network */
    pthread_join(r->fetcher, NULL);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->changed);
  }
  if (r->easy) {
    if (r->multi) curl_multi_remove_handle(r->multi, r->easy);
    curl_easy_cleanup(r->easy);
  }
  if (r->multi) curl_multi_cleanup(r->multi);
  for (int i = 0; i < HTTP_BLOCKS; i++) free(r->blocks[i]);
  free(r->chunk);
  free(r->url);
  free(r);
  *reader = NULL;
}
