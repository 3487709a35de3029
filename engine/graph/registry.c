/* The stage registry: the built-in table plus the plugins loaded so far, for the graph reader, help and the harness. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

/* A loaded plugin. The list only grows (plugins are never unloaded), so definitions stay valid. */
typedef struct loaded {
  const sf_plugin *plugin;
  char *path;
  struct loaded *next;
} loaded;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static loaded *plugins, **plugins_tail = &plugins;

/* The index-th public stage: built-ins (without internal '_' ones) first, then plugins' in load order. */
static const sf_stage_def *nth_stage(uintptr_t index, const sf_plugin **owner) {
  uintptr_t k = 0;
  *owner = NULL;
  for (int i = 0; sf_builtin_stages[i]; i++)
    if (k++ == index) return sf_builtin_stages[i];
  for (const loaded *p = plugins; p; p = p->next) {
    *owner = p->plugin;
    for (const sf_stage_def *const *s = p->plugin->stages; *s; s++)
      if (k++ == index) return *s;
  }
  return NULL;
}

const sf_stage_def *sf_stage_iterate(void **opaque) {
  const sf_plugin *owner;
  const sf_stage_def *def;
  pthread_mutex_lock(&lock);
  uintptr_t i = (uintptr_t)*opaque;
  while ((def = nth_stage(i++, &owner)) && def->name[0] == '_') {}
  pthread_mutex_unlock(&lock);
  *opaque = (void *)i;
  return def;
}

/* The stage called name and its plugin (NULL for a built-in); caller holds the lock. */
static const sf_stage_def *find(const char *name, const sf_plugin **owner) {
  *owner = NULL;
  for (int i = 0; sf_builtin_stages[i]; i++)
    if (strcmp(sf_builtin_stages[i]->name, name) == 0) return sf_builtin_stages[i];
  for (const loaded *p = plugins; p; p = p->next)
    for (const sf_stage_def *const *s = p->plugin->stages; *s; s++)
      if (strcmp((*s)->name, name) == 0) {
        *owner = p->plugin;
        return *s;
      }
  return NULL;
}

const sf_stage_def *sf_stage_find(const char *name) {
  const sf_plugin *owner;
  pthread_mutex_lock(&lock);
  const sf_stage_def *def = find(name, &owner);
  pthread_mutex_unlock(&lock);
  return def;
}

const sf_stage_def *sf_registry_group_head(void) { return sf_stage_find(SF_GROUP_HEAD_STAGE); }

static const char *path_of(const sf_plugin *plugin) {
  for (const loaded *p = plugins; p; p = p->next)
    if (p->plugin == plugin) return p->path;
  return "";
}

int sf_registry_add_plugin(const sf_plugin *plugin, const char *path, sf_error *error) {
  int rc = 0;
  pthread_mutex_lock(&lock);
  for (const loaded *p = plugins; p && rc == 0; p = p->next)
    if (strcmp(p->plugin->name, plugin->name) == 0)
      rc = sf_error_set(error, SF_EINVAL, SF_AT(.url = path),
                        "plugin %s: another plugin named '%s' is already loaded from %s; load only one of them",
                        path, plugin->name, p->path);
  for (const sf_stage_def *const *s = plugin->stages; *s && rc == 0; s++) {
    const sf_plugin *owner;
    const sf_stage_def *clash = find((*s)->name, &owner);
    for (const sf_stage_def *const *t = plugin->stages; !clash && t < s; t++)
      if (strcmp((*t)->name, (*s)->name) == 0) clash = *t, owner = plugin;
    if (!clash) continue;
    if (!owner)
      rc = sf_error_set(error, SF_EINVAL, SF_AT(.url = path),
                        "plugin %s: stage '%s' clashes with the built-in stage of that name; rename the plugin's stage",
                        path, (*s)->name);
    else if (owner == plugin)
      rc = sf_error_set(error, SF_EINVAL, SF_AT(.url = path),
                        "plugin %s: defines stage '%s' twice; give each stage its own name", path, (*s)->name);
    else
      rc = sf_error_set(error, SF_EINVAL, SF_AT(.url = path),
                        "plugin %s: stage '%s' clashes with the stage of plugin '%s' (%s); rename one of them or "
                        "load only one plugin",
                        path, (*s)->name, owner->name, path_of(owner));
  }
  loaded *p = rc == 0 ? calloc(1, sizeof *p) : NULL;
  if (rc == 0 && (!p || !(p->path = strdup(path)))) {
    free(p);
    rc = sf_error_set(error, SF_ENOMEM, SF_AT(.url = path), "out of memory");
  } else if (p) {
    p->plugin = plugin;
    *plugins_tail = p;
    plugins_tail = &p->next;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

const sf_plugin *sf_registry_plugin_at(const char *path) {
  const sf_plugin *found = NULL;
  pthread_mutex_lock(&lock);
  for (const loaded *p = plugins; p && !found; p = p->next)
    if (strcmp(p->path, path) == 0) found = p->plugin;
  pthread_mutex_unlock(&lock);
  return found;
}

const sf_plugin *sf_registry_stage_plugin(const sf_stage_def *def) {
  const sf_plugin *owner;
  pthread_mutex_lock(&lock);
  const sf_stage_def *found = find(def->name, &owner);
  pthread_mutex_unlock(&lock);
  return found == def ? owner : NULL;
}
