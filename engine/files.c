/* Filesystem helpers shared by the stages and the CLI. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/files.h"

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
