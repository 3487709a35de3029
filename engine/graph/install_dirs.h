/* Where the installation this engine runs from keeps its headers, library, plugins and shardflow.pc. */
#ifndef SF_ENGINE_INSTALL_DIRS_H
#define SF_ENGINE_INSTALL_DIRS_H

/* The parts of an installation a plugin author or an embedder asks for (`shardflow config`). */
typedef enum sf_install_part {
  SF_INSTALL_INCLUDE,   /* the directory to add with -I: it holds shardflow/stage.h */
  SF_INSTALL_LIB,       /* libshardflow's directory (-L) */
  SF_INSTALL_PLUGINS,   /* where `plugins: [NAME]` is searched after SHARDFLOW_PLUGIN_PATH */
  SF_INSTALL_PKGCONFIG, /* shardflow.pc's directory (PKG_CONFIG_PATH) */
} sf_install_part;

/*
 * The directory of part in the installation this engine runs from.
 *
 * The engine runs from a shared library (libshardflow.so: Python, an embedding
 * program) or from a program it is linked into (the shardflow CLI); dladdr
 * names that file. When the file sits where the install layout puts it
 * (meson's libdir or bindir under the prefix; the package directory of the
 * Python wheel) and the root above it holds the headers, that root is the
 * installation, wherever it was moved or pip put it. Otherwise (a build tree,
 * a runtime-only install without headers) it is the configured one: meson's
 * prefix, or the wheel's. Found once; thread-safe.
 *
 * Returns an absolute path without a trailing '/', never NULL; borrowed for
 * the life of the process.
 */
const char *sf_install_dir(sf_install_part part);

#endif
