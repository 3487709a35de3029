/* shardflow object storage: copying files (checkpoints, shards) to and from the URLs shards come from. */
#ifndef SHARDFLOW_STORAGE_H
#define SHARDFLOW_STORAGE_H

#include <stdbool.h>

#include "shardflow/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Copies src to dst, where each is a local path or an http(s)://, s3:// or
 * gs:// URL (at most one URL).  The copy appears atomically: no
 * half-written object is ever visible under dst's name.
 *  - upload (local -> http): HTTP PUT to a temporary name next to dst, then a
 *    WebDAV MOVE (RFC 4918) onto dst; with verify, dst is read back and its
 *    length and CRC-32 compared with the local file's;
 *  - download (http -> local): GET into a temporary file in dst's directory,
 *    length checked against Content-Length, fsync, rename(2) onto dst;
 *  - upload to s3:// or gs:// (credentials as for reading shards: docs/storage.md,
 *    "Object storage"): one signed PUT, or a multipart upload in parts of
 *    SF_OBJECT_PART_SIZE bytes (default 16 MiB) for larger files, aborted on
 *    failure; the object appears when the PUT or the upload completes; with
 *    verify it is read back and compared like the http case;
 *  - download from s3:// or gs://: a signed GET, then as for http;
 *  - local -> local: the same temporary file and rename.
 * Returns 0; SF_ENOENT (missing source, HTTP 404), SF_ENET (HTTP errors, e.g.
 * a server without WebDAV PUT/MOVE), SF_EIO (local files), SF_EFORMAT (the
 * read-back or the length did not match: the copy is removed), SF_EINVAL (two
 * URLs, or another scheme), SF_EDENIED (no credentials, or the store refused
 * them: the message says which were used, never the secret).  *error names the URL
 * and says what to do.
 */
SF_API int sf_storage_copy(const char *src, const char *dst, bool verify, sf_error *error);

/**
 * Creates the local directory path and its missing parents (mkdir -p; mode 0777 before umask), as a
 * sink does before writing files under a directory a graph names. Directories already there are fine.
 * Returns 0, or SF_EIO with *error naming the directory that could not be made and the system's words
 * (permission denied, a file in the way, a name too long). path is borrowed.
 */
SF_API int sf_dir_create(const char *path, sf_error *error);

#ifdef __cplusplus
}
#endif
#endif
