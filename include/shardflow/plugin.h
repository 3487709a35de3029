/* shardflow plugins: a shared object that brings stages of its own (GStreamer's plugin descriptor, in spirit). */
#ifndef SHARDFLOW_PLUGIN_H
#define SHARDFLOW_PLUGIN_H

#include <stdint.h>

#include "shardflow/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * What a plugin exports, returned by its entry point (SF_PLUGIN_ENTRY).
 *
 * A plugin is a shared object built against the installed headers alone
 * (`pkg-config --cflags shardflow`); it links nothing of shardflow's but may
 * call the SF_API functions of the process that loads it. The descriptor and
 * everything it points to are static data of the plugin: the loader borrows
 * them for the life of the process (a plugin is never unloaded).
 */
typedef struct sf_plugin {
  uint32_t abi_version;              /**< SF_STAGE_ABI_VERSION the plugin was built with; another is refused */
  const char *name;                  /**< the plugin's name, as graph files write it (`plugins: [audio]`) */
  const char *build_id;              /**< this build's identity (version and build); a group's workers must
                                          load a plugin of the same name and build_id as the head */
  const sf_stage_def *const *stages; /**< its stage definitions, NULL-terminated; names must not clash with
                                          built-in stages or other plugins' */
} sf_plugin;

/** Name of the entry point every plugin exports: `const sf_plugin *sf_plugin_entry(void)`. */
#define SF_PLUGIN_ENTRY "sf_plugin_entry"

/** Type of the entry point. */
typedef const sf_plugin *(*sf_plugin_entry_fn)(void);

/** Marks the entry point for export from a plugin built with hidden visibility. */
#define SF_PLUGIN_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
}
#endif
#endif
