/* Parallel shard downloads: one thread, one libcurl multi handle, bounded memory, retries with backoff, Range resume pinned by ETag. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "curl_lib.h"

#include "http.h"
#include "object_store.h"
#include "files.h"
#include "huge_map.h"
#include "prefetch.h"
#include "url.h"
#include "shardflow/stage.h"

/* Bytes arrive in blocks of 512 KiB; the download being read may hold 4 of them whatever the budget.
 * Blocks are cut from 2 MiB slabs that ask for a transparent huge page: one page fault (and one TLB
 * entry) per 4 blocks instead of 512 for 4 KiB pages, for the copy into them and the tar reader's reads. */
enum { BLOCK = 512 * 1024, RESERVE = 4 * BLOCK, SLAB = SF_HUGE_PAGE, SLAB_BLOCKS = SLAB / BLOCK };

typedef struct block {
  struct block *next;
  size_t size;
  uint8_t *data; /* BLOCK bytes in a slab */
} block;

/* A slab's memory and its blocks' headers; slabs live until sf_prefetch_destroy(). */
typedef struct slab {
  struct slab *next;
  uint8_t *mem;
  block blocks[SLAB_BLOCKS];
} slab;

typedef enum fetch_state { F_QUEUED, F_RUNNING, F_BACKOFF, F_DONE } fetch_state;

/* What a failed attempt says about its server: nothing (the failure may pass, or is the shard's), or a
 * hard cause that no wait fixes and that a dead or misconfigured server gives for every shard. */
typedef enum hard_cause { HARD_NONE, HARD_CONNECT, HARD_DNS, HARD_TLS, HARD_401, HARD_403 } hard_cause;

/*
 * One server (host:port) of the downloads, to tell a dead server from bad shards (options'
 * dead_host_shards).  Under p->lock; freed with the prefetcher.
 */
typedef struct server {
  struct server *next;
  char name[280];    /* host:port */
  bool served;       /* an attempt got an answer other than a hard failure: never dead */
  hard_cause cause;  /* of the failures in a row */
  int detail;        /* with HARD_CONNECT, connect()'s errno: "refused" and "unreachable" differ */
  int failed;        /* shards that failed in a row with that cause */
  unsigned streak;   /* numbers each run of failures (from 1), so that a shard counts once in it */
  bool dead;
  char text[480];    /* once dead: the message of every download from it */
} server;

/* How the body of the current attempt's response is treated. */
typedef enum body_mode { BODY_UNCHECKED, BODY_KEEP, BODY_DISCARD } body_mode;

struct sf_fetch {
  sf_prefetch *p;
  sf_fetch *next;     /* in p->list, in start order */
  char *url;          /* as given: may hold credentials, never printed */
  char shown[512];    /* redacted, for messages */
  bool is_store;      /* s3:// or gs://: signed per attempt */
  /* Shared with the reader, under p->lock. */
  fetch_state state;
  bool claimed;       /* being read: may use the reserve */
  bool closed;        /* the owner let go: the fetcher frees it */
  bool paused;        /* on_data left data with libcurl for want of room */
  block *head, *tail; /* unread bytes; tail may be partly filled while running */
  block *held;        /* handed to the reader, freed at its next read */
  int64_t buffered;   /* capacity of the blocks above, bytes */
  int64_t received;   /* body bytes kept = offset of the next byte wanted */
  int code;           /* once F_DONE: 0 or the failure */
  sf_error error;
  /* The fetcher thread only. */
  CURL *easy;
  bool in_multi;
  struct curl_slist *headers;
  double retry_at;      /* monotonic seconds (F_BACKOFF) */
  double last_progress; /* monotonic seconds: the last byte or header, or the attempt's start or unpause */
  int failures;         /* consecutive failed attempts that brought no new byte */
  int64_t attempt_from; /* received when the attempt started: its Range start */
  body_mode mode;
  int64_t skip;         /* bytes still to discard: a 200 answer to a Range request */
  int verdict;          /* a problem found by the callbacks that no retry can fix */
  char verdict_text[400];
  /* Headers of the attempt's last response (after redirects). */
  char etag[200], last_modified[64];
  int64_t range_start;  /* from Content-Range, -1 if none */
  int64_t range_total;  /* the object's size from Content-Range, -1 if none */
  double retry_after;   /* seconds, -1 if none */
  /* The version pinned by the first response. */
  char pin_etag[200], pin_modified[64];
  /* A ranged download (sf_prefetch_start_range): bytes [base, base + length) of the object; length 0 = all. */
  int64_t base, length;
  char want_etag[200];  /* a ranged download: the ETag the object must have (the index's), or "" */
  sf_object_version cached;  /* the caller's copy: the first request is conditional on it */
  sf_object_version version; /* the first response with a body (set before its first byte is kept) */
  bool not_modified;         /* the server answered 304 to the conditional request */
  char curl_text[CURL_ERROR_SIZE];
  server *server;            /* of the URL, or of the current attempt (set under the lock); NULL: not known yet */
  unsigned counted;          /* server->streak this download was counted in, or 0 */
  /* Failed for good the hard way while its server's verdict is open (F_BACKOFF, never retried): the
   * failure (in error, with parked_code) is reported once the server served a shard or failed otherwise
   * (then as it is), or is dead (then as its message), or no other download from it is left. */
  bool parked;
  int parked_code;
  int socket_errno;          /* why the attempt's socket() failed (open_socket), or 0 */
  /* s3/gs: where the attempt's credentials came from, and the start of an error answer's XML body. */
  char *credentials;
  sf_http_body error_body; /* at most 4 KiB */
};

struct sf_prefetch {
  sf_prefetch_options o;
  pthread_mutex_t lock;
  pthread_cond_t changed; /* a block became readable or a download changed state */
  pthread_t thread;
  bool thread_started;
  bool stop;
  CURLM *multi;
  sf_fetch *list;
  int64_t buffered;       /* over all downloads */
  block *spare;           /* free blocks kept for reuse: no mmap/munmap and page faults per block */
  slab *slabs;
  sf_prefetch_stats stats;
  sf_rng rng;             /* jitter; the fetcher thread only */
  server *servers;        /* every server asked so far */
  char *ca_file;          /* o.ca_file, copied */
  bool wake_pending;      /* changed() since the fetcher last called o.wake */
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A block became readable or a download changed state (lock held): wake blocked readers now and the
 * owner's wake hook once the fetcher thread lets go of the lock. */
static void changed(sf_prefetch *p) {
  pthread_cond_broadcast(&p->changed);
  p->wake_pending = true;
}

/* ---- buffers (lock held) ---- */

/* Adds a slab's blocks to the spare list: 2 MiB aligned so that the kernel can back it with one huge
 * page (madvise is advice: without THP it is 512 ordinary pages).  Returns false when out of memory. */
static bool add_slab(sf_prefetch *p) {
  slab *s = calloc(1, sizeof *s);
  uint8_t *mem = s ? sf_huge_map(SLAB) : NULL;
  if (!mem) {
    free(s);
    return false;
  }
  s->mem = mem;
  s->next = p->slabs;
  p->slabs = s;
  for (int i = 0; i < SLAB_BLOCKS; i++) {
    s->blocks[i].data = mem + (size_t)i * BLOCK;
    s->blocks[i].next = p->spare;
    p->spare = &s->blocks[i];
  }
  return true;
}

/* Room for n more bytes in f: the tail's free space plus new blocks, within the reserve or the budget. */
static bool has_room(const sf_prefetch *p, const sf_fetch *f, size_t n) {
  size_t free_tail = f->tail ? BLOCK - f->tail->size : 0;
  int64_t extra = n > free_tail ? (int64_t)((n - free_tail + BLOCK - 1) / BLOCK) * BLOCK : 0;
  if (f->claimed && f->buffered + extra <= RESERVE) return true;
  return p->buffered + extra <= p->o.max_bytes;
}

static int append(sf_prefetch *p, sf_fetch *f, const char *data, size_t n) {
  while (n > 0) {
    if (!f->tail || f->tail->size == BLOCK) {
      if (!p->spare && !add_slab(p)) return -1;
      block *b = p->spare;
      p->spare = b->next;
      b->next = NULL;
      b->size = 0;
      if (f->tail)
        f->tail->next = b;
      else
        f->head = b;
      f->tail = b;
      f->buffered += BLOCK;
      p->buffered += BLOCK;
    }
    size_t take = BLOCK - f->tail->size < n ? BLOCK - f->tail->size : n;
    memcpy(f->tail->data + f->tail->size, data, take);
    f->tail->size += take;
    data += take;
    n -= take;
    f->received += (int64_t)take;
    if (f->tail->size == BLOCK) changed(p);
  }
  return 0;
}

static void free_block(sf_prefetch *p, sf_fetch *f, block **b) {
  if (!*b) return;
  /* Kept for the next block: at most as many as were ever held at once (within the budget). */
  (*b)->next = p->spare;
  p->spare = *b;
  *b = NULL;
  f->buffered -= BLOCK;
  p->buffered -= BLOCK;
}

static void free_blocks(sf_prefetch *p, sf_fetch *f) {
  free_block(p, f, &f->held);
  while (f->head) {
    block *b = f->head;
    f->head = b->next;
    free_block(p, f, &b);
  }
  f->tail = NULL;
}

/* ---- libcurl callbacks (the fetcher thread, inside curl_multi_perform or curl_easy_pause) ---- */

static void copy_value(char *dst, size_t size, const char *v, size_t len) {
  while (len && isspace((unsigned char)*v)) v++, len--;
  while (len && isspace((unsigned char)v[len - 1])) len--;
  if (len >= size) len = size - 1;
  memcpy(dst, v, len);
  dst[len] = '\0';
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *opaque) {
  sf_fetch *f = opaque;
  size_t n = size * nmemb;
  f->last_progress = now();
  if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
    /* A new response (after a redirect or a 100 Continue): forget the last one's headers. */
    f->etag[0] = f->last_modified[0] = '\0';
    f->range_start = -1;
    f->retry_after = -1;
    return n;
  }
  const char *colon = memchr(line, ':', n);
  if (!colon) return n;
  size_t name_len = (size_t)(colon - line);
  const char *v = colon + 1;
  size_t v_len = n - name_len - 1;
  char value[256];
  copy_value(value, sizeof value, v, v_len);
  if (name_len == 4 && strncasecmp(line, "etag", 4) == 0) {
    copy_value(f->etag, sizeof f->etag, v, v_len);
  } else if (name_len == 13 && strncasecmp(line, "last-modified", 13) == 0) {
    copy_value(f->last_modified, sizeof f->last_modified, v, v_len);
  } else if (name_len == 13 && strncasecmp(line, "content-range", 13) == 0) {
    long long start, end, total;
    if (sscanf(value, "bytes %lld-", &start) == 1) f->range_start = start;
    if (sscanf(value, "bytes %lld-%lld/%lld", &start, &end, &total) == 3) f->range_total = total;
  } else if (name_len == 11 && strncasecmp(line, "retry-after", 11) == 0) {
    char *end;
    double s = strtod(value, &end);
    if (end != value && *end == '\0' && s >= 0) {
      f->retry_after = s;
    } else {
      time_t when = curl_getdate(value, NULL);
      if (when >= 0) {
        double d = difftime(when, time(NULL));
        f->retry_after = d > 0 ? d : 0;
      }
    }
  }
  return n;
}

static bool strong_etag(const char *etag) { return etag[0] && strncmp(etag, "W/", 2) != 0; }

/* check_response for a ranged download: only the bytes asked for, of the version asked for. */
static void check_ranged(sf_fetch *f, long status, int64_t from) {
  bool same = !f->want_etag[0] || strcmp(f->etag, f->want_etag) == 0;
  if (status != 206 || f->range_start != f->base + from) {
    f->verdict = SF_EUNSUPPORTED;
    snprintf(f->verdict_text, sizeof f->verdict_text,
             "asked for bytes %lld-%lld, the server answered %ld%s — reading samples by range needs a server "
             "that serves byte ranges (HTTP Range)", (long long)(f->base + from),
             (long long)(f->base + f->length - 1), status, status == 206 ? " with other bytes" : "");
  } else if (!same) {
    f->verdict = SF_EIO;
    snprintf(f->verdict_text, sizeof f->verdict_text,
             "the shard changed since it was indexed (ETag %.100s, the index has %.100s): run shardflow index on "
             "it again", f->etag[0] ? f->etag : "none", f->want_etag);
  } else if (from == 0) {
    snprintf(f->version.etag, sizeof f->version.etag, "%s", f->etag);
    snprintf(f->version.last_modified, sizeof f->version.last_modified, "%s", f->last_modified);
    if (!f->pin_etag[0] && strong_etag(f->etag)) snprintf(f->pin_etag, sizeof f->pin_etag, "%s", f->etag);
    else if (!f->pin_etag[0] && f->last_modified[0])
      snprintf(f->pin_modified, sizeof f->pin_modified, "%s", f->last_modified);
  }
}

/*
 * check_response for a whole-object download resumed at byte `from` (> 0): the rest of the same version,
 * as 206 from that byte, or as 200 (the whole object again) to skip up to it.
 */
static void check_resumed(sf_fetch *f, long status, int64_t from) {
  bool same = f->pin_etag[0] ? strcmp(f->etag, f->pin_etag) == 0
                             : f->pin_modified[0] && strcmp(f->last_modified, f->pin_modified) == 0;
  const char *now_tag = f->pin_etag[0] ? f->etag : f->last_modified;
  const char *pin_tag = f->pin_etag[0] ? f->pin_etag : f->pin_modified;
  if (status == 206) {
    if (f->range_start != from) {
      f->verdict = SF_EIO;
      snprintf(f->verdict_text, sizeof f->verdict_text,
               "asked to resume at byte %lld, the server sent bytes from %lld — check the server "
               "or proxy in front of it",
               (long long)from, (long long)f->range_start);
    } else if (now_tag[0] && !same) {
      f->verdict = SF_EIO;
      snprintf(f->verdict_text, sizeof f->verdict_text,
               "the object changed while it was read (validator %.100s, then %.100s): the shard is not "
               "spliced from two versions — rerun once the upload is complete",
               pin_tag, now_tag);
    }
    return;
  }
  /* 200 to a Range request: the whole object again; usable only if it is the same version. */
  if (same) {
    f->skip = from;
    return;
  }
  f->verdict = SF_EIO;
  snprintf(f->verdict_text, sizeof f->verdict_text,
           "the server ignored the Range request to resume at byte %lld and sent an object whose "
           "validator (%.100s) %s the first response's (%.100s): the shard is not spliced from two versions",
           (long long)from, now_tag[0] ? now_tag : "none",
           now_tag[0] ? "differs from" : "cannot be compared with", pin_tag);
}

/*
 * The first body bytes of an attempt: is this the object (and the range) we
 * asked for?  Sets f->mode, f->skip, or f->verdict for a response that no
 * retry can fix.  Only the fetcher thread; no lock needed.
 */
static void check_response(sf_fetch *f) {
  long status = 0;
  curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &status);
  if (status < 200 || status >= 300) {
    f->mode = BODY_DISCARD; /* an error page: the status says it all (on_done) */
    return;
  }
  f->mode = BODY_KEEP;
  int64_t from = f->attempt_from;
  if (f->length > 0) {
    check_ranged(f, status, from);
  } else if (from != 0) {
    check_resumed(f, status, from);
  } else if (status == 206) {
    f->verdict = SF_EIO;
    snprintf(f->verdict_text, sizeof f->verdict_text,
             "the server answered a whole-object request with 206 Partial Content — check the "
             "server or proxy in front of it");
  } else { /* the first answer: its version is what later attempts must match */
    snprintf(f->version.etag, sizeof f->version.etag, "%s", f->etag);
    snprintf(f->version.last_modified, sizeof f->version.last_modified, "%s", f->last_modified);
    if (!f->pin_etag[0] && !f->pin_modified[0]) {
      if (strong_etag(f->etag))
        snprintf(f->pin_etag, sizeof f->pin_etag, "%s", f->etag);
      else if (f->last_modified[0])
        snprintf(f->pin_modified, sizeof f->pin_modified, "%s", f->last_modified);
    }
  }
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *opaque) {
  sf_fetch *f = opaque;
  sf_prefetch *p = f->p;
  size_t n = size * nmemb;
  if (f->mode == BODY_UNCHECKED) check_response(f);
  if (f->verdict) return 0; /* ends the attempt; on_done reports the verdict */
  if (f->mode == BODY_DISCARD) {
    /* A store's error page names its own error code: keep its start for the message. */
    if (f->is_store) (void)sf_http_body_write(ptr, size, nmemb, &f->error_body); /* best effort */
    return n;
  }
  size_t skip = f->skip < (int64_t)n ? (size_t)f->skip : n;
  pthread_mutex_lock(&p->lock);
  if (f->closed) {
    pthread_mutex_unlock(&p->lock);
    return 0;
  }
  if (!has_room(p, f, n - skip)) {
    /* The reader is behind: leave the data with libcurl and the socket (bounded memory). */
    f->paused = true;
    pthread_mutex_unlock(&p->lock);
    return CURL_WRITEFUNC_PAUSE;
  }
  f->skip -= (int64_t)skip;
  f->last_progress = now();
  p->stats.bytes += n;
  p->stats.refetched_bytes += skip;
  int rc = append(p, f, ptr + skip, n - skip);
  pthread_mutex_unlock(&p->lock);
  if (rc < 0) {
    f->verdict = SF_ENOMEM;
    snprintf(f->verdict_text, sizeof f->verdict_text, "out of memory while downloading");
    return 0;
  }
  return n;
}

/* A deep socket buffer: the sender streams on while this side parses, with fewer wake-ups. */
static int big_receive_buffer(void *opaque, curl_socket_t fd, curlsocktype purpose) {
  (void)opaque, (void)purpose;
  int size = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  return CURL_SOCKOPT_OK;
}

/*
 * Opens a connection's socket as libcurl does (close-on-exec as well: a pipe: command must not inherit it),
 * keeping socket()'s errno: out of descriptors is a limit to raise, which libcurl's "could not connect"
 * would otherwise show as a dead server.
 */
static curl_socket_t open_socket(void *opaque, curlsocktype purpose, struct curl_sockaddr *address) {
  sf_fetch *f = opaque;
  (void)purpose;
  curl_socket_t fd = socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
  f->socket_errno = fd == CURL_SOCKET_BAD ? errno : 0;
  return fd;
}

/* ---- servers ---- */

/* host:port of url (the port libcurl would use), or "" when libcurl cannot parse it. */
static void server_name(const char *url, char *out, size_t size) {
  out[0] = '\0';
  CURLU *u = curl_url();
  char *host = NULL, *port = NULL;
  if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK)
    snprintf(out, size, "%s:%s", host, port);
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
}

/* The record of server `name`, made on first use (lock held). NULL when out of memory or unnamed: not tracked. */
static server *find_server(sf_prefetch *p, const char *name) {
  if (!name[0]) return NULL;
  for (server *s = p->servers; s; s = s->next)
    if (strcmp(s->name, name) == 0) return s;
  server *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  snprintf(s->name, sizeof s->name, "%s", name);
  s->streak = 1;
  s->next = p->servers;
  p->servers = s;
  return s;
}

/* ---- attempts (fetcher thread) ---- */

/* Marks f failed for good (lock held). */
static void give_up(sf_prefetch *p, sf_fetch *f, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void give_up(sf_prefetch *p, sf_fetch *f, int code, const char *fmt, ...) {
  char text[480];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  sf_error_set(&f->error, code, SF_AT(.url = f->shown, .offset = f->received), "%s", text);
  f->code = code;
  f->state = F_DONE;
  f->parked = false;
  p->stats.failed++;
  changed(p);
}

/* Keeps f's failure (code, text) back until its server's verdict (lock held); see sf_fetch.parked. */
static void park(sf_fetch *f, int code, const char *text) {
  sf_error_set(&f->error, code, SF_AT(.url = f->shown, .offset = f->received), "%s", text);
  f->parked = true;
  f->parked_code = code;
  f->state = F_BACKOFF;
}

/* Reports f's parked failure as it was (lock held). */
static void unpark(sf_prefetch *p, sf_fetch *f) {
  f->parked = false;
  f->code = f->parked_code;
  f->state = F_DONE;
  p->stats.failed++;
  changed(p);
}

/* The verdict on s is in, and it is not "dead": parked failures from it are reported as they are (lock held). */
static void unpark_server(sf_prefetch *p, const server *s) {
  for (sf_fetch *g = p->list; g; g = g->next)
    if (g->parked && g->server == s && !g->closed) unpark(p, g);
}

/* Whether a download other than f that could come from f's server is still to end (lock held). */
static bool server_pending(const sf_prefetch *p, const sf_fetch *f) {
  for (const sf_fetch *g = p->list; g; g = g->next)
    if (g != f && !g->closed && !g->parked && g->state != F_DONE && (g->server == f->server || !g->server))
      return true;
  return false;
}

/* The engine's shared transfer settings (engine/http.h), then this fetcher's callbacks. */
static int new_easy(sf_prefetch *p, sf_fetch *f) {
  sf_http_options o = {.follow_redirects = true,
                       .connect_timeout_ms = (long)(p->o.connect_timeout * 1000),
                       .error_text = f->curl_text,
                       .ca_file = p->ca_file};
  int rc = sf_http_easy_new(NULL, &o, &f->easy);
  if (rc < 0) return rc;
  CURL *e = f->easy;
  int bad = 0;
  bad |= curl_easy_setopt(e, CURLOPT_PRIVATE, f);
  bad |= curl_easy_setopt(e, CURLOPT_BUFFERSIZE, (long)BLOCK); /* fewer, larger deliveries */
  bad |= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
  bad |= curl_easy_setopt(e, CURLOPT_WRITEDATA, f);
  bad |= curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  bad |= curl_easy_setopt(e, CURLOPT_HEADERDATA, f);
  bad |= curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, big_receive_buffer);
  bad |= curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  bad |= curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, f);
  return bad ? SF_EINVAL : 0;
}

/* Size of the text that explains why an attempt could not start. */
enum { ATTEMPT_TEXT = 480 };

/*
 * Points f's handle (made on its first attempt) at its URL with the attempt's conditions (NULL-terminated header
 * lines): for an object store a freshly signed request (Azure's Shared Key signs the conditions too), whose
 * headers f keeps. name gets the server's host:port. Returns 0 or an error explained in text.
 */
static int aim_request(sf_prefetch *p, sf_fetch *f, const char *const *conditions, char *name, size_t name_size,
                       char *text) {
  int code = 0;
  if (!f->easy) {
    code = new_easy(p, f);
    if (code == SF_ENOMEM)
      snprintf(text, ATTEMPT_TEXT, "out of memory starting the download");
    else if (code < 0)
      snprintf(text, ATTEMPT_TEXT, "libcurl refused the transfer options (is libcurl older than 7.85?)");
  }
  curl_slist_free_all(f->headers);
  f->headers = NULL;
  if (code) return code;
  if (!f->is_store) {
    curl_easy_setopt(f->easy, CURLOPT_URL, f->url);
    server_name(f->url, name, name_size);
    for (size_t i = 0; conditions[i]; i++) {
      struct curl_slist *h = curl_slist_append(f->headers, conditions[i]);
      if (!h) {
        snprintf(text, ATTEMPT_TEXT, "out of memory starting the download");
        return SF_ENOMEM;
      }
      f->headers = h;
    }
    return 0;
  }
  sf_object_request request = {0};
  sf_error error;
  int rc = sf_object_request_prepare_headers(f->url, "GET", NULL, NULL, 0, conditions, &request, &error);
  if (rc < 0) {
    code = rc;
    snprintf(text, ATTEMPT_TEXT, "%.400s", error.message);
  } else {
    curl_easy_setopt(f->easy, CURLOPT_URL, request.url);
    server_name(request.url, name, name_size);
    f->headers = request.headers;
    request.headers = NULL;
    free(f->credentials);
    f->credentials = request.credentials;
    request.credentials = NULL;
  }
  sf_object_request_clear(&request);
  return code;
}

/*
 * The conditions of a request from byte from, as header lines in lines (*count of them): a whole-object one asks
 * whether the caller's copy is still current; a resumed one is pinned to the first response's version, with its
 * Range. Returns 0 or an error explained in text.
 */
static int make_conditions(sf_fetch *f, int64_t from, char lines[3][280], size_t *count, char *text) {
  *count = 0;
  if (from == 0 && f->cached.etag[0])
    snprintf(lines[(*count)++], 280, "If-None-Match: %s", f->cached.etag);
  else if (from == 0 && f->cached.last_modified[0])
    snprintf(lines[(*count)++], 280, "If-Modified-Since: %s", f->cached.last_modified);
  if (f->length > 0) { /* a ranged download: its range, pinned to the index's version when known */
    if (f->pin_etag[0])
      snprintf(lines[(*count)++], 280, "If-Match: %s", f->pin_etag);
    else if (f->pin_modified[0])
      snprintf(lines[(*count)++], 280, "If-Unmodified-Since: %s", f->pin_modified);
    snprintf(lines[(*count)++], 280, "Range: bytes=%lld-%lld", (long long)(f->base + from),
             (long long)(f->base + f->length - 1));
    return 0;
  }
  if (from > 0) {
    if (f->pin_etag[0]) {
      snprintf(lines[(*count)++], 280, "If-Match: %s", f->pin_etag);
    } else if (f->pin_modified[0]) {
      snprintf(lines[(*count)++], 280, "If-Unmodified-Since: %s", f->pin_modified);
    } else {
      snprintf(text, ATTEMPT_TEXT,
               "the connection broke at byte %lld and the server sent neither an ETag nor a "
               "Last-Modified date, so a resumed download could mix two versions of the object — "
               "fix the server, or retry the run",
               (long long)from);
      return SF_ENET;
    }
    snprintf(lines[(*count)++], 280, "Range: bytes=%lld-", (long long)from);
  }
  return 0;
}

/* Clears what the last attempt saw and hands the transfer to the multi handle. Returns 0 or an error in text. */
static int launch_attempt(sf_prefetch *p, sf_fetch *f, int64_t from, char *text) {
  curl_easy_setopt(f->easy, CURLOPT_HTTPHEADER, f->headers);
  f->attempt_from = from;
  f->mode = BODY_UNCHECKED;
  f->skip = 0;
  f->verdict = 0;
  sf_strbuf_truncate(&f->error_body.text, 0);
  f->curl_text[0] = '\0';
  f->socket_errno = 0;
  f->etag[0] = f->last_modified[0] = '\0';
  f->range_start = -1;
  f->range_total = -1;
  f->retry_after = -1;
  f->last_progress = now();
  if (curl_multi_add_handle(p->multi, f->easy) != CURLM_OK) {
    snprintf(text, ATTEMPT_TEXT, "libcurl could not add the transfer");
    return SF_ENOMEM;
  }
  f->in_multi = true;
  return 0;
}

/*
 * Starts one attempt of f: from byte 0, or from the byte reached with a Range
 * pinned to the first response's version.  Returns false when f failed for
 * good instead (reported in f).
 */
static bool start_attempt(sf_prefetch *p, sf_fetch *f) {
  pthread_mutex_lock(&p->lock);
  int64_t from = f->received;
  pthread_mutex_unlock(&p->lock);
  char text[ATTEMPT_TEXT] = "", lines[3][280], name[280] = "";
  size_t count = 0;
  int code = make_conditions(f, from, lines, &count, text);
  const char *conditions[4] = {NULL};
  for (size_t i = 0; i < count; i++) conditions[i] = lines[i];
  if (!code) code = aim_request(p, f, conditions, name, sizeof name, text);
  if (!code) {
    /* A dead server is not asked again: the download fails as the others from it did. */
    pthread_mutex_lock(&p->lock);
    f->server = find_server(p, name);
    if (f->server && f->server->dead) {
      code = SF_EHOSTDOWN;
      snprintf(text, sizeof text, "%s", f->server->text);
    }
    pthread_mutex_unlock(&p->lock);
  }
  if (!code) code = launch_attempt(p, f, from, text);
  pthread_mutex_lock(&p->lock);
  if (code) {
    give_up(p, f, code, "%s", text);
  } else {
    f->state = F_RUNNING;
    if (from > 0) p->stats.resumes++;
  }
  pthread_mutex_unlock(&p->lock);
  return code == 0;
}

/* Seconds to wait before retry number `failures` (1, 2, ...): exponential, with jitter. */
static double backoff(sf_prefetch *p, int failures) {
  double d = p->o.retry_wait * pow(2.0, failures - 1);
  if (d > p->o.retry_max_wait) d = p->o.retry_max_wait;
  return d / 2 + sf_rng_double(&p->rng) * d / 2;
}

/*
 * What the end of f's attempt says about its server (lock held): an answer proves it alive for good;
 * a hard failure counts the shard in the server's run of failures alike, and at dead_host_shards the
 * server is dead (its downloads waiting for a retry fail now, running ones when they end, later ones
 * at their start); anything else breaks the run.
 */
static void note_server(sf_prefetch *p, sf_fetch *f, int code, long status, hard_cause hard, int detail,
                        const char *text) {
  server *s = f->server;
  if (s->dead || s->served) return;
  if (hard == HARD_NONE) {
    if (code == 0 || status > 0 || f->received > f->attempt_from) s->served = true;
    s->failed = 0;
    s->streak++;
    unpark_server(p, s);
    return;
  }
  if (hard != s->cause || detail != s->detail) {
    s->cause = hard;
    s->detail = detail;
    s->failed = 0;
    s->streak++;
    unpark_server(p, s); /* not every shard fails the same way */
  }
  if (f->counted != s->streak) {
    f->counted = s->streak;
    s->failed++;
  }
  if (p->o.dead_host_shards <= 0 || s->failed < p->o.dead_host_shards) return;
  s->dead = true;
  snprintf(s->text, sizeof s->text,
           "%d shards in a row failed alike and the server has served none, so the run stops whatever "
           "error_policy says (dead_host_shards: 0 on tar_split turns this off): %.300s",
           s->failed, text);
  for (sf_fetch *g = p->list; g; g = g->next)
    if (g != f && g->server == s && !g->closed && g->state == F_BACKOFF) give_up(p, g, SF_EHOSTDOWN, "%s", s->text);
}

/* What a finished attempt says: its error code (0: done), whether a wait may fix it, and whether it is one
 * no wait fixes that a dead or misconfigured server gives for every shard (hard, with detail). */
typedef struct attempt_verdict {
  int code;
  bool retry;
  hard_cause hard;
  int detail;
  char text[480];
} attempt_verdict;

/* An HTTP status the download cannot use (status >= 400, or not 2xx on a finished transfer). */
static void judge_http_status(const sf_fetch *f, long status, const char *name, attempt_verdict *v) {
  if (status == 404 || status == 410) {
    v->code = SF_ENOENT;
    snprintf(v->text, sizeof v->text, "HTTP %ld: the server has no such shard — check the URL and the shard list",
             status);
  } else if (status == 412 && f->length > 0) {
    v->code = SF_EIO;
    snprintf(v->text, sizeof v->text,
             "HTTP 412: the shard changed since it was indexed (If-Match %s failed): run shardflow index on it "
             "again", f->pin_etag[0] ? f->pin_etag : f->pin_modified);
  } else if (status == 412) {
    v->code = SF_EIO;
    snprintf(v->text, sizeof v->text,
             "HTTP 412: the object changed since the download began (If-Match %s failed on resuming at "
             "byte %lld); the shard is not spliced from two versions — rerun once the upload is complete",
             f->pin_etag[0] ? f->pin_etag : f->pin_modified, (long long)f->attempt_from);
  } else if (status == 408 || status == 429 || status >= 500) {
    v->code = SF_ENET;
    v->retry = true;
    snprintf(v->text, sizeof v->text, "HTTP %ld from the server — it is overloaded or failing; check its logs",
             status);
  } else if (status == 401) {
    v->code = SF_ENET;
    v->hard = HARD_401;
    snprintf(v->text, sizeof v->text,
             "HTTP 401 from %.100s: it wants credentials — give them in the URL (https://USER:PASSWORD@host/...) "
             "or check them", name);
  } else if (status == 403) {
    v->code = SF_ENET;
    v->hard = HARD_403;
    snprintf(v->text, sizeof v->text, "HTTP 403 from %.100s: access denied — check access rights and the server's logs",
             name);
  } else {
    v->code = SF_ENET;
    snprintf(v->text, sizeof v->text, "HTTP %ld from the server — check access rights and the server's logs",
             status);
  }
  if (f->is_store && status != 412) {
    /* The store's error code and the credentials' source, worded as listings and uploads word them. */
    sf_object_request used = {.credentials = f->credentials};
    sf_error store_error;
    int store_code = sf_object_http_error(f->shown, "download", status, f->error_body.text.data,
                                          f->error_body.text.len, &used, &store_error);
    if (!v->retry) v->code = store_code;
    snprintf(v->text, sizeof v->text, "%.470s", store_error.message);
  }
}

/* No connection to the server: retried, and a hard cause whose detail is the system's errno. */
static void judge_no_connection(sf_fetch *f, const char *curl_text, const char *name, attempt_verdict *v) {
  long os_errno = 0;
  curl_easy_getinfo(f->easy, CURLINFO_OS_ERRNO, &os_errno);
  v->code = SF_ENET;
  v->retry = true;
  v->hard = HARD_CONNECT;
  v->detail = (int)os_errno;
  bool example = strcmp(name, "127.0.0.1:8750") == 0 || strcmp(name, "localhost:8750") == 0;
  snprintf(v->text, sizeof v->text, "download failed: %.200s (%s) — is the server running and listening on %.100s?%s",
           curl_text, os_errno ? strerror((int)os_errno) : "no detail", name,
           example ? " tools/nginx.sh serves the example shards on :8750" : "");
}

/* A transfer libcurl ended with an error (result); curl_text says which. */
static void judge_curl_result(sf_fetch *f, CURLcode result, const char *curl_text, const char *name,
                              attempt_verdict *v) {
  switch (result) {
  case CURLE_OPERATION_TIMEDOUT:
    v->code = SF_ETIMEDOUT;
    v->retry = true;
    snprintf(v->text, sizeof v->text,
             "timed out (%s) — the server is unreachable or stalled; raise connect_timeout / "
             "stall_timeout / retries on tar_split if it is just slow",
             curl_text);
    break;
  case CURLE_COULDNT_CONNECT: judge_no_connection(f, curl_text, name, v); break;
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY:
    v->code = SF_ENET;
    v->hard = HARD_DNS;
    snprintf(v->text, sizeof v->text,
             "download failed: %s — check the host name in the shard list and that it resolves here", curl_text);
    break;
  case CURLE_PEER_FAILED_VERIFICATION:
    v->code = SF_ENET;
    v->hard = HARD_TLS;
    snprintf(v->text, sizeof v->text,
             "the TLS certificate of %.100s could not be verified (%.200s) — if a private CA signed it, set "
             "tar_split's ca_file (or the SSL_CERT_FILE variable) to that CA's PEM certificate",
             name, curl_text);
    break;
  case CURLE_SSL_CACERT_BADFILE:
  case CURLE_SSL_CRL_BADFILE:
    v->code = SF_ENET;
    v->hard = HARD_TLS;
    snprintf(v->text, sizeof v->text,
             "cannot use the trusted CA certificates (%s) — check the file in tar_split's ca_file or the "
             "SSL_CERT_FILE variable: PEM certificates, readable", curl_text);
    break;
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_SSL_CERTPROBLEM:
  case CURLE_SSL_CIPHER:
  case CURLE_SSL_ISSUER_ERROR:
  case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
  case CURLE_SSL_INVALIDCERTSTATUS:
    v->code = SF_ENET;
    v->hard = HARD_TLS;
    snprintf(v->text, sizeof v->text,
             "TLS with %.100s failed (%.200s) — check that it serves https on that port and its TLS set-up", name,
             curl_text);
    break;
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_PARTIAL_FILE:
  case CURLE_GOT_NOTHING:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM:
    v->code = SF_ENET;
    v->retry = true;
    snprintf(v->text, sizeof v->text,
             "download failed: %s — check that the server is running and reachable", curl_text);
    break;
  case CURLE_OUT_OF_MEMORY:
    v->code = SF_ENOMEM;
    snprintf(v->text, sizeof v->text, "out of memory while downloading (%s)", curl_text);
    break;
  case CURLE_UNSUPPORTED_PROTOCOL:
    v->code = SF_EDENIED;
    snprintf(v->text, sizeof v->text,
             "refused to follow (%s): only http and https URLs are fetched, redirects included", curl_text);
    break;
  default:
    v->code = SF_ENET;
    snprintf(v->text, sizeof v->text,
             "download failed: %s — check that the host name resolves and the server is running and "
             "reachable",
             curl_text);
    break;
  }
}

/* Judges f's finished attempt from its status, libcurl's result and what was seen on the way. */
static void judge_attempt(sf_fetch *f, CURLcode result, long status, attempt_verdict *v) {
  const char *curl_text = f->curl_text[0] ? f->curl_text : curl_easy_strerror(result);
  const char *name = f->server ? f->server->name : "the server"; /* the record lives as long as p */
  bool conditional = f->attempt_from == 0 && (f->cached.etag[0] || f->cached.last_modified[0]);
  if (f->verdict) {
    v->code = f->verdict;
    snprintf(v->text, sizeof v->text, "%s", f->verdict_text);
  } else if (status == 304 && conditional && result == CURLE_OK) {
    f->not_modified = true; /* the caller's copy is current: done, with no body */
  } else if (status >= 400 || (result == CURLE_OK && (status < 200 || status >= 300))) {
    judge_http_status(f, status, name, v);
  } else if (result != CURLE_OK && sf_errno_is_fd_limit(f->socket_errno)) {
    v->code = SF_EMFILE; /* the server was never asked; others' descriptors may be closed by the retry */
    v->retry = true;
    char limit[200];
    snprintf(v->text, sizeof v->text, "cannot open a connection: %s",
             sf_fd_limit_text(f->socket_errno, limit, sizeof limit));
  } else if (result != CURLE_OK) {
    judge_curl_result(f, result, curl_text, name, v);
  }
}

/* A failed attempt (lock held): a retry after a wait while the budget lasts, else a failure for good, or parked
 * with the other shards of its server when it may prove the server dead. */
static void retry_or_fail(sf_prefetch *p, sf_fetch *f, const attempt_verdict *v) {
  int code = v->code;
  bool retry = v->retry;
  const char *text = v->text;
  if (f->received > f->attempt_from) f->failures = 0; /* progress: the budget starts again */
  bool too_long = retry && f->retry_after > p->o.retry_max_wait;
  if (retry && !too_long && f->failures < p->o.retries) {
    f->failures++;
    double wait = backoff(p, f->failures);
    if (f->retry_after > wait) wait = f->retry_after;
    f->retry_at = now() + wait;
    f->state = F_BACKOFF;
    p->stats.retries++;
    changed(p); /* the reader may take the bytes so far */
    return;
  }
  char final[480];
  if (too_long)
    snprintf(final, sizeof final,
             "%.300s; it asked to retry after %.0f s, longer than retry_max_wait (%.0f s) — raise "
             "retry_max_wait on tar_split or retry later",
             text, f->retry_after, p->o.retry_max_wait);
  else if (code == SF_EMFILE && p->o.retries > 0)
    snprintf(final, sizeof final, "%.400s; still so after %d retries", text, f->failures);
  else if (retry && p->o.retries > 0)
    snprintf(final, sizeof final,
             "%.350s (gave up after %d retries without progress; raise `retries` on tar_split)", text,
             f->failures);
  else
    snprintf(final, sizeof final, "%s", text);
  /* A hard failure while the other shards from the server may still show it dead: report it with them. */
  server *s = f->server;
  if (v->hard != HARD_NONE && s && !s->served && !s->dead && f->counted == s->streak && p->o.dead_host_shards > 0 &&
      server_pending(p, f))
    park(f, code, final);
  else
    give_up(p, f, code, "%s", final);
}

/* Classifies a finished attempt: done, retry after a wait, or failed for good. */
static void on_done(sf_prefetch *p, sf_fetch *f, CURLcode result) {
  long status = 0;
  curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &status);
  attempt_verdict v = {.hard = HARD_NONE};
  judge_attempt(f, result, status, &v);
  pthread_mutex_lock(&p->lock);
  if (f->server && !f->closed) note_server(p, f, v.code, status, v.hard, v.detail, v.text);
  if (f->closed) {
    f->state = F_DONE;
  } else if (v.code == 0) {
    f->state = F_DONE;
    f->code = 0;
    if (f->not_modified) p->stats.not_modified++;
    else {
      p->stats.completed++;
      p->stats.completed_bytes += (uint64_t)f->received;
    }
    changed(p);
  } else if (f->server && f->server->dead) {
    give_up(p, f, SF_EHOSTDOWN, "%s", f->server->text); /* no retry: the server is dead */
  } else {
    retry_or_fail(p, f, &v);
  }
  pthread_mutex_unlock(&p->lock);
}

static void release_curl(sf_prefetch *p, sf_fetch *f) {
  if (f->easy) {
    if (f->in_multi) curl_multi_remove_handle(p->multi, f->easy);
    curl_easy_cleanup(f->easy);
    f->easy = NULL;
    f->in_multi = false;
  }
  curl_slist_free_all(f->headers);
  f->headers = NULL;
}

static void free_fetch(sf_fetch *f) {
  sf_strbuf_clear(&f->error_body.text);
  free(f->credentials);
  free(f->url);
  free(f);
}

/* What the fetcher does with a download this round, decided under the lock and done after it. */
typedef enum fetch_todo { TODO_NOTHING, TODO_START, TODO_UNPAUSE, TODO_STALLED } fetch_todo;

/* Unlinks the closed downloads (lock held) and returns them, linked by next; their curl handles are freed
 * unlocked. */
static sf_fetch *unlink_closed(sf_prefetch *p) {
  sf_fetch *dead = NULL;
  for (sf_fetch **pp = &p->list; *pp;) {
    sf_fetch *f = *pp;
    if (f->closed) {
      *pp = f->next;
      f->next = dead;
      dead = f;
    } else {
      pp = &f->next;
    }
  }
  return dead;
}

/*
 * Decides what to do with each of the first n downloads from first (lock held): start queued ones while fewer
 * than max_transfers run, retry those whose wait is over, resume paused ones that have room again, drop stalled
 * ones. Lowers *wait to when the next of them is due.
 */
static void decide_todo(sf_prefetch *p, sf_fetch *first, int n, int active, fetch_todo *todo, double *wait) {
  double t = now();
  int i = 0;
  for (sf_fetch *f = first; i < n; f = f->next, i++) {
    if (f->parked) {
      if (!server_pending(p, f)) unpark(p, f); /* no other shard from its server to judge it by */
      if (*wait > 0.1) *wait = 0.1;
    } else if (f->state == F_QUEUED && active < p->o.max_transfers) {
      todo[i] = TODO_START;
      active++;
    } else if (f->state == F_BACKOFF) {
      if (f->retry_at <= t)
        todo[i] = TODO_START;
      else if (f->retry_at - t < *wait)
        *wait = f->retry_at - t;
    } else if (f->state == F_RUNNING && f->paused && has_room(p, f, BLOCK)) {
      f->paused = false;
      f->last_progress = t; /* a pause is the reader's doing, not the server's */
      todo[i] = TODO_UNPAUSE;
    } else if (f->state == F_RUNNING && !f->paused) {
      /* Our own stall clock: libcurl's low-speed check averages over ~5 s of history. */
      if (t - f->last_progress > p->o.stall_timeout) todo[i] = TODO_STALLED;
      if (*wait > 0.1) *wait = 0.1;
    }
  }
}

/* Does what decide_todo decided, unlocked: the first n entries stay (only this thread unlinks) and their links
 * before the last are fixed; the last one's link may change as downloads are appended, so it is not read. */
static void do_todo(sf_prefetch *p, sf_fetch *first, int n, const fetch_todo *todo) {
  sf_fetch *f = first;
  for (int i = 0; i < n; i++, f = i < n ? f->next : NULL) {
    if (todo[i] == TODO_START) {
      if (f->in_multi) {
        curl_multi_remove_handle(p->multi, f->easy);
        f->in_multi = false;
      }
      start_attempt(p, f);
    } else if (todo[i] == TODO_UNPAUSE) {
      curl_easy_pause(f->easy, CURLPAUSE_CONT); /* may deliver the held data at once */
    } else if (todo[i] == TODO_STALLED && f->in_multi) {
      curl_multi_remove_handle(p->multi, f->easy); /* closes its connection */
      f->in_multi = false;
      snprintf(f->curl_text, sizeof f->curl_text, "no byte from the server for %.1f s (stall_timeout)",
               p->o.stall_timeout);
      on_done(p, f, CURLE_OPERATION_TIMEDOUT);
    }
  }
}

/* Drives the transfers once and judges those that finished. */
static void perform_transfers(sf_prefetch *p) {
  int running = 0;
  curl_multi_perform(p->multi, &running);
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(p->multi, &left))) {
    if (msg->msg != CURLMSG_DONE) continue;
    sf_fetch *f = NULL;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
    CURLcode result = msg->data.result;
    curl_multi_remove_handle(p->multi, msg->easy_handle);
    if (f) {
      f->in_multi = false;
      on_done(p, f, result);
    }
  }
}

/*
 * The fetcher: starts downloads in order (at most max_transfers at once),
 * retries when their wait is over, resumes paused ones that have room again,
 * and drives everything with curl_multi_perform.
 */
static void *fetcher(void *arg) {
  sf_prefetch *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->lock);
    if (p->stop) {
      pthread_mutex_unlock(&p->lock);
      break;
    }
    sf_fetch *dead = unlink_closed(p);
    sf_fetch *first = p->list;
    int n = 0, active = 0;
    for (sf_fetch *f = p->list; f; f = f->next) {
      n++;
      if ((f->state == F_RUNNING || f->state == F_BACKOFF) && !f->parked) active++;
    }
    double wait = 1.0;
    fetch_todo *todo = calloc((size_t)(n ? n : 1), sizeof *todo);
    if (todo) decide_todo(p, first, n, active, todo, &wait);
    pthread_mutex_unlock(&p->lock);
    while (dead) {
      sf_fetch *f = dead;
      dead = f->next;
      release_curl(p, f);
      free_fetch(f);
    }
    if (!todo) { /* out of memory: try again shortly */
      curl_multi_poll(p->multi, NULL, 0, 100, NULL);
      continue;
    }
    do_todo(p, first, n, todo);
    free(todo);
    perform_transfers(p);
    pthread_mutex_lock(&p->lock);
    bool wake = p->wake_pending && p->o.wake;
    p->wake_pending = false;
    pthread_mutex_unlock(&p->lock);
    if (wake) p->o.wake(p->o.wake_opaque); /* unlocked: the hook may take the executor's locks */
    int ms = (int)(wait * 1000);
    curl_multi_poll(p->multi, NULL, 0, ms < 1 ? 1 : ms, NULL);
  }
  return NULL;
}

/* ---- API ---- */

int sf_prefetch_new(sf_prefetch **prefetch, const sf_prefetch_options *options, sf_error *error) {
  *prefetch = NULL;
  const char *why;
  int r = sf_http_init(&why);
  if (r < 0) return sf_error_set(error, r == SF_EUNSUPPORTED ? r : SF_ENET, SF_AT(.url = ""), "%s", why);
  sf_prefetch *p = calloc(1, sizeof *p);
  if (!p) {
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = ""), "out of memory starting the downloads");
    return SF_ENOMEM;
  }
  if (options) p->o = *options;
  if (p->o.max_transfers <= 0) p->o.max_transfers = 3;
  if (p->o.max_bytes <= 0) p->o.max_bytes = 64 << 20;
  if (p->o.max_bytes < 2 * BLOCK) p->o.max_bytes = 2 * BLOCK;
  if (p->o.connect_timeout <= 0) p->o.connect_timeout = 10;
  if (p->o.stall_timeout <= 0) p->o.stall_timeout = 30;
  if (p->o.retries < 0) p->o.retries = 0;
  if (p->o.retry_wait <= 0) p->o.retry_wait = 0.1;
  if (p->o.retry_max_wait <= 0) p->o.retry_max_wait = 30;
  if (p->o.dead_host_shards < 0) p->o.dead_host_shards = 0;
  if (p->o.ca_file && p->o.ca_file[0] && !(p->ca_file = strdup(p->o.ca_file))) {
    free(p);
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = ""), "out of memory starting the downloads");
    return SF_ENOMEM;
  }
  p->o.ca_file = NULL; /* borrowed from the caller: p->ca_file is used */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  sf_rng_seed(&p->rng, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)p);
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->changed, NULL);
  errno = 0;
  p->multi = curl_multi_init(); /* its wake-up needs a socket pair: descriptors may have run out */
  if (!p->multi && sf_errno_is_fd_limit(errno)) {
    char limit[200];
    sf_fd_limit_text(errno, limit, sizeof limit);
    sf_prefetch_destroy(&p);
    return sf_error_set(error, SF_EMFILE, SF_AT(.url = ""), "cannot start the downloads: %s", limit);
  }
  if (!p->multi || pthread_create(&p->thread, NULL, fetcher, p) != 0) {
    sf_prefetch_destroy(&p);
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = ""), "out of memory starting the downloads");
    return SF_ENOMEM;
  }
  p->thread_started = true;
  *prefetch = p;
  return 0;
}

void sf_prefetch_destroy(sf_prefetch **prefetch) {
  if (!prefetch || !*prefetch) return;
  sf_prefetch *p = *prefetch;
  if (p->thread_started) {
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_mutex_unlock(&p->lock);
    curl_multi_wakeup(p->multi);
    pthread_join(p->thread, NULL);
  }
  while (p->list) {
    sf_fetch *f = p->list;
    p->list = f->next;
    release_curl(p, f);
    free_blocks(p, f);
    free_fetch(f);
  }
  if (p->multi) curl_multi_cleanup(p->multi);
  while (p->slabs) {
    slab *s = p->slabs;
    p->slabs = s->next;
    sf_huge_unmap(s->mem, SLAB);
    free(s);
  }
  while (p->servers) {
    server *s = p->servers;
    p->servers = s->next;
    free(s);
  }
  free(p->ca_file);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->changed);
  free(p);
  *prefetch = NULL;
}

void sf_prefetch_stats_get(sf_prefetch *p, sf_prefetch_stats *stats) {
  pthread_mutex_lock(&p->lock);
  *stats = p->stats;
  stats->held_bytes = (uint64_t)p->buffered;
  pthread_mutex_unlock(&p->lock);
}

void sf_prefetch_set_max_transfers(sf_prefetch *p, int max_transfers) {
  if (max_transfers < 1) max_transfers = 1;
  pthread_mutex_lock(&p->lock); /* the fetcher reads it under the lock when it decides what to start */
  p->o.max_transfers = max_transfers;
  pthread_mutex_unlock(&p->lock);
  curl_multi_wakeup(p->multi); /* a queued download may start now */
}

int64_t sf_prefetch_footprint(int64_t bytes) {
  if (bytes <= 0) return BLOCK; /* an empty body still takes a block while it is being received */
  return (bytes + BLOCK - 1) / BLOCK * BLOCK;
}

bool sf_fetch_done(sf_fetch *f) {
  pthread_mutex_lock(&f->p->lock);
  bool done = f->state == F_DONE;
  pthread_mutex_unlock(&f->p->lock);
  return done;
}

static int start_fetch(sf_prefetch *p, const char *url, const sf_object_version *cached, int64_t base,
                       int64_t length, const char *if_match, sf_fetch **fetch, sf_error *error);

int sf_prefetch_start(sf_prefetch *p, const char *url, const sf_object_version *cached, sf_fetch **fetch,
                      sf_error *error) {
  return start_fetch(p, url, cached, 0, 0, NULL, fetch, error);
}

int sf_prefetch_start_range(sf_prefetch *p, const char *url, int64_t offset, int64_t length, const char *if_match,
                            sf_fetch **fetch, sf_error *error) {
  if (offset < 0 || length < 1) {
    *fetch = NULL;
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "bad byte range %lld+%lld", (long long)offset,
                        (long long)length);
  }
  return start_fetch(p, url, NULL, offset, length, if_match, fetch, error);
}

static int start_fetch(sf_prefetch *p, const char *url, const sf_object_version *cached, int64_t base,
                       int64_t length, const char *if_match, sf_fetch **fetch, sf_error *error) {
  *fetch = NULL;
  char shown[512];
  sf_url_redact(url, shown, sizeof shown);
  if (!sf_url_is_remote(url)) {
    sf_error_set(error, SF_EINVAL, SF_AT(.url = shown), "not an http(s), s3 or gs URL");
    return SF_EINVAL;
  }
  sf_fetch *f = calloc(1, sizeof *f);
  if (!f || !(f->url = strdup(url))) {
    free(f);
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = shown), "out of memory starting the download");
    return SF_ENOMEM;
  }
  f->p = p;
  memcpy(f->shown, shown, sizeof shown);
  f->is_store = sf_url_is_store(url);
  f->state = F_QUEUED;
  f->error_body.max = 4096; /* the start of a store's error answer names its code */
  if (cached) f->cached = *cached;
  f->base = base;
  f->length = length;
  if (if_match && if_match[0]) {
    snprintf(f->want_etag, sizeof f->want_etag, "%s", if_match);
    /* If-Match compares strongly: a weak ETag never matches, so it is only compared with the answer's. */
    if (strong_etag(if_match)) snprintf(f->pin_etag, sizeof f->pin_etag, "%s", if_match);
  }
  char name[280] = "";
  if (!f->is_store) server_name(url, name, sizeof name); /* a store's is its endpoint's, known when signed */
  pthread_mutex_lock(&p->lock);
  f->server = find_server(p, name);
  sf_fetch **pp = &p->list;
  while (*pp) pp = &(*pp)->next;
  *pp = f;
  p->stats.shards++;
  pthread_mutex_unlock(&p->lock);
  curl_multi_wakeup(p->multi);
  *fetch = f;
  return 0;
}

/* Waits up to 100 ms for a change (lock held). False when the caller asks to cancel. */
static bool wait_slice(sf_prefetch *p, bool (*cancelled)(void *), void *opaque) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_nsec += 100 * 1000 * 1000;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  if (pthread_cond_timedwait(&p->changed, &p->lock, &deadline) == 0) return true;
  return !(cancelled && cancelled(opaque));
}

/* The head block may be handed out: complete, or no longer being written to. Lock held. */
static bool readable(const sf_fetch *f) {
  return f->head && (f->head != f->tail || f->head->size == BLOCK || f->state != F_RUNNING);
}

/* Claims f and waits for a readable block or the end (lock held). Returns 0, or SF_ECANCELED. */
static int wait_data(sf_fetch *f, bool (*cancelled)(void *), void *opaque, bool *wake) {
  sf_prefetch *p = f->p;
  if (!f->claimed) {
    f->claimed = true;
    *wake = true; /* a paused download may now use the reserve */
  }
  while (!readable(f) && f->state != F_DONE) {
    if (*wake) { /* the fetcher may be waiting on us; do not sleep before it knows */
      pthread_mutex_unlock(&p->lock);
      curl_multi_wakeup(p->multi);
      pthread_mutex_lock(&p->lock);
      *wake = false;
    }
    if (!wait_slice(p, cancelled, opaque)) return SF_ECANCELED;
  }
  return 0;
}

bool sf_fetch_ready(sf_fetch *f, int64_t bytes) {
  sf_prefetch *p = f->p;
  pthread_mutex_lock(&p->lock);
  bool wake = !f->claimed; /* claimed: it may use the reserve, so a paused download goes on */
  f->claimed = true;
  int64_t ready = 0;
  for (const block *b = f->head; b && ready < bytes; b = b->next)
    if (b != f->tail || b->size == BLOCK || f->state != F_RUNNING) ready += (int64_t)b->size;
  /* Paused for want of room: waiting could not help, the reader must take what is there. */
  bool ok = f->state == F_DONE || f->paused || (ready > 0 && ready >= bytes);
  pthread_mutex_unlock(&p->lock);
  if (wake) curl_multi_wakeup(p->multi);
  return ok;
}

int sf_fetch_wait(sf_fetch *f, bool (*cancelled)(void *), void *opaque, sf_error *error) {
  sf_prefetch *p = f->p;
  bool wake = false;
  pthread_mutex_lock(&p->lock);
  int rc = wait_data(f, cancelled, opaque, &wake);
  if (rc == 0 && !f->head && f->code < 0) {
    rc = f->code;
    if (error) *error = f->error;
  }
  pthread_mutex_unlock(&p->lock);
  if (wake) curl_multi_wakeup(p->multi);
  if (rc == SF_ECANCELED)
    sf_error_set(error, SF_ECANCELED, SF_AT(.url = f->shown, .offset = 0), "the pipeline is stopping");
  return rc;
}

ssize_t sf_fetch_read(sf_fetch *f, const void **data, bool (*cancelled)(void *), void *opaque,
                      sf_error *error) {
  sf_prefetch *p = f->p;
  *data = NULL;
  bool wake = false;
  pthread_mutex_lock(&p->lock);
  if (f->held) {
    free_block(p, f, &f->held);
    wake = f->paused; /* room again */
  }
  int rc = wait_data(f, cancelled, opaque, &wake);
  ssize_t n = 0;
  int64_t offset = f->received;
  if (rc == 0 && readable(f)) {
    block *b = f->head;
    f->head = b->next;
    if (!f->head) f->tail = NULL;
    f->held = b;
    *data = b->data;
    n = (ssize_t)b->size;
  } else if (rc == 0 && f->code < 0) {
    n = f->code;
    if (error) *error = f->error;
  }
  pthread_mutex_unlock(&p->lock);
  if (wake) curl_multi_wakeup(p->multi);
  if (rc == SF_ECANCELED) {
    sf_error_set(error, SF_ECANCELED, SF_AT(.url = f->shown, .offset = offset), "the pipeline is stopping");
    return SF_ECANCELED;
  }
  return n;
}

bool sf_fetch_not_modified(sf_fetch *f, sf_object_version *version) {
  pthread_mutex_lock(&f->p->lock);
  /* Both are written by the fetcher before it hands out the first byte or the end, under the lock. */
  bool settled = f->state == F_DONE || f->received > 0;
  bool not_modified = f->state == F_DONE && f->not_modified;
  if (version) *version = settled ? f->version : (sf_object_version){0};
  pthread_mutex_unlock(&f->p->lock);
  return not_modified;
}

void sf_fetch_close(sf_fetch **fetch) {
  if (!fetch || !*fetch) return;
  sf_fetch *f = *fetch;
  sf_prefetch *p = f->p;
  pthread_mutex_lock(&p->lock);
  f->closed = true;
  free_blocks(p, f);
  pthread_mutex_unlock(&p->lock);
  curl_multi_wakeup(p->multi); /* the fetcher frees it, and others may use the bytes it held */
  *fetch = NULL;
}
