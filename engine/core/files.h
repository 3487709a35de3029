/* Filesystem helpers shared by the stages and the CLI. */
#ifndef SF_ENGINE_FILES_H
#define SF_ENGINE_FILES_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Creates directory path and its missing parents (mkdir -p, mode 0777 before
 * umask). When parents_only is true the last component is left alone (path
 * names a file to be written). Returns 0 or -errno.
 */
int sf_make_dirs(const char *path, bool parents_only);

/*
 * Removes what processes that are gone left in dir: entries of the given type
 * (S_IFREG, S_IFSOCK) whose name holds marker, then a process id, a '-', and
 * ends with suffix ("" = anything), when no process has that id any more
 * (kill(pid, 0) fails with ESRCH). Best effort: entries that cannot be read or
 * removed stay. Returns how many were removed.
 */
int sf_remove_stale_files(const char *dir, const char *marker, const char *suffix, unsigned type);

/*
 * True for EMFILE and ENFILE: an open, socket or pipe failed because the process (or the system) is out
 * of file descriptors. That is a limit to raise, worth a retry once others close theirs, never a sign of
 * a bad path or a dead host.
 */
bool sf_errno_is_fd_limit(int err);

/*
 * Writes what a user is told when err (EMFILE or ENFILE) stopped an open: "too many open files (the
 * process's limit is N: raise ulimit -n)", with N the soft RLIMIT_NOFILE, or the system-wide variant.
 * Returns buf (size bytes, NUL-terminated; cut short when small).
 */
const char *sf_fd_limit_text(int err, char *buf, size_t size);

#endif
