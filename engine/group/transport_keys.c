/*
 * CURVE key files (engine/group/transport.h): `shardflow keygen` writes them, heads
 * and workers read them.  ZeroMQ's certificate text (CZMQ's zcert), so
 * either tool reads the other's; a secret key is read only from a file its
 * owner alone may read, and wiped from memory once used.
 */
#include "transport.h"
#include "transport_keys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zmq.h>

enum { MAX_KEY_FILE = 64 << 10 }; /* bytes of one key file */

bool sf_curve_key_decode(const char *z85, uint8_t out[32]) {
  if (strlen(z85) != SF_CURVE_KEY_Z85_LEN) return false;
  return zmq_z85_decode(out, z85) != NULL;
}

/* Whether s is blank or a comment (Z85 has '#', so a comment must follow whitespace or start the line). */
static bool rest_is_comment(const char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\r') s++;
  return *s == '\0' || *s == '#';
}

bool sf_key_line_parse(char *line, char **name, char **value) {
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

int sf_key_file_read(int fd, const char *path, size_t limit, char **text, sf_error *error) {
  struct stat st;
  if (fstat(fd, &st) < 0) return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot stat: %s", strerror(errno));
  if (!S_ISREG(st.st_mode))
    return sf_error_set(error, SF_EIO, SF_AT(.url = path), "not a regular file (give the path of a key file)");
  if ((uint64_t)st.st_size > limit)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = path), "%lld bytes: larger than the %zu a key file may have",
                        (long long)st.st_size, limit);
  char *buf = malloc((size_t)st.st_size + 1);
  if (!buf) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = path), "out of memory reading the file");
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      return sf_error_set(error, SF_EIO, SF_AT(.url = path, .offset = (int64_t)got), "read failed: %s", strerror(e));
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  buf[got] = '\0';
  *text = buf;
  return 0;
}

int sf_key_path_check(const char *path, const struct stat *st, const char *what, bool sticky_ok, sf_error *error) {
  uid_t me = geteuid();
  if (st->st_uid != me && st->st_uid != 0)
    return sf_error_set(error, SF_EDENIED, SF_AT(.url = path),
                        "%s %s is owned by user %u, not by this user (%u) or root: its owner can change which keys "
                        "are trusted; use one of your own (or `chown %u %s`)",
                        what, path, (unsigned)st->st_uid, (unsigned)me, (unsigned)me, path);
  /* a read-only mount is nobody's to write, whatever its mode (Kubernetes mounts Secrets read-only, 1777) */
  struct statvfs fs;
  bool read_only = statvfs(path, &fs) == 0 && (fs.f_flag & ST_RDONLY);
  if ((st->st_mode & 022) && !read_only && !(sticky_ok && S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX)))
    return sf_error_set(error, SF_EDENIED, SF_AT(.url = path),
                        "%s %s is writable by %s (mode %03o): others could change which keys are trusted; run "
                        "`chmod go-w %s`",
                        what, path, (st->st_mode & 002) ? "others" : "its group", (unsigned)(st->st_mode & 0777), path);
  return 0;
}

static int open_key_file(const char *path, int *fd, sf_error *error) {
  *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (*fd >= 0) return 0;
  int e = errno;
  if (e == ENOENT)
    return sf_error_set(error, SF_ENOENT, SF_AT(.url = path),
                        "no such key file (make one with `shardflow keygen NAME`)");
  return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot open the key file: %s", strerror(e));
}

int sf_curve_key_load(const char *path, char *public_z85, char *secret_z85, sf_error *error) {
  if (!path || !*path || !public_z85) return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "no key file given");
  int fd;
  int rc = open_key_file(path, &fd, error);
  if (rc < 0) return rc;
  struct stat st;
  if (fstat(fd, &st) < 0) st.st_mode = 0777, st.st_uid = (uid_t)-1;
  char *text = NULL;
  rc = sf_key_file_read(fd, path, MAX_KEY_FILE, &text, error);
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
    if (!sf_key_line_parse(line, &name, &value)) {
      rc =
          sf_error_set(error, SF_EFORMAT, SF_AT(.url = path, .line = line_no),
                       "not a key file line (expected `public-key = \"Z85\"`; make key files with `shardflow keygen`)");
      break;
    }
    if (!value) continue;
    char *dst = NULL;
    if (!name || strcmp(name, "public-key") == 0) dst = pub;
    else if (strcmp(name, "secret-key") == 0) dst = sec;
    else continue; /* other metadata */
    if (!sf_curve_key_decode(value, raw)) {
      rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path, .line = line_no),
                        "not a Z85 CURVE key (40 characters of Z85 expected; make key files with `shardflow keygen`)");
      break;
    }
    if (dst[0]) {
      rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path, .line = line_no), "%s given twice",
                        dst == pub ? "public key" : "secret key");
      break;
    }
    memcpy(dst, value, SF_CURVE_KEY_Z85_LEN + 1);
  }
  explicit_bzero(text, text_len);
  free(text);
  if (rc == 0 && !pub[0] && !(sec[0] && secret_z85))
    rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path),
                      "no public key in the file (make key files with `shardflow keygen`)");
  if (rc == 0 && secret_z85 && !sec[0])
    rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path),
                      "no secret key in the file: give NAME.key (the file NAME.pub holds only the public key)");
  if (rc == 0 && secret_z85 && st.st_uid != geteuid() && st.st_uid != 0)
    rc = sf_error_set(error, SF_EDENIED, SF_AT(.url = path),
                      "secret key file is owned by user %u, not by this user (%u) or root: its owner can read or "
                      "replace it; use a key file of your own (`shardflow keygen NAME`)",
                      (unsigned)st.st_uid, (unsigned)geteuid());
  if (rc == 0 && secret_z85 && (st.st_mode & 077))
    rc = sf_error_set(error, SF_EDENIED, SF_AT(.url = path),
                      "secret key file is accessible to group or others (mode %03o): run `chmod 600 %s`, "
                      "and make a new key pair if others may have read it",
                      (unsigned)(st.st_mode & 0777), path);
  if (rc == 0 && sec[0]) {
    char derived[SF_CURVE_KEY_Z85_LEN + 1];
    if (zmq_curve_public(derived, sec) != 0)
      rc =
          sf_error_set(error, SF_EFORMAT, SF_AT(.url = path), "the secret key is not usable (%s)", zmq_strerror(errno));
    else if (!pub[0])
      memcpy(pub, derived, sizeof pub);
    else if (strcmp(derived, pub) != 0)
      rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = path),
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
    return sf_error_set(
        error, SF_EIO, SF_AT(.url = path), "cannot create the key file: %s%s", strerror(e),
        e == EEXIST ? " (remove it first to make a new key pair; workers holding the old key then need the new one)"
                    : "");
  }
  int rc = 0;
  if (fchmod(fd, mode) < 0) rc = sf_error_set(error, SF_EIO, SF_AT(.url = path), "chmod failed: %s", strerror(errno));
  size_t len = strlen(text), done = 0;
  while (rc == 0 && done < len) {
    ssize_t w = write(fd, text + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      rc =
          sf_error_set(error, SF_EIO, SF_AT(.url = path, .offset = (int64_t)done), "write failed: %s", strerror(errno));
    else done += (size_t)w;
  }
  if (rc == 0 && fsync(fd) < 0)
    rc = sf_error_set(error, SF_EIO, SF_AT(.url = path), "fsync failed: %s", strerror(errno));
  if (close(fd) < 0 && rc == 0)
    rc = sf_error_set(error, SF_EIO, SF_AT(.url = path), "close failed: %s", strerror(errno));
  if (rc < 0) unlink(path);
  return rc;
}

int sf_curve_keygen(const char *dir, const char *name, char *public_z85, sf_error *error) {
  if (!name || !*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "key name '%s' is empty or has a '/' (use --dir for a directory)",
                        name ? name : "");
  if (!zmq_has("curve"))
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "this libzmq was built without CURVE (libsodium)");
  if (!dir || !*dir) dir = ".";
  char pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1];
  if (zmq_curve_keypair(pub, sec) != 0)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "zmq_curve_keypair failed: %s", zmq_strerror(errno));
  char key_path[PATH_MAX], pub_path[PATH_MAX];
  if (snprintf(key_path, sizeof key_path, "%s/%s.key", dir, name) >= (int)sizeof key_path ||
      snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name) >= (int)sizeof pub_path) {
    explicit_bzero(sec, sizeof sec);
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = dir), "path too long");
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
