/* Filesystem helpers shared by the stages and the CLI. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "shardflow/storage.h"

int sf_make_dirs(const char *path, bool parents_only) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return -ENAMETOOLONG;
  if (parents_only) {
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
  }
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) return -errno;
    *p = '/';
  }
  if (mkdir(dir, 0777) < 0 && errno != EEXIST) return -errno;
  return 0;
}

int sf_dir_create(const char *path, sf_error *error) {
  int e = sf_make_dirs(path, false);
  if (e < 0)
    return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot create directory %s: %s (check the path and "
                        "permissions)", path, strerror(-e));
  return 0;
}

/* The process id after marker in name ("marker<pid>-..."), or 0. */
static pid_t pid_after(const char *name, const char *marker) {
  const char *at = strstr(name, marker);
  if (!at) return 0;
  at += strlen(marker);
  if (!isdigit((unsigned char)*at)) return 0;
  char *end;
  errno = 0;
  long pid = strtol(at, &end, 10);
  return *end == '-' && !errno && pid > 0 && pid == (pid_t)pid ? (pid_t)pid : 0;
}

/*
 * Removes directory name in dirfd and what it holds, if this user owns it: a dead process's private
 * directory. Opened without following links, so a link planted there removes nothing elsewhere.
 */
static bool remove_private_dir(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0) return false;
  DIR *d = fstat(fd, &st) == 0 && st.st_uid == geteuid() ? fdopendir(fd) : NULL;
  if (!d) {
    close(fd);
    return false;
  }
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlinkat(fd, e->d_name, 0);
  closedir(d);
  return unlinkat(dirfd, name, AT_REMOVEDIR) == 0;
}

int sf_remove_stale_files(const char *dir, const char *marker, const char *suffix, unsigned type) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int removed = 0;
  size_t suffix_len = strlen(suffix);
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    pid_t pid = pid_after(e->d_name, marker);
    if (!pid || len < suffix_len || strcmp(e->d_name + len - suffix_len, suffix) != 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || (st.st_mode & S_IFMT) != type) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue; /* alive, or another user's live process */
    if (type == S_IFDIR ? remove_private_dir(dirfd(d), e->d_name) : unlinkat(dirfd(d), e->d_name, 0) == 0) removed++;
  }
  closedir(d);
  return removed;
}

int sf_random_bytes(void *buf, size_t size) {
  for (size_t done = 0; done < size;) {
    ssize_t n = getrandom((char *)buf + done, size - done, 0);
    if (n < 0 && errno != EINTR) return -errno;
    if (n > 0) done += (size_t)n;
  }
  return 0;
}

int sf_unique_name(const char *prefix, char *out, size_t size) {
  unsigned char bytes[8];
  int e = sf_random_bytes(bytes, sizeof bytes);
  if (e < 0) return e;
  int n = snprintf(out, size, "%s%02x%02x%02x%02x%02x%02x%02x%02x", prefix, bytes[0], bytes[1], bytes[2], bytes[3],
                   bytes[4], bytes[5], bytes[6], bytes[7]);
  return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

int sf_file_create_unique(const char *prefix, char *path, size_t size, mode_t mode) {
  /* 64 random bits: a collision means someone planted this very name; a few tries outlast any chance. */
  for (int attempt = 0; attempt < 16; attempt++) {
    int e = sf_unique_name(prefix, path, size);
    if (e < 0) return e;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return -errno;
  }
  return -EEXIST;
}

/* ".partial-HOST-": the host keeps another machine's live copies (shared storage) from looking stale. */
static void partial_marker(char *out, size_t size) {
  char host[HOST_NAME_MAX + 1] = "localhost";
  gethostname(host, sizeof host);
  host[HOST_NAME_MAX] = '\0';
  snprintf(out, size, ".partial-%s-", host);
}

/* "PATH.partial-HOST-PID-", to which the random part is added. */
static int partial_prefix(const char *path, char *out, size_t size) {
  char marker[HOST_NAME_MAX + 16];
  partial_marker(marker, sizeof marker);
  int n = snprintf(out, size, "%s%s%ld-", path, marker, (long)getpid());
  return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

int sf_partial_name(const char *path, char *out, size_t size) {
  char prefix[PATH_MAX];
  int e = partial_prefix(path, prefix, sizeof prefix);
  return e < 0 ? e : sf_unique_name(prefix, out, size);
}

/* The directory part of path ("." when none) into dir[size]. */
static void directory_of(const char *path, char *dir, size_t size) {
  snprintf(dir, size, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, size, ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
}

int sf_remove_stale_partials(const char *path) {
  char marker[HOST_NAME_MAX + 16], dir[PATH_MAX];
  partial_marker(marker, sizeof marker);
  directory_of(path, dir, sizeof dir);
  return sf_remove_stale_files(dir, marker, "", S_IFREG);
}

int sf_file_create_partial(const char *path, char *tmp, size_t size, mode_t mode) {
  char prefix[PATH_MAX];
  int e = partial_prefix(path, prefix, sizeof prefix);
  if (e == 0) e = sf_make_dirs(path, true);
  return e < 0 ? e : sf_file_create_unique(prefix, tmp, size, mode);
}

bool sf_errno_is_fd_limit(int err) { return err == EMFILE || err == ENFILE; }

const char *sf_fd_limit_text(int err, char *buf, size_t size) {
  struct rlimit limit;
  char n[32] = "unknown";
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    snprintf(n, sizeof n, "%llu", (unsigned long long)limit.rlim_cur);
  if (err == ENFILE)
    snprintf(buf, size, "too many open files in the whole system (the kernel's fs.file-max; this process's limit is "
             "%s): close other programs' files or raise fs.file-max", n);
  else
    snprintf(buf, size, "too many open files (the process's limit is %s: raise ulimit -n)", n);
  return buf;
}
