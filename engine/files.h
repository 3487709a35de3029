/* Filesystem helpers shared by the stages and the CLI. */
#ifndef SF_ENGINE_FILES_H
#define SF_ENGINE_FILES_H

#include <stdbool.h>

/*
 * Creates directory path and its missing parents (mkdir -p, mode 0777 before
 * umask). When parents_only is true the last component is left alone (path
 * names a file to be written). Returns 0 or -errno.
 */
int sf_make_dirs(const char *path, bool parents_only);

#endif
