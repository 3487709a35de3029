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
#include <sys/resource.h>
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
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) removed++;
  }
  closedir(d);
  return removed;
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
