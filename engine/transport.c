/*
 * ZeroMQ sockets between a head and its workers (engine/transport.h).
 *
 * A listening tcp:// transport is a CURVE server ROUTER.  Authentication is
 * decided by a handler thread of ours that serves ZAP (RFC 27) on
 * inproc://zeromq.zap.01 of the socket's context: it admits CURVE clients
 * whose public key is on the allow-list and nothing else.  The same thread
 * reads the ROUTER's monitor events, which is where clients that never reach
 * ZAP show up: NULL or PLAIN clients (a mechanism mismatch in the greeting),
 * garbage bytes, handshakes that time out.
 *
 * Fail closed, in three places:
 *  - no allow-list (and no explicit plaintext) -> listen refuses to start;
 *  - libzmq admits any CURVE client when no ZAP handler is bound, so the ZAP
 *    socket is bound before the ROUTER and closed only after it, and the
 *    handler thread never leaves its loop while the ROUTER exists;
 *  - an allow-list that cannot be re-read admits nobody until it is fixed.
 *
 * One CURVE listening transport per ZeroMQ context: the ZAP endpoint is one
 * per context.  A second one fails with SF_EINVAL (use another context).
 */
#include "engine/transport.h"

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

#include "engine/log.h"

enum {
  LOG_LIMIT = 20,              /* refusal lines logged before they are only counted */
  MAX_KEY_FILE = 64 << 10,     /* bytes of one key file */
  MAX_ALLOW_FILE = 16 << 20,   /* bytes of an allow-list file */
  MAX_ALLOWED = 1 << 20,       /* keys in an allow-list */
  MAX_TRACKED = 1024,          /* connections awaiting their handshake's outcome */
  MAX_ZAP_FRAMES = 16,
};

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "shardflow"

typedef struct tracked_conn {
  int fd;
  char addr[64];
} tracked_conn;

struct sf_transport {
  void *socket;
  char endpoint[512];
  bool curve_server;
  /* The handler thread and what only it touches once started. */
  pthread_t thread;
  bool thread_started;
  void *zap;          /* REP bound at ZAP_ENDPOINT */
  void *monitor;      /* PAIR connected to the ROUTER's monitor */
  void *ctl;          /* PAIR: close() -> thread "stop" */
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

/* ---------------------------------------------------------------- keys */

static bool z85_key_decode(const char *z85, uint8_t out[32]) {
  if (strlen(z85) != SF_CURVE_KEY_Z85_LEN) return false;
  return zmq_z85_decode(out, z85) != NULL;
}

/* Whether s is blank or a comment (Z85 has '#', so a comment must follow whitespace or start the line). */
static bool rest_is_comment(const char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\r') s++;
  return *s == '\0' || *s == '#';
}

/*
 * One line of a key file or an allow-list: blank, a comment (# first) or a
 * section header ("curve", "metadata"): true with *value NULL; a bare token
 * of 40 characters (a Z85 key; Z85 itself has '#' and '=') or
 * `name = "value"`: true with *value (and *name) set.  Anything else: false.
 * Modifies line.
 */
static bool parse_line(char *line, char **name, char **value) {
  *name = *value = NULL;
  char *s = line;
  while (*s == ' ' || *s == '\t' || *s == '\r') s++;
  if (rest_is_comment(s)) return true;
  size_t tok = strcspn(s, " \t\r");
  if (tok == SF_CURVE_KEY_Z85_LEN && rest_is_comment(s + tok)) {
    s[tok] = '\0';
    *value = s;
    return true;
  }
  size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-");
  if (n == tok && rest_is_comment(s + tok) && (strncmp(s, "curve", n) == 0 || strncmp(s, "metadata", n) == 0) &&
      (n == 5 || n == 8))
    return true; /* CZMQ sections */
  if (n == 0) return false;
  char *after = s + n;
  while (*after == ' ' || *after == '\t') after++;
  if (*after != '=') return false;
  s[n] = '\0';
  *name = s;
  after++;
  while (*after == ' ' || *after == '\t') after++;
  char *end;
  if (*after == '"') {
    after++;
    end = strchr(after, '"');
    if (!end) return false;
  } else {
    end = after + strcspn(after, " \t\r");
  }
  bool ok = rest_is_comment(*end == '"' ? end + 1 : end);
  *end = '\0';
  *value = after;
  return ok;
}

/* Reads a whole (small) regular file from an open fd; *text is NUL-terminated, caller frees. */
static int read_fd(int fd, const char *path, size_t limit, char **text, sf_error *error) {
  struct stat st;
  if (fstat(fd, &st) < 0) return sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "cannot stat: %s", strerror(errno));
  if (!S_ISREG(st.st_mode))
    return sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "not a regular file (give the path of a key file)");
  if ((uint64_t)st.st_size > limit)
    return sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, -1, "%lld bytes: larger than the %zu a key file may have",
                        (long long)st.st_size, limit);
  char *buf = malloc((size_t)st.st_size + 1);
  if (!buf) return sf_error_set(error, SF_ENOMEM, NULL, path, NULL, -1, -1, "out of memory reading the file");
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      return sf_error_set(error, SF_EIO, NULL, path, NULL, (int64_t)got, -1, "read failed: %s", strerror(e));
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  buf[got] = '\0';
  *text = buf;
  return 0;
}

static int open_key_file(const char *path, int *fd, sf_error *error) {
  *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (*fd >= 0) return 0;
  int e = errno;
  if (e == ENOENT)
    return sf_error_set(error, SF_ENOENT, NULL, path, NULL, -1, -1,
                        "no such key file (make one with `shardflow keygen NAME`)");
  return sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "cannot open the key file: %s", strerror(e));
}

int sf_curve_key_load(const char *path, char *public_z85, char *secret_z85, sf_error *error) {
  if (!path || !*path || !public_z85)
    return sf_error_set(error, SF_EINVAL, NULL, NULL, NULL, -1, -1, "no key file given");
  int fd;
  int rc = open_key_file(path, &fd, error);
  if (rc < 0) return rc;
  struct stat st;
  if (fstat(fd, &st) < 0) st.st_mode = 0777;
  char *text = NULL;
  rc = read_fd(fd, path, MAX_KEY_FILE, &text, error);
  close(fd);
  if (rc < 0) return rc;
  size_t text_len = strlen(text); /* before strtok_r cuts it into lines: all of it is wiped below */
  char pub[SF_CURVE_KEY_Z85_LEN + 1] = "", sec[SF_CURVE_KEY_Z85_LEN + 1] = "";
  int line_no = 0;
  rc = 0;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    line_no++;
    char *name, *value;
    uint8_t raw[32];
    if (!parse_line(line, &name, &value)) {
      rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, line_no,
                        "not a key file line (expected `public-key = \"Z85\"`; make key files with `shardflow keygen`)");
      break;
    }
    if (!value) continue;
    char *dst = NULL;
    if (!name || strcmp(name, "public-key") == 0) dst = pub;
    else if (strcmp(name, "secret-key") == 0) dst = sec;
    else continue; /* other metadata */
    if (!z85_key_decode(value, raw)) {
      rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, line_no,
                        "not a Z85 CURVE key (40 characters of Z85 expected; make key files with `shardflow keygen`)");
      break;
    }
    if (dst[0]) {
      rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, line_no, "%s given twice", dst == pub ? "public key" : "secret key");
      break;
    }
    memcpy(dst, value, SF_CURVE_KEY_Z85_LEN + 1);
  }
  explicit_bzero(text, text_len);
  free(text);
  if (rc == 0 && !pub[0] && !(sec[0] && secret_z85))
    rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, -1, "no public key in the file (make key files with `shardflow keygen`)");
  if (rc == 0 && secret_z85 && !sec[0])
    rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, -1,
                      "no secret key in the file: give NAME.key (the file NAME.pub holds only the public key)");
  if (rc == 0 && secret_z85 && (st.st_mode & 077))
    rc = sf_error_set(error, SF_EDENIED, NULL, path, NULL, -1, -1,
                      "secret key file is accessible to group or others (mode %03o): run `chmod 600 %s`, "
                      "and make a new key pair if others may have read it",
                      (unsigned)(st.st_mode & 0777), path);
  if (rc == 0 && sec[0]) {
    char derived[SF_CURVE_KEY_Z85_LEN + 1];
    if (zmq_curve_public(derived, sec) != 0)
      rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, -1, "the secret key is not usable (%s)", zmq_strerror(errno));
    else if (!pub[0])
      memcpy(pub, derived, sizeof pub);
    else if (strcmp(derived, pub) != 0)
      rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, -1,
                        "public and secret key do not belong together (the file was edited; make a new pair)");
    explicit_bzero(derived, sizeof derived);
  }
  if (rc == 0) {
    memcpy(public_z85, pub, sizeof pub);
    if (secret_z85) memcpy(secret_z85, sec, sizeof sec);
  }
  explicit_bzero(sec, sizeof sec);
  return rc;
}

static int write_key_file(const char *path, mode_t mode, const char *text, sf_error *error) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) {
    int e = errno;
    return sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "cannot create the key file: %s%s", strerror(e),
                        e == EEXIST ? " (remove it first to make a new key pair; workers holding the old key then need the new one)" : "");
  }
  int rc = 0;
  if (fchmod(fd, mode) < 0) rc = sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "chmod failed: %s", strerror(errno));
  size_t len = strlen(text), done = 0;
  while (rc == 0 && done < len) {
    ssize_t w = write(fd, text + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) rc = sf_error_set(error, SF_EIO, NULL, path, NULL, (int64_t)done, -1, "write failed: %s", strerror(errno));
    else done += (size_t)w;
  }
  if (rc == 0 && fsync(fd) < 0) rc = sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "fsync failed: %s", strerror(errno));
  if (close(fd) < 0 && rc == 0) rc = sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "close failed: %s", strerror(errno));
  if (rc < 0) unlink(path);
  return rc;
}

int sf_curve_keygen(const char *dir, const char *name, char *public_z85, sf_error *error) {
  if (!name || !*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return sf_error_set(error, SF_EINVAL, NULL, NULL, NULL, -1, -1, "key name '%s' is empty or has a '/' (use --dir for a directory)",
                        name ? name : "");
  if (!zmq_has("curve"))
    return sf_error_set(error, SF_EUNSUPPORTED, NULL, NULL, NULL, -1, -1, "this libzmq was built without CURVE (libsodium)");
  if (!dir || !*dir) dir = ".";
  char pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1];
  if (zmq_curve_keypair(pub, sec) != 0)
    return sf_error_set(error, SF_EUNSUPPORTED, NULL, NULL, NULL, -1, -1, "zmq_curve_keypair failed: %s", zmq_strerror(errno));
  char key_path[PATH_MAX], pub_path[PATH_MAX];
  if (snprintf(key_path, sizeof key_path, "%s/%s.key", dir, name) >= (int)sizeof key_path ||
      snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name) >= (int)sizeof pub_path) {
    explicit_bzero(sec, sizeof sec);
    return sf_error_set(error, SF_EINVAL, NULL, dir, NULL, -1, -1, "path too long");
  }
  char text[1024];
  snprintf(text, sizeof text,
           "#   shardflow CURVE key pair '%s' (ZeroMQ certificate format), written by `shardflow keygen`.\n"
           "#   SECRET: keep this file to its owner (mode 0600); give others %s.pub only.\n"
           "\n"
           "metadata\n"
           "    name = \"%s\"\n"
           "curve\n"
           "    public-key = \"%s\"\n"
           "    secret-key = \"%s\"\n",
           name, name, name, pub, sec);
  int rc = write_key_file(key_path, 0600, text, error);
  explicit_bzero(text, sizeof text);
  explicit_bzero(sec, sizeof sec);
  if (rc < 0) return rc;
  snprintf(text, sizeof text,
           "#   shardflow CURVE public key '%s' (ZeroMQ certificate format), written by `shardflow keygen`.\n"
           "#   Public: put it in the head's allowed_keys (worker) or give it as --server-key (head).\n"
           "\n"
           "metadata\n"
           "    name = \"%s\"\n"
           "curve\n"
           "    public-key = \"%s\"\n",
           name, name, pub);
  rc = write_key_file(pub_path, 0644, text, error);
  if (rc < 0) {
    unlink(key_path);
    return rc;
  }
  if (public_z85) memcpy(public_z85, pub, sizeof pub);
  return 0;
}

/* ---------------------------------------------------------- allow-list */

typedef struct key_set {
  uint8_t (*keys)[32];
  size_t n, cap;
} key_set;

static int key_set_add(key_set *set, const uint8_t key[32], const char *path, sf_error *error) {
  if (set->n == MAX_ALLOWED)
    return sf_error_set(error, SF_ETOOBIG, NULL, path, NULL, -1, -1, "more than %d keys in the allow-list", MAX_ALLOWED);
  if (set->n == set->cap) {
    size_t cap = set->cap ? set->cap * 2 : 16;
    void *p = realloc(set->keys, cap * 32);
    if (!p) return sf_error_set(error, SF_ENOMEM, NULL, path, NULL, -1, -1, "out of memory loading the allow-list");
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
    return sf_error_set(error, e == ENOENT ? SF_ENOENT : SF_EIO, NULL, path, NULL, -1, -1, "cannot open the allow-list: %s",
                        strerror(e));
  }
  char *text = NULL;
  int rc = read_fd(fd, path, MAX_ALLOW_FILE, &text, error);
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
    if (!parse_line(p, &name, &value)) {
      rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, line_no,
                        "not an allow-list line (one Z85 public key a line, or `public-key = \"Z85\"`; # comments)");
    } else if (value && name && strcmp(name, "secret-key") == 0) {
      rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, line_no,
                        "a secret key in the allow-list: list public keys only (NAME.pub), and make a new pair for that worker");
    } else if (value && (!name || strcmp(name, "public-key") == 0)) {
      if (!z85_key_decode(value, raw))
        rc = sf_error_set(error, SF_EFORMAT, NULL, path, NULL, -1, line_no, "not a Z85 CURVE public key (40 characters expected)");
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
  if (!d) return sf_error_set(error, SF_EIO, NULL, path, NULL, -1, -1, "cannot read the allow-list directory: %s", strerror(errno));
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".pub") != 0 || e->d_name[0] == '.') continue;
    char file[PATH_MAX];
    if (snprintf(file, sizeof file, "%s/%s", path, e->d_name) >= (int)sizeof file) continue;
    char pub[SF_CURVE_KEY_Z85_LEN + 1];
    uint8_t raw[32];
    rc = sf_curve_key_load(file, pub, NULL, error);
    if (rc == 0 && z85_key_decode(pub, raw)) rc = key_set_add(set, raw, path, error);
  }
  closedir(d);
  return rc;
}

/* Loads path (a file or a directory of *.pub) into t's sorted key array, replacing the old one. */
static int load_allowed(sf_transport *t, sf_error *error) {
  struct stat st;
  if (stat(t->allowed_path, &st) < 0) {
    int e = errno;
    return sf_error_set(error, e == ENOENT ? SF_ENOENT : SF_EIO, NULL, t->allowed_path, NULL, -1, -1,
                        "cannot read the allow-list (allowed_keys): %s", strerror(e));
  }
  key_set set = {0};
  int rc = S_ISDIR(st.st_mode) ? load_allow_dir(t->allowed_path, &set, error) : load_allow_file(t->allowed_path, &set, error);
  if (rc < 0) {
    free(set.keys);
    return rc;
  }
  if (set.n) qsort(set.keys, set.n, 32, key_cmp);
  free(t->allowed);
  t->allowed = set.keys;
  t->n_allowed = set.n;
  t->allowed_st = st;
  return 0;
}

static bool same_stat(const struct stat *a, const struct stat *b) {
  return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Re-reads the allow-list when the file or directory changed (keys added or removed while running). */
static void refresh_allowed(sf_transport *t) {
  struct stat st;
  if (stat(t->allowed_path, &st) == 0 && t->allowed_ok && same_stat(&st, &t->allowed_st)) return;
  sf_error err;
  if (load_allowed(t, &err) < 0) {
    if (t->allowed_ok) {
      char line[1200];
      sf_log(SF_LOG_WARNING, NULL,
             "%s: the allow-list changed and cannot be read; admitting no worker until it is fixed: %s", t->endpoint,
             sf_error_format(&err, line, sizeof line));
    }
    t->allowed_ok = false;
    return;
  }
  if (!t->allowed_ok)
    sf_log(SF_LOG_INFO, NULL, "%s: allow-list %s (re)loaded: %zu key(s)", t->endpoint, t->allowed_path, t->n_allowed);
  t->allowed_ok = true;
}

static bool key_allowed(const sf_transport *t, const uint8_t key[32]) {
  return t->allowed_ok && t->n_allowed && bsearch(key, t->allowed, t->n_allowed, 32, key_cmp) != NULL;
}

/* ------------------------------------------------------ handler thread */

static void note_refusal(sf_transport *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_refusal(sf_transport *t, const char *fmt, ...) {
  t->logged++;
  if (t->logged > LOG_LIMIT + 1) return;
  if (t->logged == LOG_LIMIT + 1) {
    sf_log(SF_LOG_WARNING, NULL, "%s: more refusals; they are counted, not logged (totals when the socket closes)",
           t->endpoint);
    return;
  }
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sf_log(SF_LOG_WARNING, NULL, "%s: refused %s", t->endpoint, msg);
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
static void serve_zap(sf_transport *t) {
  zmq_msg_t f[MAX_ZAP_FRAMES];
  int n = 0;
  int more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, t->zap, 0) < 0) {
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
  } else if (strcmp(domain, ZAP_DOMAIN) != 0) {
    /* Another socket of this context asked: only our own socket is served. */
    text = "unknown ZAP domain";
    sf_log(SF_LOG_WARNING, NULL,
           "%s: refused a %s client of another socket of the same ZeroMQ context (ZAP domain '%s'); "
           "shardflow serves ZAP for its own listening socket only",
           t->endpoint, mechanism, domain);
  } else if (strcmp(mechanism, "CURVE") != 0) {
    atomic_fetch_add(&t->refused_mechanism, 1);
    text = "CURVE required";
    note_refusal(t, "a %s client from %s (only CURVE clients with a listed key are admitted)", mechanism, address);
  } else if (n != 7 || zmq_msg_size(&f[6]) != 32) {
    status = "500";
    text = "malformed CURVE credentials";
  } else {
    const uint8_t *key = zmq_msg_data(&f[6]);
    char z85[SF_CURVE_KEY_Z85_LEN + 1];
    zmq_z85_encode(z85, key, 32);
    refresh_allowed(t);
    if (key_allowed(t, key)) {
      status = "200";
      text = "OK";
      memcpy(user, z85, sizeof user);
    } else {
      atomic_fetch_add(&t->refused_key, 1);
      text = "key not allowed";
      note_refusal(t, "a CURVE client from %s with key %s: not on the allow-list %s%s", address, z85, t->allowed_path,
                   t->allowed_ok ? " (add the worker's NAME.pub there to admit it)" : " (which cannot be read: fix it)");
    }
  }
  /* REP must answer every request, even a malformed one. */
  send_str(t->zap, "1.0", 1);
  if (n >= 2) zmq_send(t->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
  else send_str(t->zap, "", 1);
  send_str(t->zap, status, 1);
  send_str(t->zap, text, 1);
  send_str(t->zap, user, 1);
  send_str(t->zap, "", 0);
  for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static int find_tracked(const sf_transport *t, int fd) {
  for (int i = 0; i < t->n_tracked; i++)
    if (t->tracked[i].fd == fd) return i;
  return -1;
}

static void untrack(sf_transport *t, int i) {
  t->tracked[i] = t->tracked[t->n_tracked - 1];
  t->n_tracked--;
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

/*
 * Ties monitor events to connections.  Events carry the fd only for ACCEPTED
 * and DISCONNECTED; a handshake failure is emitted right before the
 * DISCONNECTED of its connection (same I/O thread, same call), so it is
 * kept pending until then.  A connection that disconnects with no outcome
 * and no failure sent bytes libzmq rejected without an event (garbage,
 * a ZMTP 1.0 greeting on a secure socket) or simply left.
 */
static void serve_monitor(sf_transport *t) {
  zmq_msg_t head, addr;
  zmq_msg_init(&head);
  zmq_msg_init(&addr);
  if (zmq_msg_recv(&head, t->monitor, 0) < 0) goto out;
  if (!zmq_msg_more(&head) || zmq_msg_recv(&addr, t->monitor, 0) < 0) goto out;
  while (zmq_msg_more(&addr)) { /* drain anything unexpected */
    zmq_msg_close(&addr);
    zmq_msg_init(&addr);
    if (zmq_msg_recv(&addr, t->monitor, 0) < 0) goto out;
  }
  if (zmq_msg_size(&head) < 6) goto out;
  uint16_t event;
  uint32_t value;
  memcpy(&event, zmq_msg_data(&head), 2);
  memcpy(&value, (char *)zmq_msg_data(&head) + 2, 4);
  switch (event) {
  case ZMQ_EVENT_ACCEPTED: {
    int fd = (int)value;
    int i = find_tracked(t, fd);
    if (i < 0) {
      if (t->n_tracked == MAX_TRACKED) untrack(t, 0);
      i = t->n_tracked++;
    }
    t->tracked[i].fd = fd;
    peer_address(fd, t->tracked[i].addr, sizeof t->tracked[i].addr);
    break;
  }
  case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: {
    atomic_fetch_add(&t->accepted, 1);
    int best = -1;
    uint64_t best_sent = CURVE_SENT_MIN;
    for (int i = 0; i < t->n_tracked; i++) {
      uint64_t sent = bytes_sent(t->tracked[i].fd);
      if (sent > best_sent) {
        best = i;
        best_sent = sent;
      }
    }
    if (best < 0 && t->n_tracked == 1) best = 0;
    if (best >= 0) untrack(t, best);
    else t->pending_success++;
    break;
  }
  case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: /* counted and logged by the ZAP handler */
    t->pending_auth++;
    break;
  case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
  case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    t->pending_failure = event;
    t->pending_value = value;
    break;
  case ZMQ_EVENT_DISCONNECTED: {
    int i = find_tracked(t, (int)value);
    const char *who = i >= 0 ? t->tracked[i].addr : "an unknown address";
    if (t->pending_failure) {
      if (t->pending_failure == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
          t->pending_value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        atomic_fetch_add(&t->refused_mechanism, 1);
        note_refusal(t, "a client from %s with a security mechanism other than CURVE (NULL or PLAIN)", who);
      } else if (t->pending_failure == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        atomic_fetch_add(&t->refused_protocol, 1);
        note_refusal(t, "a client from %s: ZMTP protocol error 0x%x during the handshake", who, (unsigned)t->pending_value);
      } else {
        atomic_fetch_add(&t->refused_protocol, 1);
        note_refusal(t, "a client from %s: handshake failed (%s)", who,
                     t->pending_value == EAGAIN ? "timed out" : strerror((int)t->pending_value));
      }
      t->pending_failure = 0;
    } else if (i >= 0) {
      if (t->pending_auth) t->pending_auth--;
      else if (t->pending_success) t->pending_success--;
      else {
        atomic_fetch_add(&t->refused_protocol, 1);
        note_refusal(t, "a client from %s: closed before completing a CURVE handshake (garbage bytes or an old ZMTP greeting)", who);
      }
    }
    if (i >= 0) untrack(t, i);
    break;
  }
  default: break;
  }
out:
  zmq_msg_close(&head);
  zmq_msg_close(&addr);
}

static void *handler_main(void *arg) {
  sf_transport *t = arg;
  for (;;) {
    zmq_pollitem_t items[3] = {
      {t->ctl_thread, 0, ZMQ_POLLIN, 0},
      {t->zap, 0, ZMQ_POLLIN, 0},
      {t->monitor, 0, ZMQ_POLLIN, 0},
    };
    if (zmq_poll(items, 3, -1) < 0) {
      if (errno == ETERM) break; /* the context is going away: so is the ROUTER */
      continue;
    }
    if (items[0].revents & ZMQ_POLLIN) break;
    if (items[1].revents & ZMQ_POLLIN) serve_zap(t);
    if (items[2].revents & ZMQ_POLLIN) serve_monitor(t);
  }
  return NULL;
}

/* ------------------------------------------------------------- sockets */

static int set_int(void *s, int option, int value, const char *name, const char *endpoint, sf_error *error) {
  if (zmq_setsockopt(s, option, &value, sizeof value) == 0) return 0;
  return sf_error_set(error, SF_ENET, NULL, endpoint, NULL, -1, -1, "zmq_setsockopt %s: %s", name, zmq_strerror(errno));
}

/* Limits shared by both ends: message size, byte-budget HWMs, linger, handshake timeout, keepalive. */
static int apply_limits(void *s, const sf_transport_options *o, sf_error *error) {
  int64_t max = o->max_message_bytes > 0 ? o->max_message_bytes : (int64_t)256 << 20;
  if (zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0)
    return sf_error_set(error, SF_ENET, NULL, o->endpoint, NULL, -1, -1, "zmq_setsockopt ZMQ_MAXMSGSIZE: %s", zmq_strerror(errno));
  int64_t budget = o->buffer_bytes > 0 ? o->buffer_bytes : (int64_t)64 << 20;
  int64_t msg = o->message_bytes > 0 ? o->message_bytes : (int64_t)1 << 20;
  int64_t hwm = budget / msg;
  if (hwm < 2) hwm = 2;
  if (hwm > INT_MAX) hwm = INT_MAX;
  double hs = o->handshake_timeout > 0 ? o->handshake_timeout : 10.0;
  int hs_ms = hs * 1000 > INT_MAX ? INT_MAX : (int)(hs * 1000);
  int rc = 0;
  if (rc == 0) rc = set_int(s, ZMQ_SNDHWM, (int)hwm, "ZMQ_SNDHWM", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_RCVHWM, (int)hwm, "ZMQ_RCVHWM", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_LINGER, 0, "ZMQ_LINGER", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_HANDSHAKE_IVL, hs_ms, "ZMQ_HANDSHAKE_IVL", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE, 1, "ZMQ_TCP_KEEPALIVE", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE_IDLE, 30, "ZMQ_TCP_KEEPALIVE_IDLE", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE_INTVL, 10, "ZMQ_TCP_KEEPALIVE_INTVL", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE_CNT, 3, "ZMQ_TCP_KEEPALIVE_CNT", o->endpoint, error);
  return rc;
}

static int check_endpoint(const sf_transport_options *o, bool *tcp, sf_error *error) {
  if (!o || !o->endpoint || !*o->endpoint)
    return sf_error_set(error, SF_EINVAL, NULL, NULL, NULL, -1, -1, "no endpoint given (tcp://HOST:PORT or ipc://PATH)");
  if (strlen(o->endpoint) >= 480)
    return sf_error_set(error, SF_EINVAL, NULL, o->endpoint, NULL, -1, -1, "endpoint too long");
  if (strncmp(o->endpoint, "tcp://", 6) == 0) *tcp = true;
  else if (strncmp(o->endpoint, "ipc://", 6) == 0) *tcp = false;
  else
    return sf_error_set(error, SF_EINVAL, NULL, o->endpoint, NULL, -1, -1,
                        "unsupported endpoint: use tcp://HOST:PORT (CURVE) or ipc://PATH (local processes)");
  return 0;
}

static void close_zmq(void **s) {
  if (*s) zmq_close(*s);
  *s = NULL;
}

/* Frees everything; the ROUTER/DEALER first, the ZAP handler last (libzmq admits all without one). */
static void destroy(sf_transport *t) {
  if (t->socket && t->monitor_ep[0]) zmq_socket_monitor(t->socket, NULL, 0);
  close_zmq(&t->socket);
  if (t->thread_started) {
    send_str(t->ctl, "stop", 0);
    pthread_join(t->thread, NULL);
    sf_transport_stats s;
    sf_transport_get_stats(t, &s);
    uint64_t refused = s.refused_mechanism + s.refused_key + s.refused_protocol;
    if (refused)
      sf_log(SF_LOG_WARNING, NULL,
             "%s: refused %llu connection(s): %llu not CURVE, %llu unknown key, %llu dropped before the handshake "
             "completed; %llu admitted",
             t->endpoint, (unsigned long long)refused, (unsigned long long)s.refused_mechanism,
             (unsigned long long)s.refused_key, (unsigned long long)s.refused_protocol, (unsigned long long)s.accepted);
  }
  if (t->zap) zmq_unbind(t->zap, ZAP_ENDPOINT);
  close_zmq(&t->zap);
  close_zmq(&t->monitor);
  close_zmq(&t->ctl_thread);
  close_zmq(&t->ctl);
  free(t->allowed);
  free(t->allowed_path);
  free(t);
}

static int start_curve_server(void *ctx, sf_transport *t, const sf_transport_options *o, sf_error *error) {
  if (!zmq_has("curve"))
    return sf_error_set(error, SF_EUNSUPPORTED, NULL, o->endpoint, NULL, -1, -1, "this libzmq was built without CURVE (libsodium)");
  if (!o->allowed_keys || !*o->allowed_keys)
    return sf_error_set(error, SF_EDENIED, NULL, o->endpoint, NULL, -1, -1,
                        "refusing to listen on tcp:// without an allow-list of worker keys: make key pairs with "
                        "`shardflow keygen head` and `shardflow keygen WORKER`, then give the head secret_key: head.key and "
                        "allowed_keys: a file or directory with WORKER.pub (or plaintext: true on a trusted network only)");
  if (!o->secret_key_file || !*o->secret_key_file)
    return sf_error_set(error, SF_EDENIED, NULL, o->endpoint, NULL, -1, -1,
                        "listening on tcp:// needs the head's secret key (secret_key: head.key; make it with `shardflow keygen head`)");
  t->allowed_path = strdup(o->allowed_keys);
  if (!t->allowed_path) return sf_error_set(error, SF_ENOMEM, NULL, o->endpoint, NULL, -1, -1, "out of memory");
  int rc = load_allowed(t, error);
  if (rc < 0) return rc;
  t->allowed_ok = true;
  if (t->n_allowed == 0)
    sf_log(SF_LOG_WARNING, NULL, "%s: the allow-list %s has no keys: no worker is admitted until one is added there",
           o->endpoint, o->allowed_keys);
  char pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1];
  rc = sf_curve_key_load(o->secret_key_file, pub, sec, error);
  if (rc < 0) return rc;
  int one = 1;
  if (zmq_setsockopt(t->socket, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
      zmq_setsockopt(t->socket, ZMQ_CURVE_SECRETKEY, sec, SF_CURVE_KEY_Z85_LEN) != 0 ||
      zmq_setsockopt(t->socket, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) != 0) {
    explicit_bzero(sec, sizeof sec);
    return sf_error_set(error, SF_ENET, NULL, o->endpoint, NULL, -1, -1, "cannot make a CURVE server socket: %s", zmq_strerror(errno));
  }
  explicit_bzero(sec, sizeof sec);
#ifdef ZMQ_ZAP_ENFORCE_DOMAIN
  zmq_setsockopt(t->socket, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one); /* draft builds only; ours keeps the handler up instead */
#endif
  /* The ZAP handler before the socket can accept anybody. */
  t->zap = zmq_socket(ctx, ZMQ_REP);
  if (!t->zap) return sf_error_set(error, SF_ENET, NULL, o->endpoint, NULL, -1, -1, "zmq_socket: %s", zmq_strerror(errno));
  set_int(t->zap, ZMQ_LINGER, 0, "ZMQ_LINGER", o->endpoint, NULL);
  if (zmq_bind(t->zap, ZAP_ENDPOINT) != 0) {
    int e = errno;
    close_zmq(&t->zap);
    return sf_error_set(error, e == EADDRINUSE ? SF_EINVAL : SF_ENET, NULL, o->endpoint, NULL, -1, -1,
                        "cannot serve ZAP on %s: %s%s", ZAP_ENDPOINT, zmq_strerror(e),
                        e == EADDRINUSE ? " (another socket of this ZeroMQ context serves ZAP: one CURVE listening transport "
                                          "per context; give this one a context of its own)" : "");
  }
  /* Names never reused: libzmq releases an inproc name only when the socket's close completes. */
  static _Atomic uint64_t serial;
  uint64_t n = atomic_fetch_add(&serial, 1);
  snprintf(t->monitor_ep, sizeof t->monitor_ep, "inproc://sf-transport-monitor-%d-%llu", (int)getpid(), (unsigned long long)n);
  snprintf(t->ctl_ep, sizeof t->ctl_ep, "inproc://sf-transport-ctl-%d-%llu", (int)getpid(), (unsigned long long)n);
  int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (zmq_socket_monitor(t->socket, t->monitor_ep, events) != 0 || !(t->monitor = zmq_socket(ctx, ZMQ_PAIR)) ||
      zmq_connect(t->monitor, t->monitor_ep) != 0 || !(t->ctl = zmq_socket(ctx, ZMQ_PAIR)) ||
      zmq_bind(t->ctl, t->ctl_ep) != 0 || !(t->ctl_thread = zmq_socket(ctx, ZMQ_PAIR)) ||
      zmq_connect(t->ctl_thread, t->ctl_ep) != 0) {
    t->monitor_ep[0] = '\0';
    return sf_error_set(error, SF_ENET, NULL, o->endpoint, NULL, -1, -1, "cannot set up the connection monitor: %s",
                        zmq_strerror(errno));
  }
  set_int(t->monitor, ZMQ_LINGER, 0, "ZMQ_LINGER", o->endpoint, NULL);
  set_int(t->ctl, ZMQ_LINGER, 0, "ZMQ_LINGER", o->endpoint, NULL);
  set_int(t->ctl_thread, ZMQ_LINGER, 0, "ZMQ_LINGER", o->endpoint, NULL);
  t->curve_server = true; /* the handler thread starts once the socket is bound (requests queue until then) */
  return 0;
}

int sf_transport_listen(void *zmq_ctx, const sf_transport_options *options, sf_transport **transport, sf_error *error) {
  *transport = NULL;
  bool tcp;
  int rc = check_endpoint(options, &tcp, error);
  if (rc < 0) return rc;
  if (tcp && options->plaintext && options->allowed_keys && *options->allowed_keys)
    return sf_error_set(error, SF_EINVAL, NULL, options->endpoint, NULL, -1, -1,
                        "plaintext and allowed_keys both given: plaintext cannot check keys; drop one of them");
  sf_transport *t = calloc(1, sizeof *t);
  if (!t) return sf_error_set(error, SF_ENOMEM, NULL, options->endpoint, NULL, -1, -1, "out of memory");
  snprintf(t->endpoint, sizeof t->endpoint, "%s", options->endpoint);
  t->socket = zmq_socket(zmq_ctx, ZMQ_ROUTER);
  if (!t->socket) {
    rc = sf_error_set(error, SF_ENET, NULL, options->endpoint, NULL, -1, -1, "zmq_socket(ROUTER): %s", zmq_strerror(errno));
    goto fail;
  }
  rc = apply_limits(t->socket, options, error);
  if (rc == 0) rc = set_int(t->socket, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY", options->endpoint, error);
  if (rc < 0) goto fail;
  if (tcp && !options->plaintext) {
    rc = start_curve_server(zmq_ctx, t, options, error);
    if (rc < 0) goto fail;
  }
  if (zmq_bind(t->socket, options->endpoint) != 0) {
    int e = errno;
    rc = sf_error_set(error, e == EINVAL || e == EPROTONOSUPPORT ? SF_EINVAL : SF_ENET, NULL, options->endpoint, NULL, -1, -1,
                      "cannot listen: %s%s", zmq_strerror(e),
                      e == EADDRINUSE ? " (another process uses this port: choose another one, or port 0 for any free port)"
                      : e == EADDRNOTAVAIL ? " (no such local address: use an address of this host, or 0.0.0.0)"
                                           : "");
    goto fail;
  }
  size_t len = sizeof t->endpoint;
  if (zmq_getsockopt(t->socket, ZMQ_LAST_ENDPOINT, t->endpoint, &len) != 0)
    snprintf(t->endpoint, sizeof t->endpoint, "%s", options->endpoint);
  if (t->curve_server) {
    if (pthread_create(&t->thread, NULL, handler_main, t) != 0) {
      rc = sf_error_set(error, SF_ENOMEM, NULL, options->endpoint, NULL, -1, -1, "cannot start the ZAP handler thread");
      goto fail;
    }
    t->thread_started = true;
  }
  if (tcp && options->plaintext)
    sf_log(SF_LOG_WARNING, NULL,
           "%s: listening WITHOUT authentication or encryption (plaintext: true); "
           "anyone who can reach this port can join and read the data",
           t->endpoint);
  *transport = t;
  return 0;
fail:
  destroy(t);
  return rc;
}

int sf_transport_connect(void *zmq_ctx, const sf_transport_options *options, sf_transport **transport, sf_error *error) {
  *transport = NULL;
  bool tcp;
  int rc = check_endpoint(options, &tcp, error);
  if (rc < 0) return rc;
  sf_transport *t = calloc(1, sizeof *t);
  if (!t) return sf_error_set(error, SF_ENOMEM, NULL, options->endpoint, NULL, -1, -1, "out of memory");
  snprintf(t->endpoint, sizeof t->endpoint, "%s", options->endpoint);
  t->socket = zmq_socket(zmq_ctx, ZMQ_DEALER);
  if (!t->socket) {
    rc = sf_error_set(error, SF_ENET, NULL, options->endpoint, NULL, -1, -1, "zmq_socket(DEALER): %s", zmq_strerror(errno));
    goto fail;
  }
  rc = apply_limits(t->socket, options, error);
  if (rc < 0) goto fail;
  if (tcp && !options->plaintext) {
    if (!options->secret_key_file || !*options->secret_key_file || !options->server_key_file || !*options->server_key_file) {
      rc = sf_error_set(error, SF_EDENIED, NULL, options->endpoint, NULL, -1, -1,
                        "connecting over tcp:// needs this worker's key (--key WORKER.key, from `shardflow keygen WORKER`) and "
                        "the head's public key (--server-key head.pub); the head must list WORKER.pub in allowed_keys");
      goto fail;
    }
    char pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1], server[SF_CURVE_KEY_Z85_LEN + 1];
    rc = sf_curve_key_load(options->server_key_file, server, NULL, error);
    if (rc == 0) rc = sf_curve_key_load(options->secret_key_file, pub, sec, error);
    if (rc < 0) goto fail;
    if (zmq_setsockopt(t->socket, ZMQ_CURVE_SERVERKEY, server, SF_CURVE_KEY_Z85_LEN) != 0 ||
        zmq_setsockopt(t->socket, ZMQ_CURVE_PUBLICKEY, pub, SF_CURVE_KEY_Z85_LEN) != 0 ||
        zmq_setsockopt(t->socket, ZMQ_CURVE_SECRETKEY, sec, SF_CURVE_KEY_Z85_LEN) != 0) {
      explicit_bzero(sec, sizeof sec);
      rc = sf_error_set(error, SF_ENET, NULL, options->endpoint, NULL, -1, -1, "cannot make a CURVE client socket: %s",
                        zmq_strerror(errno));
      goto fail;
    }
    explicit_bzero(sec, sizeof sec);
  }
  /* A refused or restarted peer is retried from 100 ms, backing off to 1 s (not every 100 ms forever). */
  if (set_int(t->socket, ZMQ_RECONNECT_IVL_MAX, 1000, "ZMQ_RECONNECT_IVL_MAX", options->endpoint, error) < 0) {
    rc = SF_ENET;
    goto fail;
  }
  if (zmq_connect(t->socket, options->endpoint) != 0) {
    rc = sf_error_set(error, SF_EINVAL, NULL, options->endpoint, NULL, -1, -1, "cannot connect: %s", zmq_strerror(errno));
    goto fail;
  }
  *transport = t;
  return 0;
fail:
  destroy(t);
  return rc;
}

void *sf_transport_socket(sf_transport *transport) { return transport ? transport->socket : NULL; }

const char *sf_transport_endpoint(const sf_transport *transport) { return transport ? transport->endpoint : ""; }

void sf_transport_get_stats(const sf_transport *transport, sf_transport_stats *stats) {
  memset(stats, 0, sizeof *stats);
  if (!transport) return;
  sf_transport *t = (sf_transport *)transport;
  stats->refused_mechanism = atomic_load(&t->refused_mechanism);
  stats->refused_key = atomic_load(&t->refused_key);
  stats->refused_protocol = atomic_load(&t->refused_protocol);
  stats->accepted = atomic_load(&t->accepted);
}

uint64_t sf_transport_refused(const sf_transport *transport) {
  sf_transport_stats s;
  sf_transport_get_stats(transport, &s);
  return s.refused_mechanism + s.refused_key + s.refused_protocol;
}

void sf_transport_close(sf_transport **transport) {
  if (!transport || !*transport) return;
  sf_transport *t = *transport;
  *transport = NULL;
  destroy(t);
}
