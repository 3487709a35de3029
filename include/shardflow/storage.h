/* shardflow object storage: copying files (checkpoints, shards) to and from the URLs shards come from. */
#ifndef SHARDFLOW_STORAGE_H
#define SHARDFLOW_STORAGE_H

#include <stdbool.h>

#include "shardflow/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Copies src to dst, where each is a local path or an http(s):// URL (s3://
 * and gs:// come with their own signers).  The copy appears atomically: no
 * half-written object is ever visible under dst's name.
 *  - upload (local -> http): HTTP PUT to a temporary name next to dst, then a
 *    WebDAV MOVE (RFC 4918) onto dst; with verify, dst is read back and its
 *    length and CRC-32 compared with the local file's;
 *  - download (http -> local): GET into a temporary file in dst's directory,
 *    length checked against Content-Length, fsync, rename(2) onto dst;
 *  - local -> local: the same temporary file and rename.
 * Returns 0; SF_ENOENT (missing source, HTTP 404), SF_ENET (HTTP errors, e.g.
 * a server without WebDAV PUT/MOVE), SF_EIO (local files), SF_EFORMAT (the
 * read-back or the length did not match: the copy is removed), SF_EINVAL (two
 * URLs, or a scheme other than a path and http(s)).  *error names the URL
 * and says what to do.
 */
SF_API int sf_storage_copy(const char *src, const char *dst, bool verify, sf_error *error);

#ifdef __cplusplus
}
#endif
#endif
