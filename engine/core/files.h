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

/*
 * Removes what processes that are gone left in dir: entries of the given type
 * (S_IFREG, S_IFSOCK, S_IFDIR) whose name holds marker, then a process id, a
 * '-', and ends with suffix ("" = anything), when no process has that id any
 * more (kill(pid, 0) fails with ESRCH). A directory goes with the files in it,
 * only if this user owns it (nested directories keep it). Best effort:
 * entries that cannot be read or removed stay. Returns how many were removed.
 */
int sf_remove_stale_files(const char *dir, const char *marker, const char *suffix, unsigned type);

#endif
