/* The stage registry: stage definitions by name (sf_stage_find / sf_stage_iterate in shardflow/stage.h). */
#ifndef SF_ENGINE_REGISTRY_H
#define SF_ENGINE_REGISTRY_H

#include "shardflow/error.h"
#include "shardflow/plugin.h"
#include "shardflow/stage.h"

/*
 * The built-in stage definitions, NULL-terminated, defined by the stages layer
 * (stages/registry.c). Names starting with '_' are the engine's internal
 * stages (groups): sf_stage_find finds them, sf_stage_iterate skips them.
 */
extern const sf_stage_def *const sf_builtin_stages[];

/*
 * Adds a checked plugin descriptor (engine/graph/plugin_loader.c) loaded from
 * the file path, so that sf_stage_find / sf_stage_iterate return its stages.
 * Refuses, under the registry's lock, a plugin whose name is already taken or
 * a stage whose name a built-in or another plugin has (the error names path
 * and the owner). plugin is borrowed for the life of the process; path is
 * copied. Returns 0, SF_EINVAL (a clash) or SF_ENOMEM.
 */
int sf_registry_add_plugin(const sf_plugin *plugin, const char *path, sf_error *error);

/* The plugin loaded from the file path (as sf_registry_add_plugin got it), or NULL. Borrowed. */
const sf_plugin *sf_registry_plugin_at(const char *path);

/* The plugin that brought the stage def, or NULL for a built-in stage. Borrowed. */
const sf_plugin *sf_registry_stage_plugin(const sf_stage_def *def);

/*
 * The internal stage that runs a group's head (engine/group/head.c): the type of the node that replaces a
 * group's stages in the head's graph, and the options table of a `groups:` entry. It lives in the group
 * layer, above this one, so the graph layer finds it by this name, here only.
 */
#define SF_GROUP_HEAD_STAGE "_group"
/* Its definition (a built-in: always there). Borrowed. */
const sf_stage_def *sf_registry_group_head(void);

#endif
