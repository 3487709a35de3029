/* The plugin loader: dlopen, the entry point, the descriptor's checks, then the registry (plugin_loader.h). */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "install_dirs.h"
#include "plugin_loader.h"
#include "registry.h"

/* One load at a time: "the same file twice is a no-op" must hold for two threads too. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* Finds NAME.so in SHARDFLOW_PLUGIN_PATH, then the installation's plugin directory, into file; the error lists where
 * it looked. */
static int search(const char *name, char *file, size_t size, sf_error *error) {
  char looked[1024] = "";
  size_t n = 0;
  const char *env = getenv("SHARDFLOW_PLUGIN_PATH");
  const char *dirs[2] = {env ? env : "", sf_install_dir(SF_INSTALL_PLUGINS)};
  for (int d = 0; d < 2; d++) {
    for (const char *s = dirs[d]; *s;) {
      size_t len = strcspn(s, ":");
      if (len) {
        snprintf(file, size, "%.*s/%s.so", (int)len, s, name);
        if (access(file, F_OK) == 0) return 0;
        int w = snprintf(looked + n, sizeof looked - n, "%s%s", n ? ", " : "", file);
        if (w > 0 && (size_t)w < sizeof looked - n) n += (size_t)w;
      }
      s += len + (s[len] == ':');
    }
  }
  return sf_error_set(error, SF_ENOENT, SF_AT(.url = name),
                      "plugin '%s' not found (looked for %s); install it there, add its directory to "
                      "SHARDFLOW_PLUGIN_PATH, or give the .so's path",
                      name, looked);
}

/* Checks what the entry point returned; the error names file. */
static int check(const sf_plugin *p, const char *file, sf_error *error) {
  if (!p)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = file), "plugin %s: %s() returned NULL; fix the plugin",
                        file, SF_PLUGIN_ENTRY);
  if (p->abi_version != SF_STAGE_ABI_VERSION)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = file),
                        "plugin %s was built for stage ABI version %u, this shardflow has version %u: rebuild the "
                        "plugin against this shardflow's headers",
                        file, (unsigned)p->abi_version, (unsigned)SF_STAGE_ABI_VERSION);
  if (!p->name || !p->name[0] || !p->build_id || !p->stages)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = file),
                        "plugin %s: its descriptor lacks a name, build_id or stages list; fix the plugin", file);
  for (const sf_stage_def *const *s = p->stages; *s; s++) {
    const sf_stage_def *d = *s;
    if (d->abi_version != SF_STAGE_ABI_VERSION)
      return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = file),
                          "plugin %s: stage '%s' was built for stage ABI version %u, this shardflow has version %u: "
                          "rebuild the plugin against this shardflow's headers",
                          file, d->name ? d->name : "?", (unsigned)d->abi_version, (unsigned)SF_STAGE_ABI_VERSION);
    if (!d->name || !d->name[0] || d->name[0] == '_' || !d->step == !d->map)
      return sf_error_set(error, SF_EFORMAT, SF_AT(.url = file),
                          "plugin %s: a stage has no name, a name starting with '_' (reserved), or not exactly one of a "
                          "step and a map function; fix the plugin",
                          file);
  }
  return 0;
}

static int load(const char *name_or_path, const sf_plugin **out, sf_error *error) {
  char file[PATH_MAX], real[PATH_MAX];
  if (strchr(name_or_path, '/')) {
    if (strlen(name_or_path) >= sizeof file)
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = name_or_path), "plugin path too long");
    strcpy(file, name_or_path);
  } else {
    int rc = search(name_or_path, file, sizeof file, error);
    if (rc < 0) return rc;
  }
  if (!realpath(file, real))
    return sf_error_set(error, SF_ENOENT, SF_AT(.url = file), "plugin %s: %m; check the path", file);
  if ((*out = sf_registry_plugin_at(real))) return 0;
  void *handle = dlopen(real, RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = file),
                        "plugin %s cannot be loaded: %s; rebuild it as a shared object (cc -shared -fPIC) for "
                        "this machine",
                        file, dlerror());
  sf_plugin_entry_fn entry;
  *(void **)&entry = dlsym(handle, SF_PLUGIN_ENTRY);
  int rc;
  if (!entry)
    rc = sf_error_set(error, SF_EFORMAT, SF_AT(.url = file),
                      "plugin %s has no entry point %s(); export `SF_PLUGIN_EXPORT const sf_plugin *%s(void)` "
                      "(shardflow/plugin.h)",
                      file, SF_PLUGIN_ENTRY, SF_PLUGIN_ENTRY);
  else if ((rc = check(*out = entry(), file, error)) == 0)
    rc = sf_registry_add_plugin(*out, real, error);
  if (rc < 0) {
    *out = NULL;
    dlclose(handle);
    return rc;
  }
  return 0;
}

int sf_plugin_load(const char *name_or_path, const sf_plugin **plugin, sf_error *error) {
  const sf_plugin *p = NULL;
  if (!name_or_path || !name_or_path[0])
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "a plugin is named by a name or a path, not \"\"");
  pthread_mutex_lock(&load_lock);
  int rc = load(name_or_path, &p, error);
  pthread_mutex_unlock(&load_lock);
  if (plugin) *plugin = p;
  return rc;
}

static int is_shared_object(const struct dirent *e) {
  size_t n = strlen(e->d_name);
  return n > 3 && strcmp(e->d_name + n - 3, ".so") == 0;
}

/* True when NAME.so was met in a directory searched before dirs[d]/s (the search order's first wins). */
static bool seen_before(const char *const *dirs, int d, const char *at, const char *base) {
  char file[PATH_MAX];
  for (int e = 0; e <= d; e++)
    for (const char *s = dirs[e]; *s && !(e == d && s == at);) {
      size_t len = strcspn(s, ":");
      if (len) {
        snprintf(file, sizeof file, "%.*s/%s", (int)len, s, base);
        if (access(file, F_OK) == 0) return true;
      }
      s += len + (s[len] == ':');
    }
  return false;
}

int sf_plugin_load_found(void (*failed)(const sf_error *error, void *opaque), void *opaque) {
  const char *env = getenv("SHARDFLOW_PLUGIN_PATH");
  const char *dirs[2] = {env ? env : "", sf_install_dir(SF_INSTALL_PLUGINS)};
  int loaded = 0;
  for (int d = 0; d < 2; d++) {
    for (const char *s = dirs[d]; *s;) {
      size_t len = strcspn(s, ":");
      char dir[PATH_MAX];
      snprintf(dir, sizeof dir, "%.*s", (int)len, s);
      struct dirent **names = NULL;
      int n = len ? scandir(dir, &names, is_shared_object, alphasort) : 0;
      for (int i = 0; i < n; i++) {
        char file[PATH_MAX];
        sf_error error = {0};
        int w = snprintf(file, sizeof file, "%s/%s", dir, names[i]->d_name);
        if (w > 0 && (size_t)w < sizeof file && !seen_before(dirs, d, s, names[i]->d_name)) {
          if (sf_plugin_load(file, NULL, &error) == 0)
            loaded++;
          else if (failed)
            failed(&error, opaque);
        }
        free(names[i]);
      }
      free(names);
      s += len + (s[len] == ':');
    }
  }
  return loaded;
}
