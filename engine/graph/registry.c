/* The stage registry: finds stage definitions by name for the graph reader, help and the harness. */
#include <stdint.h>
#include <string.h>

#include "registry.h"

const sf_stage_def *sf_stage_iterate(void **opaque) {
  for (uintptr_t i = (uintptr_t)*opaque; sf_builtin_stages[i]; i++) {
    if (sf_builtin_stages[i]->name[0] == '_') continue;
    *opaque = (void *)(i + 1);
    return sf_builtin_stages[i];
  }
  return NULL;
}

const sf_stage_def *sf_stage_find(const char *name) {
  for (int i = 0; sf_builtin_stages[i]; i++)
    if (strcmp(sf_builtin_stages[i]->name, name) == 0) return sf_builtin_stages[i];
  return NULL;
}
