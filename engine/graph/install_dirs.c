/* The installation's directories, found from the file the engine runs from (install_dirs.h). */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "install_dirs.h"

/* The layout meson installs (meson.build's install_layout): the root absolute, the parts relative to it
 * (absolute where the user gave an absolute libdir or bindir outside the prefix: then that part cannot move). */
#ifndef SF_INSTALL_ROOT
#define SF_INSTALL_ROOT "/usr/local"
#define SF_INSTALL_BINDIR "bin"
#define SF_INSTALL_LIBDIR "lib"
#define SF_INSTALL_INCLUDEDIR "include"
#define SF_INSTALL_PLUGINDIR "lib/shardflow/plugins"
#define SF_INSTALL_PKGCONFIGDIR "lib/pkgconfig"
#endif

static const char *const part_dirs[] = {
    [SF_INSTALL_INCLUDE] = SF_INSTALL_INCLUDEDIR,
    [SF_INSTALL_LIB] = SF_INSTALL_LIBDIR,
    [SF_INSTALL_PLUGINS] = SF_INSTALL_PLUGINDIR,
    [SF_INSTALL_PKGCONFIG] = SF_INSTALL_PKGCONFIGDIR,
};
enum { PARTS = sizeof part_dirs / sizeof *part_dirs };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char found[PARTS][PATH_MAX];

/* root/rel, or rel when absolute, or root when rel is "."; truncated (never overflows) past PATH_MAX. */
static void join(char *out, const char *root, const char *rel) {
  if (rel[0] == '/')
    snprintf(out, PATH_MAX, "%s", rel);
  else if (strcmp(rel, ".") == 0)
    snprintf(out, PATH_MAX, "%s", root);
  else
    snprintf(out, PATH_MAX, "%s%s%s", root, strcmp(root, "/") == 0 ? "" : "/", rel);
}

/* Removes rel's components ("lib/x86_64-linux-gnu") from the end of the absolute directory dir when dir ends with
 * them (its root is left: "/usr/local"); false, dir unchanged in meaning, when it does not. */
static bool strip_layout(char *dir, const char *rel) {
  char copy[PATH_MAX], *parts[32], *save = NULL; /* a layout directory has a few components ("lib/x86_64-linux-gnu") */
  int n = 0;
  if (rel[0] == '/' || snprintf(copy, sizeof copy, "%s", rel) >= (int)sizeof copy) return false;
  for (char *c = strtok_r(copy, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (strcmp(c, ".") == 0) continue;
    if (n == (int)(sizeof parts / sizeof *parts)) return false;
    parts[n++] = c;
  }
  char work[PATH_MAX];
  snprintf(work, sizeof work, "%s", dir);
  for (int i = n - 1; i >= 0; i--) {
    char *slash = strrchr(work, '/');
    if (!slash || strcmp(slash + 1, parts[i]) != 0) return false; /* also ".." in rel: never a directory's name */
    slash[slash == work] = '\0';                                     /* "/bin" leaves "/" */
  }
  memcpy(dir, work, sizeof work);
  return true;
}

/* The file this code was loaded from: a shared library's path, or the program's (its link map has no name). */
static bool running_file(char *file, bool *program) {
  Dl_info info;
  struct link_map *map = NULL;
  if (!dladdr1((void *)running_file, &info, (void **)&map, RTLD_DL_LINKMAP) || !map) return false;
  *program = !map->l_name || !map->l_name[0];
  return realpath(*program ? "/proc/self/exe" : map->l_name, file) != NULL;
}

static void find(void) {
  char dir[PATH_MAX], marker[PATH_MAX];
  bool program = false, moved = false;
  if (running_file(dir, &program)) {
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir] = '\0';
    /* The headers say "an installation" (a build tree has none there); their absence, a runtime-only one,
     * leaves the configured root, where such a package installs anyway. */
    if (slash && strip_layout(dir, program ? SF_INSTALL_BINDIR : SF_INSTALL_LIBDIR)) {
      join(marker, dir, SF_INSTALL_INCLUDEDIR);
      size_t n = strlen(marker);
      snprintf(marker + n, sizeof marker - n, "/shardflow/plugin.h");
      moved = access(marker, F_OK) == 0;
    }
  }
  for (int p = 0; p < PARTS; p++)
    join(found[p], moved ? dir : SF_INSTALL_ROOT, part_dirs[p]);
}

const char *sf_install_dir(sf_install_part part) {
  pthread_once(&once, find);
  return (unsigned)part < PARTS ? found[part] : found[SF_INSTALL_LIB];
}
