/* The plugin loader: finds a plugin's shared object, checks its descriptor and adds its stages to the registry. */
#ifndef SF_ENGINE_PLUGIN_LOADER_H
#define SF_ENGINE_PLUGIN_LOADER_H

#include "shardflow/error.h"
#include "shardflow/plugin.h"

/*
 * Loads the plugin `name_or_path` (include/shardflow/plugin.h is the contract).
 *
 * A name without '/' is searched as NAME.so in each directory of
 * SHARDFLOW_PLUGIN_PATH (colon-separated), then in the plugin directory of the
 * installation the engine runs from (sf_install_dir(SF_INSTALL_PLUGINS):
 * $libdir/shardflow/plugins, or plugins/ beside the library in the Python
 * package, wherever either was installed); anything with a '/' is a path used
 * as given.
 * The file is opened with dlopen(RTLD_NOW | RTLD_LOCAL); its SF_PLUGIN_ENTRY
 * must return a descriptor of this SF_STAGE_ABI_VERSION with a name, a
 * build_id and a NULL-terminated list of stages of that ABI version, whose
 * names clash with no built-in stage and no stage of a plugin loaded before.
 * Loading the same file again (same real path) is a no-op that returns the
 * descriptor loaded first. Thread-safe; a plugin is never unloaded.
 *
 * On success *plugin (when not NULL) is the descriptor, borrowed for the life
 * of the process. Errors name the file (error->url and the message) and what
 * to do: SF_ENOENT (not found: where it looked), SF_EFORMAT (dlopen failed, with
 * dlerror(); no entry point; an incomplete descriptor), SF_EUNSUPPORTED (another
 * ABI version: both numbers), SF_EINVAL (a stage name that clashes: whose it is),
 * SF_ENOMEM.
 */
int sf_plugin_load(const char *name_or_path, const sf_plugin **plugin, sf_error *error);

/*
 * Loads every plugin found: each *.so in the directories of
 * SHARDFLOW_PLUGIN_PATH, then in the installation's plugin directory, in name order
 * (a NAME.so found in an earlier directory hides later ones, as the search
 * by name above does), so that `shardflow help` lists their stages.  A file
 * that fails to load (as sf_plugin_load() refuses it) is passed to failed
 * (may be NULL; error borrowed for the call) and the scan goes on.  A
 * directory that does not exist is passed over.  Returns how many loaded
 * (a plugin loaded before counts again).
 */
int sf_plugin_load_found(void (*failed)(const sf_error *error, void *opaque), void *opaque);

#endif
