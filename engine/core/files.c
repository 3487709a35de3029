/* Filesystem helpers shared by the stages and the CLI. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"

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
