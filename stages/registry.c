/*
 * The built-in stages: adding one is a file in stages/ plus one line here (and in meson.build).
 * The graph layer's registry (engine/graph/registry.c) looks stages up in this table: the one
 * reference that goes from a lower layer to this one, as data, so a static link pulls every
 * stage in (tools/check-layers.py allows exactly this symbol).
 */
#include <stddef.h>

#include "registry.h"
#include "remote.h"

extern const sf_stage_def sf_stage_shard_source;
extern const sf_stage_def sf_stage_tar_split;
extern const sf_stage_def sf_stage_decode;
extern const sf_stage_def sf_stage_augment;
extern const sf_stage_def sf_stage_shuffle;
extern const sf_stage_def sf_stage_batch;
extern const sf_stage_def sf_stage_device_sink;

const sf_stage_def *const sf_builtin_stages[] = {
    &sf_stage_shard_source, &sf_stage_tar_split, &sf_stage_decode,      &sf_stage_augment,
    &sf_stage_shuffle,      &sf_stage_batch,     &sf_stage_device_sink,
    /* Stages the engine places itself (groups): found by name, never listed (names start with '_'). */
    &sf_stage_remote,       &sf_stage_worker_source, &sf_stage_worker_sink, NULL,
};
