/* The stage registry: stage definitions by name (sf_stage_find / sf_stage_iterate in shardflow/stage.h). */
#ifndef SF_ENGINE_REGISTRY_H
#define SF_ENGINE_REGISTRY_H

#include "shardflow/stage.h"

/*
 * The built-in stage definitions, NULL-terminated, defined by the stages layer
 * (stages/registry.c). Names starting with '_' are the engine's internal
 * stages (groups): sf_stage_find finds them, sf_stage_iterate skips them.
 */
extern const sf_stage_def *const sf_builtin_stages[];

#endif
