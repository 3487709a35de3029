/* `shardflow config`: the compiler flags and directories of the installation this CLI runs from (as python3-config). */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "cli/cli.h"
#include "install_dirs.h"

typedef struct config_args {
  bool cflags, libs, plugin_dir, pkgconfigdir;
} config_args;

static const sf_cli_option config_options[] = {
    {.row = {"cflags", SF_OPT_BOOL, offsetof(config_args, cflags),
             .help = "the -I flag for the headers (#include <shardflow/stage.h>): all a plugin needs to compile"}},
    {.row = {"libs", SF_OPT_BOOL, offsetof(config_args, libs),
             .help = "the flags that link an embedding program with libshardflow (a plugin links nothing of it)"}},
    {.row = {"plugin-dir", SF_OPT_BOOL, offsetof(config_args, plugin_dir),
             .help = "the directory `plugins: [NAME]` searches after SHARDFLOW_PLUGIN_PATH: install plugins there"}},
    {.row = {"pkgconfigdir", SF_OPT_BOOL, offsetof(config_args, pkgconfigdir),
             .help = "shardflow.pc's directory, for PKG_CONFIG_PATH (pkg-config --cflags shardflow)"}},
    {.row = {NULL}},
};

static int config_main(int argc, char **argv) {
  config_args a = {0};
  int first, status;
  if (!sf_cli_parse(&sf_cli_config, argc, argv, &a, &first, &status)) return status;
  sf_cli_free(&sf_cli_config, &a);
  if (first < argc) return sf_cli_usage_error(&sf_cli_config, "takes no operands (got '%s')", argv[first]);
  bool all = !a.cflags && !a.libs && !a.plugin_dir && !a.pkgconfigdir; /* no option: every answer, labelled */
  if (all || a.cflags) printf("%s-I%s\n", all ? "cflags: " : "", sf_install_dir(SF_INSTALL_INCLUDE));
  if (all || a.libs) printf("%s-L%s -lshardflow\n", all ? "libs: " : "", sf_install_dir(SF_INSTALL_LIB));
  if (all || a.plugin_dir) printf("%s%s\n", all ? "plugin-dir: " : "", sf_install_dir(SF_INSTALL_PLUGINS));
  if (all || a.pkgconfigdir) printf("%s%s\n", all ? "pkgconfigdir: " : "", sf_install_dir(SF_INSTALL_PKGCONFIG));
  return 0;
}

const sf_cli_command sf_cli_config = {
    .name = "config",
    .run = config_main,
    .args = "[--cflags] [--libs] [--plugin-dir] [--pkgconfigdir]",
    .summary = "compiler flags and directories of this installation, for plugins and embedders",
    .about = "Prints what a plugin's or an embedding program's build needs from the shardflow this command\n"
             "belongs to, one answer a line in the order of the options below (all, labelled, without options):\n"
             "  cc -shared -fPIC $(shardflow config --cflags) my_stage.c -o my_stage.so\n"
             "The answers are found from where this CLI is installed: a `meson install` prefix (moved or\n"
             "not) or the Python package of a pip install (its include/, plugins/ and pkgconfig/ beside\n"
             "libshardflow.so). Run from a build tree, it names where `meson install` will put them.",
    .options = config_options,
};
