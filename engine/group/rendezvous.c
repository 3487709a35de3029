/* Rendezvous files (engine/group/rendezvous.h): the head's endpoint and public key, for scheduled workers. */
#include "rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "transport.h"
#include "transport_keys.h"

enum { MAX_RENDEZVOUS_FILE = 64 << 10 };

/* endpoint with a wildcard host replaced by this host's name, into out[size]. */
static void advertised(const char *endpoint, char *out, size_t size) {
  static const char *const wildcards[] = {"tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"};
  for (size_t i = 0; i < sizeof wildcards / sizeof *wildcards; i++) {
    size_t n = strlen(wildcards[i]);
    char host[256];
    if (strncmp(endpoint, wildcards[i], n) == 0 && gethostname(host, sizeof host) == 0) {
      host[sizeof host - 1] = '\0';
      snprintf(out, size, "tcp://%s:%s", host, endpoint + n);
      return;
    }
  }
  snprintf(out, size, "%s", endpoint);
}

int sf_rendezvous_write(const char *path, const char *endpoint, const char *secret_key_file, sf_error *error) {
  char pub[SF_CURVE_KEY_Z85_LEN + 1] = "", sec[SF_CURVE_KEY_Z85_LEN + 1];
  if (secret_key_file) {
    int rc = sf_curve_key_load(secret_key_file, pub, sec, error);
    memset(sec, 0, sizeof sec); /* only the public half goes into the file */
    if (rc < 0) return rc;
  }
  char where[600], tmp[4200];
  advertised(endpoint, where, sizeof where);
  if (snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof tmp)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = path), "rendezvous path too long");
  /* 0644 whatever the umask: workers refuse a rendezvous file others may write. O_EXCL and O_NOFOLLOW: a name
   * planted in a shared directory is not followed; a temporary file of a killed head with this pid goes first. */
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  FILE *f = fd >= 0 && fchmod(fd, 0644) == 0 ? fdopen(fd, "w") : NULL;
  if (!f && fd >= 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    errno = e;
  }
  if (!f)
    return sf_error_set(error, SF_EIO, SF_AT(.url = path),
                        "cannot write the rendezvous file: %s (rendezvous: must name a file in a writable directory "
                        "that the workers can read, e.g. the job's directory)",
                        strerror(errno));
  fprintf(f,
          "#   shardflow rendezvous: the head of a group listens here. Written by the head, read by\n"
          "#   `shardflow worker --rendezvous FILE` (the file is also the head's public key).\n"
          "metadata\n    endpoint = \"%s\"\n",
          where);
  if (pub[0])
    fprintf(f, "curve\n    public-key = \"%s\"\n", pub);
  else
    fprintf(f, "    plaintext = \"true\"\n");
  bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot write the rendezvous file: %s", strerror(e));
  }
  return 0;
}

/* Parses text: the endpoint into endpoint[size], whether it says plaintext. */
static int parse(const char *path, char *text, char *endpoint, size_t size, bool *plaintext, sf_error *error) {
  endpoint[0] = '\0';
  *plaintext = false;
  int line_no = 0;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    line_no++;
    char *name, *value;
    if (!sf_key_line_parse(line, &name, &value))
      return sf_error_set(error, SF_EFORMAT, SF_AT(.url = path, .line = line_no),
                          "not a rendezvous file line (the head writes this file; is the path right?)");
    if (value && name && strcmp(name, "endpoint") == 0) snprintf(endpoint, size, "%s", value);
    if (value && name && strcmp(name, "plaintext") == 0) *plaintext = strcmp(value, "true") == 0;
  }
  if (!endpoint[0])
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = path),
                        "the rendezvous file has no `endpoint = \"...\"` line (it is written by a head whose group "
                        "has `rendezvous: FILE`)");
  return 0;
}

/*
 * The file says which head the worker trusts: refuses anything but a regular file, and one that others could
 * have written (the file, or the directory it is renamed into, unless that is sticky like /tmp).
 */
static int check_file(int fd, const char *path, sf_error *error) {
  struct stat st;
  if (fstat(fd, &st) < 0)
    return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot stat the rendezvous file: %s", strerror(errno));
  if (!S_ISREG(st.st_mode))
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = path),
                        "the rendezvous file is not a regular file (a FIFO, device or directory): give the path "
                        "of the file the head's group `rendezvous:` writes");
  int rc = sf_key_path_check(path, &st, "the rendezvous file", false, error);
  if (rc < 0) return rc;
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  if (stat(dir, &st) < 0)
    return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot stat the directory %s: %s", dir, strerror(errno));
  rc = sf_key_path_check(dir, &st, "the rendezvous file's directory", true, error);
  if (rc < 0 && error) snprintf(error->url, sizeof error->url, "%s", path); /* the file the user gave */
  return rc;
}

int sf_rendezvous_read(const char *path, double timeout, volatile sig_atomic_t *stop, char *endpoint, size_t size,
                       bool *plaintext, sf_error *error) {
  struct timespec start, now, tick = {0, 100 * 1000 * 1000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  int fd;
  /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of blocking past the timeout */
  while ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0) {
    if (errno != ENOENT)
      return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot open the rendezvous file: %s", strerror(errno));
    if (stop && *stop)
      return sf_error_set(error, SF_ECANCELED, SF_AT(.url = path), "stopped while waiting for the head");
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 > timeout)
      return sf_error_set(error, SF_ETIMEDOUT, SF_AT(.url = path),
                          "no rendezvous file after %.0f s: check that the head runs with `rendezvous:` naming this "
                          "file in its group (a directory both can see), or raise --connect-timeout",
                          timeout);
    nanosleep(&tick, NULL);
  }
  char *text = NULL;
  int rc = check_file(fd, path, error);
  if (rc == 0) rc = sf_key_file_read(fd, path, MAX_RENDEZVOUS_FILE, &text, error);
  close(fd);
  if (rc == 0) rc = parse(path, text, endpoint, size, plaintext, error);
  free(text);
  return rc;
}
