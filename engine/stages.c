/* The registry of built-in stages: adding a stage is one file plus one line here. */
#include <string.h>

#include "engine/remote.h"
#include "shardflow/stage.h"

extern const sf_stage_def sf_stage_shard_source;
extern const sf_stage_def sf_stage_tar_split;
extern const sf_stage_def sf_stage_decode;
extern const sf_stage_def sf_stage_augment;
extern const sf_stage_def sf_stage_shuffle;
extern const sf_stage_def sf_stage_batch;
extern const sf_stage_def sf_stage_device_sink;

static const sf_stage_def *const builtin[] = {
    &sf_stage_shard_source, &sf_stage_tar_split, &sf_stage_decode,      &sf_stage_augment,
    &sf_stage_shuffle,      &sf_stage_batch,     &sf_stage_device_sink, NULL,
};

const sf_stage_def *sf_stage_iterate(void **opaque) {
  uintptr_t i = (uintptr_t)*opaque;
  const sf_stage_def *def = builtin[i];
  if (def) *opaque = (void *)(i + 1);
  return def;
}

/* Stages the engine places itself (groups); found by name, never listed. */
static const sf_stage_def *const internal[] = {&sf_stage_remote, &sf_stage_worker_source, &sf_stage_worker_sink, NULL};

const sf_stage_def *sf_stage_find(const char *name) {
  for (int i = 0; builtin[i]; i++)
    if (strcmp(builtin[i]->name, name) == 0) return builtin[i];
  for (int i = 0; internal[i]; i++)
    if (strcmp(internal[i]->name, name) == 0) return internal[i];
  return NULL;
}
