/*
 * Reading key files: what the key files (engine/group/transport_keys.c) and the
 * allow-list (engine/group/transport_zap.c) share.  The public key-file calls,
 * sf_curve_keygen() and sf_curve_key_load(), are in engine/group/transport.h.
 */
#ifndef SF_ENGINE_TRANSPORT_KEYS_H
#define SF_ENGINE_TRANSPORT_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/stat.h>

#include "shardflow/error.h"

/* Decodes a Z85 CURVE key of exactly SF_CURVE_KEY_Z85_LEN characters into out. Returns false if it is not one. */
bool sf_curve_key_decode(const char *z85, uint8_t out[32]);

/*
 * One line of a key file or an allow-list: blank, a comment (# first) or a
 * section header ("curve", "metadata"): true with *value NULL; a bare token
 * of 40 characters (a Z85 key; Z85 itself has '#' and '=') or
 * `name = "value"`: true with *value (and *name) set, pointing into line.
 * Anything else: false.  Modifies line.
 */
bool sf_key_line_parse(char *line, char **name, char **value);

/*
 * Reads a whole (small) regular file from an open fd, at most limit bytes.
 * Returns 0 with *text NUL-terminated (the caller frees it), or SF_EIO (not
 * a regular file, read error), SF_EFORMAT (larger than limit), SF_ENOMEM;
 * *error names path.
 */
int sf_key_file_read(int fd, const char *path, size_t limit, char **text, sf_error *error);

/*
 * Refuses what others could change, as OpenSSH's StrictModes refuses an
 * authorized_keys: path (st its stat) owned by a user other than this
 * process's effective user and root, or writable by group or others (on a
 * read-only mount nothing is writable; a directory with the sticky bit is
 * excepted when sticky_ok: others cannot replace what is ours in it). what
 * names it in the message ("the allow-list").
 * Returns 0, or SF_EDENIED with *error naming path, the owner or mode, and
 * the command that fixes it.
 */
int sf_key_path_check(const char *path, const struct stat *st, const char *what, bool sticky_ok, sf_error *error);

#endif
