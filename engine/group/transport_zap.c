/*
 * Who may connect to a CURVE listening transport (engine/group/transport_zap.h).
 *
 * A handler thread of ours serves ZAP (RFC 27) on inproc://zeromq.zap.01 of
 * the socket's context: it admits CURVE clients whose public key is on the
 * allow-list and nothing else.  The same thread reads the socket's monitor
 * events, which is where clients that never reach ZAP show up: NULL or PLAIN
 * clients (a mechanism mismatch in the greeting), garbage bytes, handshakes
 * that time out.
 *
 * Fail closed: libzmq admits any CURVE client when no ZAP handler is bound,
 * so ZAP is bound before the socket and unbound only after it is closed, and
 * the thread never leaves its loop while the socket exists; an allow-list
 * that cannot be re-read admits nobody until it is fixed.
 */
#include "transport_zap.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_sent (glibc's copy predates it) */
#include <zmq.h>

#include "log.h"
#include "transport_keys.h"

enum {
  LOG_LIMIT = 20,              /* refusal lines logged before they are only counted */
  MAX_ALLOW_FILE = 16 << 20,   /* bytes of an allow-list file */
  MAX_ALLOWED = 1 << 20,       /* keys in an allow-list */
  MAX_TRACKED = 1024,          /* connections awaiting their handshake's outcome */
  MAX_ZAP_FRAMES = 16,
};

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

typedef struct tracked_conn {
  int fd;
  char addr[64];
} tracked_conn;

struct sf_zap {
  char endpoint[512]; /* the listening socket's, for messages */
  /* The handler thread and what only it touches once started. */
  pthread_t thread;
  bool thread_started;
  void *zap;          /* REP bound at ZAP_ENDPOINT */
  void *monitor;      /* PAIR connected to the socket's monitor */
  void *ctl;          /* PAIR: destroy() -> thread "stop" */
  void *ctl_thread;   /* PAIR: the thread's end */
  char monitor_ep[64], ctl_ep[64];
  char *allowed_path;
  uint8_t (*allowed)[32]; /* sorted */
  size_t n_allowed;
  bool allowed_ok;    /* false after a failed reload: admit nobody */
  struct stat allowed_st;
  unsigned logged;
  tracked_conn tracked[MAX_TRACKED];
  int n_tracked;
  int pending_failure;  /* 0, or the monitor event of a handshake failure not yet tied to a connection */
  uint32_t pending_value;
  uint64_t pending_auth, pending_success;
  /* Counters, read by any thread. */
  _Atomic uint64_t refused_mechanism, refused_key, refused_protocol, accepted;
};

/* ---------------------------------------------------------- allow-list */

typedef struct key_set {
  uint8_t (*keys)[32];
  size_t n, cap;
} key_set;

static int key_set_add(key_set *set, const uint8_t key[32], const char *path, sf_error *error) {
  if (set->n == MAX_ALLOWED)
    return sf_error_set(error, SF_ETOOBIG, SF_AT(.url = path), "more than %d keys in the allow-list", MAX_ALLOWED);
  if (set->n == set->cap) {
    size_t cap = set->cap ? set->cap * 2 : 16;
    void *p = realloc(set->keys, cap * 32);
    if (!p) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = path), "out of memory loading the allow-list");
    set->keys = p;
    set->cap = cap;
  }
  memcpy(set->keys[set->n++], key, 32);
  return 0;
}

static int key_cmp(const void *a, const void *b) { return memcmp(a, b, 32); }

static int load_allow_file(const char *path, key_set *set, sf_error *error) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    return sf_error_set(error, e == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = path), "cannot open the allow-list: %s",
                        strerror(e));
  }
  struct stat st;
  int rc = fstat(fd, &st) < 0 ? sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot stat the allow-list: %s",
                                             strerror(errno))
                              : sf_key_path_check(path, &st, "the allow-list", false, error);
  char *text = NULL;
  if (rc == 0) rc = sf_key_file_read(fd, path, MAX_ALLOW_FILE, &text, error);
  close(fd);
  if (rc < 0) return rc;
  int line_no = 0;
  char *p = text;
  while (rc == 0 && *p) {
    char *nl = strchr(p, '\n');
    if (nl) *nl = '\0';
    line_no++;
    char *name, *value;
    uint8_t raw[32];
    if (!sf_key_line_parse(p, &name, &value)) {
      rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path, .line = line_no),
                        "not an allow-list line (one Z85 public key a line, or `public-key = \"Z85\"`; # comments)");
    } else if (value && name && strcmp(name, "secret-key") == 0) {
      rc = sf_error_set(
          error, SF_EFORMAT, SF_AT(.url = path, .line = line_no),
          "a secret key in the allow-list: list public keys only (NAME.pub), and make a new pair for that worker");
    } else if (value && (!name || strcmp(name, "public-key") == 0)) {
      if (!sf_curve_key_decode(value, raw))
        rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path, .line = line_no),
                          "not a Z85 CURVE public key (40 characters expected)");
      else
        rc = key_set_add(set, raw, path, error);
    }
    if (!nl) break;
    p = nl + 1;
  }
  free(text);
  return rc;
}

static int load_allow_dir(const char *path, key_set *set, sf_error *error) {
  DIR *d = opendir(path);
  if (!d)
    return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot read the allow-list directory: %s", strerror(errno));
  /* Whoever may add or change a *.pub here chooses the workers: the directory and each key are checked. */
  struct stat st;
  int rc = fstat(dirfd(d), &st) < 0 ? sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot stat: %s", strerror(errno))
                                    : sf_key_path_check(path, &st, "the allow-list directory", false, error);
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".pub") != 0 || e->d_name[0] == '.') continue;
    char file[PATH_MAX];
    if (snprintf(file, sizeof file, "%s/%s", path, e->d_name) >= (int)sizeof file) continue;
    char pub[SF_CURVE_KEY_Z85_LEN + 1];
    uint8_t raw[32];
    if (fstatat(dirfd(d), e->d_name, &st, 0) == 0) rc = sf_key_path_check(file, &st, "the allowed key", false, error);
    if (rc == 0) rc = sf_curve_key_load(file, pub, NULL, error);
    if (rc == 0 && sf_curve_key_decode(pub, raw)) rc = key_set_add(set, raw, path, error);
  }
  closedir(d);
  return rc;
}

/* Loads path (a file or a directory of *.pub) into the handler's sorted key array, replacing the old one. */
static int load_allowed(sf_zap *z, sf_error *error) {
  struct stat st;
  if (stat(z->allowed_path, &st) < 0) {
    int e = errno;
    return sf_error_set(error, e == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = z->allowed_path),
                        "cannot read the allow-list (allowed_keys): %s", strerror(e));
  }
  key_set set = {0};
  int rc = S_ISDIR(st.st_mode) ? load_allow_dir(z->allowed_path, &set, error) : load_allow_file(z->allowed_path, &set, error);
  if (rc < 0) {
    free(set.keys);
    return rc;
  }
  if (set.n) qsort(set.keys, set.n, 32, key_cmp);
  free(z->allowed);
  z->allowed = set.keys;
  z->n_allowed = set.n;
  z->allowed_st = st;
  return 0;
}

static bool same_stat(const struct stat *a, const struct stat *b) {
  /* mode and owner too: an allow-list made writable by others is refused from then on */
  return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size && a->st_mode == b->st_mode &&
         a->st_uid == b->st_uid &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Re-reads the allow-list when the file or directory changed (keys added or removed while running). */
static void refresh_allowed(sf_zap *z) {
  struct stat st;
  if (stat(z->allowed_path, &st) == 0 && z->allowed_ok && same_stat(&st, &z->allowed_st)) return;
  sf_error err;
  if (load_allowed(z, &err) < 0) {
    if (z->allowed_ok) {
      char line[1200];
      sf_log(SF_LOG_WARNING, NULL, "%s: the allow-list changed and cannot be read; admitting no worker until it is fixed: %s",
              z->endpoint, sf_error_format(&err, line, sizeof line));
    }
    z->allowed_ok = false;
    return;
  }
  if (!z->allowed_ok)
    sf_log(SF_LOG_INFO, NULL, "%s: allow-list %s (re)loaded: %zu key(s)", z->endpoint, z->allowed_path, z->n_allowed);
  z->allowed_ok = true;
}

static bool key_allowed(const sf_zap *z, const uint8_t key[32]) {
  return z->allowed_ok && z->n_allowed && bsearch(key, z->allowed, z->n_allowed, 32, key_cmp) != NULL;
}

/* ------------------------------------------------------ handler thread */

static void note_refusal(sf_zap *z, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_refusal(sf_zap *z, const char *fmt, ...) {
  z->logged++;
  if (z->logged > LOG_LIMIT + 1) return;
  if (z->logged == LOG_LIMIT + 1) {
    sf_log(SF_LOG_WARNING, NULL, "%s: more refusals; they are counted, not logged (totals when the socket closes)", z->endpoint);
    return;
  }
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sf_log(SF_LOG_WARNING, NULL, "%s: refused %s", z->endpoint, msg);
}

static void frame_text(zmq_msg_t *m, char *out, size_t size) {
  size_t n = zmq_msg_size(m);
  if (n >= size) n = size - 1;
  const unsigned char *p = zmq_msg_data(m);
  for (size_t i = 0; i < n; i++) out[i] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
  out[n] = '\0';
}

static void send_str(void *s, const char *text, int more) { zmq_send(s, text, strlen(text), more ? ZMQ_SNDMORE : 0); }

/* Serves one ZAP request (frames: version, request id, domain, address, routing id, mechanism, credentials...). */
static void serve_zap(sf_zap *z) {
  zmq_msg_t f[MAX_ZAP_FRAMES];
  int n = 0;
  int more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, z->zap, 0) < 0) {
      zmq_msg_close(&m);
      break;
    }
    more = zmq_msg_more(&m);
    if (n < MAX_ZAP_FRAMES) f[n++] = m;
    else zmq_msg_close(&m);
  }
  const char *status = "400", *text = "refused";
  char user[SF_CURVE_KEY_Z85_LEN + 1] = "";
  char version[8] = "", domain[64] = "", address[64] = "", mechanism[16] = "";
  if (n >= 6) {
    frame_text(&f[0], version, sizeof version);
    frame_text(&f[2], domain, sizeof domain);
    frame_text(&f[3], address, sizeof address);
    frame_text(&f[5], mechanism, sizeof mechanism);
  }
  if (n < 6 || strcmp(version, "1.0") != 0) {
    status = "500";
    text = "malformed ZAP request";
  } else if (strcmp(domain, SF_ZAP_DOMAIN) != 0) {
    /* Another socket of this context asked: only our own socket is served. */
    text = "unknown ZAP domain";
    sf_log(SF_LOG_WARNING, NULL, "%s: refused a %s client of another socket of the same ZeroMQ context (ZAP domain '%s'); "
            "shardflow serves ZAP for its own listening socket only", z->endpoint, mechanism, domain);
  } else if (strcmp(mechanism, "CURVE") != 0) {
    atomic_fetch_add(&z->refused_mechanism, 1);
    text = "CURVE required";
    note_refusal(z, "a %s client from %s (only CURVE clients with a listed key are admitted)", mechanism, address);
  } else if (n != 7 || zmq_msg_size(&f[6]) != 32) {
    status = "500";
    text = "malformed CURVE credentials";
  } else {
    const uint8_t *key = zmq_msg_data(&f[6]);
    char z85[SF_CURVE_KEY_Z85_LEN + 1];
    zmq_z85_encode(z85, key, 32);
    refresh_allowed(z);
    if (key_allowed(z, key)) {
      status = "200";
      text = "OK";
      memcpy(user, z85, sizeof user);
    } else {
      atomic_fetch_add(&z->refused_key, 1);
      text = "key not allowed";
      note_refusal(z, "a CURVE client from %s with key %s: not on the allow-list %s%s", address, z85, z->allowed_path,
                   z->allowed_ok ? " (add the worker's NAME.pub there to admit it)" : " (which cannot be read: fix it)");
    }
  }
  /* REP must answer every request, even a malformed one. */
  send_str(z->zap, "1.0", 1);
  if (n >= 2) zmq_send(z->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
  else send_str(z->zap, "", 1);
  send_str(z->zap, status, 1);
  send_str(z->zap, text, 1);
  send_str(z->zap, user, 1);
  send_str(z->zap, "", 0);
  for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static int find_tracked(const sf_zap *z, int fd) {
  for (int i = 0; i < z->n_tracked; i++)
    if (z->tracked[i].fd == fd) return i;
  return -1;
}

static void untrack(sf_zap *z, int i) {
  z->tracked[i] = z->tracked[z->n_tracked - 1];
  z->n_tracked--;
}

static void peer_address(int fd, char *out, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  snprintf(out, size, "an unknown address");
  if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0) return;
  char host[INET6_ADDRSTRLEN];
  if (ss.ss_family == AF_INET) {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    if (inet_ntop(AF_INET, &a->sin_addr, host, sizeof host)) snprintf(out, size, "%s:%u", host, ntohs(a->sin_port));
  } else if (ss.ss_family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    if (inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host)) snprintf(out, size, "[%s]:%u", host, ntohs(a->sin6_port));
  }
}

/*
 * Bytes the kernel sent on a TCP socket (0 if unknown).  A connection that
 * has been sent more than a greeting and a WELCOME passed the CURVE HELLO;
 * garbage and silent peers never get past the 64-byte greeting.
 */
enum { CURVE_SENT_MIN = 64 + 168 };
static uint64_t bytes_sent(int fd) {
  struct tcp_info ti;
  memset(&ti, 0, sizeof ti);
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) return 0;
  if (len >= offsetof(struct tcp_info, tcpi_bytes_sent) + sizeof ti.tcpi_bytes_sent) return ti.tcpi_bytes_sent;
  if (len >= offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked) return ti.tcpi_bytes_acked;
  return 0;
}

/* ACCEPTED: a connection's fd starts being tracked, with its peer's address for messages. */
static void on_accepted(sf_zap *z, int fd) {
  int i = find_tracked(z, fd);
  if (i < 0) {
    if (z->n_tracked == MAX_TRACKED) untrack(z, 0);
    i = z->n_tracked++;
  }
  z->tracked[i].fd = fd;
  peer_address(fd, z->tracked[i].addr, sizeof z->tracked[i].addr);
}

/* HANDSHAKE_SUCCEEDED names no fd: the connection is the tracked one that has sent a CURVE handshake's bytes. */
static void on_handshake_succeeded(sf_zap *z) {
  atomic_fetch_add(&z->accepted, 1);
  int best = -1;
  uint64_t best_sent = CURVE_SENT_MIN;
  for (int i = 0; i < z->n_tracked; i++) {
    uint64_t sent = bytes_sent(z->tracked[i].fd);
    if (sent > best_sent) {
      best = i;
      best_sent = sent;
    }
  }
  if (best < 0 && z->n_tracked == 1) best = 0;
  if (best >= 0) untrack(z, best);
  else z->pending_success++;
}

/* DISCONNECTED: the outcome pending for this connection, if any, is counted and noted now. */
static void on_disconnected(sf_zap *z, int fd) {
  int i = find_tracked(z, fd);
  const char *who = i >= 0 ? z->tracked[i].addr : "an unknown address";
  if (z->pending_failure) {
    if (z->pending_failure == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        z->pending_value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
      atomic_fetch_add(&z->refused_mechanism, 1);
      note_refusal(z, "a client from %s with a security mechanism other than CURVE (NULL or PLAIN)", who);
    } else if (z->pending_failure == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      atomic_fetch_add(&z->refused_protocol, 1);
      note_refusal(z, "a client from %s: ZMTP protocol error 0x%x during the handshake", who, (unsigned)z->pending_value);
    } else {
      atomic_fetch_add(&z->refused_protocol, 1);
      note_refusal(z, "a client from %s: handshake failed (%s)", who,
                   z->pending_value == EAGAIN ? "timed out" : strerror((int)z->pending_value));
    }
    z->pending_failure = 0;
  } else if (i >= 0) {
    if (z->pending_auth) z->pending_auth--;
    else if (z->pending_success) z->pending_success--;
    else {
      atomic_fetch_add(&z->refused_protocol, 1);
      note_refusal(z, "a client from %s: closed before completing a CURVE handshake (garbage bytes or an old ZMTP greeting)", who);
    }
  }
  if (i >= 0) untrack(z, i);
}

/*
 * Ties monitor events to connections.  Events carry the fd only for ACCEPTED
 * and DISCONNECTED; a handshake failure is emitted right before the
 * DISCONNECTED of its connection (same I/O thread, same call), so it is
 * kept pending until then.  A connection that disconnects with no outcome
 * and no failure sent bytes libzmq rejected without an event (garbage,
 * a ZMTP 1.0 greeting on a secure socket) or simply left.
 */
static void serve_monitor(sf_zap *z) {
  zmq_msg_t head, addr;
  zmq_msg_init(&head);
  zmq_msg_init(&addr);
  if (zmq_msg_recv(&head, z->monitor, 0) < 0) goto out;
  if (!zmq_msg_more(&head) || zmq_msg_recv(&addr, z->monitor, 0) < 0) goto out;
  while (zmq_msg_more(&addr)) { /* drain anything unexpected */
    zmq_msg_close(&addr);
    zmq_msg_init(&addr);
    if (zmq_msg_recv(&addr, z->monitor, 0) < 0) goto out;
  }
  if (zmq_msg_size(&head) < 6) goto out;
  uint16_t event;
  uint32_t value;
  memcpy(&event, zmq_msg_data(&head), 2);
  memcpy(&value, (char *)zmq_msg_data(&head) + 2, 4);
  switch (event) {
  case ZMQ_EVENT_ACCEPTED: on_accepted(z, (int)value); break;
  case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: on_handshake_succeeded(z); break;
  case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: /* counted and logged by the ZAP handler */
    z->pending_auth++;
    break;
  case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
  case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    z->pending_failure = event;
    z->pending_value = value;
    break;
  case ZMQ_EVENT_DISCONNECTED: on_disconnected(z, (int)value); break;
  default: break;
  }
out:
  zmq_msg_close(&head);
  zmq_msg_close(&addr);
}

static void *handler_main(void *arg) {
  sf_zap *z = arg;
  for (;;) {
    zmq_pollitem_t items[3] = {
      {z->ctl_thread, 0, ZMQ_POLLIN, 0},
      {z->zap, 0, ZMQ_POLLIN, 0},
      {z->monitor, 0, ZMQ_POLLIN, 0},
    };
    if (zmq_poll(items, 3, -1) < 0) {
      if (errno == ETERM) break; /* the context is going away: so is the ROUTER */
      continue;
    }
    if (items[0].revents & ZMQ_POLLIN) break;
    if (items[1].revents & ZMQ_POLLIN) serve_zap(z);
    if (items[2].revents & ZMQ_POLLIN) serve_monitor(z);
  }
  return NULL;
}

/* ----------------------------------------------------------- lifecycle */

static void close_zmq(void **s) {
  if (*s) zmq_close(*s);
  *s = NULL;
}

static void no_linger(void *s) {
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
}

int sf_zap_new(const char *allowed_keys, const char *endpoint, sf_zap **zap, sf_error *error) {
  sf_zap *z = calloc(1, sizeof *z);
  *zap = z;
  if (!z) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = endpoint), "out of memory");
  snprintf(z->endpoint, sizeof z->endpoint, "%s", endpoint);
  z->allowed_path = strdup(allowed_keys);
  if (!z->allowed_path) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = endpoint), "out of memory");
  int rc = load_allowed(z, error);
  if (rc < 0) return rc;
  z->allowed_ok = true;
  if (z->n_allowed == 0)
    sf_log(SF_LOG_WARNING, NULL, "%s: the allow-list %s has no keys: no worker is admitted until one is added there", endpoint,
            allowed_keys);
  return 0;
}

int sf_zap_attach(sf_zap *z, void *ctx, void *socket, sf_error *error) {
  z->zap = zmq_socket(ctx, ZMQ_REP);
  if (!z->zap) return sf_error_set(error, SF_ENET, SF_AT(.url = z->endpoint), "zmq_socket: %s", zmq_strerror(errno));
  no_linger(z->zap);
  if (zmq_bind(z->zap, ZAP_ENDPOINT) != 0) {
    int e = errno;
    close_zmq(&z->zap);
    return sf_error_set(error, e == EADDRINUSE ? SF_EINVAL : SF_ENET, SF_AT(.url = z->endpoint),
                        "cannot serve ZAP on %s: %s%s", ZAP_ENDPOINT, zmq_strerror(e),
                        e == EADDRINUSE
                            ? " (another socket of this ZeroMQ context serves ZAP: one CURVE listening transport "
                              "per context; give this one a context of its own)"
                            : "");
  }
  /* Names never reused: libzmq releases an inproc name only when the socket's close completes. */
  static _Atomic uint64_t serial;
  uint64_t n = atomic_fetch_add(&serial, 1);
  snprintf(z->monitor_ep, sizeof z->monitor_ep, "inproc://sf-transport-monitor-%d-%llu", (int)getpid(), (unsigned long long)n);
  snprintf(z->ctl_ep, sizeof z->ctl_ep, "inproc://sf-transport-ctl-%d-%llu", (int)getpid(), (unsigned long long)n);
  int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (zmq_socket_monitor(socket, z->monitor_ep, events) != 0 || !(z->monitor = zmq_socket(ctx, ZMQ_PAIR)) ||
      zmq_connect(z->monitor, z->monitor_ep) != 0 || !(z->ctl = zmq_socket(ctx, ZMQ_PAIR)) ||
      zmq_bind(z->ctl, z->ctl_ep) != 0 || !(z->ctl_thread = zmq_socket(ctx, ZMQ_PAIR)) ||
      zmq_connect(z->ctl_thread, z->ctl_ep) != 0) {
    z->monitor_ep[0] = '\0';
    return sf_error_set(error, SF_ENET, SF_AT(.url = z->endpoint), "cannot set up the connection monitor: %s",
                        zmq_strerror(errno));
  }
  no_linger(z->monitor);
  no_linger(z->ctl);
  no_linger(z->ctl_thread);
  return 0;
}

int sf_zap_start(sf_zap *z, const char *endpoint, sf_error *error) {
  snprintf(z->endpoint, sizeof z->endpoint, "%s", endpoint);
  if (pthread_create(&z->thread, NULL, handler_main, z) != 0)
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = endpoint), "cannot start the ZAP handler thread");
  z->thread_started = true;
  return 0;
}

void sf_zap_get_stats(const sf_zap *zap, sf_transport_stats *stats) {
  memset(stats, 0, sizeof *stats);
  if (!zap) return;
  sf_zap *z = (sf_zap *)zap;
  stats->refused_mechanism = atomic_load(&z->refused_mechanism);
  stats->refused_key = atomic_load(&z->refused_key);
  stats->refused_protocol = atomic_load(&z->refused_protocol);
  stats->accepted = atomic_load(&z->accepted);
}

void sf_zap_detach(sf_zap *z, void *socket) {
  if (socket && z->monitor_ep[0]) zmq_socket_monitor(socket, NULL, 0);
}

void sf_zap_destroy(sf_zap **zap) {
  sf_zap *z = *zap;
  if (!z) return;
  *zap = NULL;
  if (z->thread_started) {
    send_str(z->ctl, "stop", 0);
    pthread_join(z->thread, NULL);
    sf_transport_stats s;
    sf_zap_get_stats(z, &s);
    uint64_t refused = s.refused_mechanism + s.refused_key + s.refused_protocol;
    if (refused)
      sf_log(SF_LOG_WARNING, NULL,
              "%s: refused %llu connection(s): %llu not CURVE, %llu unknown key, %llu dropped before the handshake "
              "completed; %llu admitted",
              z->endpoint, (unsigned long long)refused, (unsigned long long)s.refused_mechanism,
              (unsigned long long)s.refused_key, (unsigned long long)s.refused_protocol, (unsigned long long)s.accepted);
  }
  if (z->zap) zmq_unbind(z->zap, ZAP_ENDPOINT);
  close_zmq(&z->zap);
  close_zmq(&z->monitor);
  close_zmq(&z->ctl_thread);
  close_zmq(&z->ctl);
  free(z->allowed);
  free(z->allowed_path);
  free(z);
}
