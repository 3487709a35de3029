/* Filesystem helpers shared by the stages and the CLI. */
#ifndef SF_ENGINE_FILES_H
#define SF_ENGINE_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

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

/*
 * Fills buf with size bytes from the kernel's random source (getrandom(2)): for names another user
 * must not guess, not for reproducible streams (those come from sf_rng). Returns 0 or -errno.
 */
int sf_random_bytes(void *buf, size_t size);

/*
 * Writes prefix followed by 16 random hex digits into out[size], a name no other process can
 * predict. Returns 0, -ENAMETOOLONG when it does not fit, or the random source's -errno.
 */
int sf_unique_name(const char *prefix, char *out, size_t size);

/*
 * Creates a new file named prefix + 16 random hex digits (its path written into path[size]) with
 * O_CREAT | O_EXCL | O_NOFOLLOW: nothing already there is opened, followed or truncated (a symlink
 * another local user planted in a shared directory such as /tmp stays as it was), and a name that
 * exists is replaced by a fresh one. mode is the permission before umask (0600 for private staging
 * files). Returns the descriptor (read-write, close-on-exec; the caller closes it and removes or
 * renames the file), or -errno (-ENAMETOOLONG when the name does not fit).
 */
int sf_file_create_unique(const char *prefix, char *path, size_t size, mode_t mode);

/*
 * The name of a partial copy of path, next to it (so that renaming it onto path is atomic):
 * PATH.partial-HOST-PID-RANDOM (host and pid let sf_remove_stale_partials tell a dead process's
 * leftovers from a live one's, also on shared storage). Returns 0 or as sf_unique_name.
 */
int sf_partial_name(const char *path, char *out, size_t size);

/*
 * Creates the partial file of a write to path as sf_file_create_unique does, at an sf_partial_name,
 * making path's directory when missing. Returns the descriptor (its name in tmp[size]; the caller
 * renames it onto path or removes it) or -errno.
 */
int sf_file_create_partial(const char *path, char *tmp, size_t size, mode_t mode);

/*
 * Removes the partial files (sf_partial_name) next to path that processes of this host that are gone
 * left there (killed copies), as sf_remove_stale_files does. Returns how many were removed.
 */
int sf_remove_stale_partials(const char *path);

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
