/*
 * Shard and object URLs: what kind a URL is, %-decoding and encoding, and the
 * redacted form shown in messages.  The one place that knows URL syntax.
 */
#ifndef SF_ENGINE_URL_H
#define SF_ENGINE_URL_H

#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"
#include "shardflow/shard_io.h"

/* sf_url_kind, sf_url_kind_of, sf_url_local_path and sf_url_is_remote are public (shardflow/shard_io.h). */

/* True for http(s)://. */
bool sf_url_is_http(const char *url);

/* True for s3://, gs://, az:// and hf://. */
bool sf_url_is_store(const char *url);

/*
 * Length of url's scheme when it starts with SCHEME:// (RFC 3986: a letter,
 * then letters, digits, '+', '-', '.'), else 0.
 */
size_t sf_url_scheme_length(const char *url);

/*
 * Decodes the %XX escapes (either case) of s[0, n) into out, which holds at
 * least n + 1 bytes and may be s itself (decoding in place); a '%' not
 * followed by two hex digits stays as it is.  With plus_is_space a '+'
 * becomes ' ' (form encoding, as S3 listings use it).  Returns the decoded
 * length; out is NUL-terminated.
 */
size_t sf_url_decode(char *out, const char *s, size_t n, bool plus_is_space);

/*
 * Appends s[0, n) to out %-encoded by RFC 3986's rules, which are also
 * AWS's for SigV4: A-Z a-z 0-9 - . _ ~ stay, '/' stays when keep_slash, every
 * other byte becomes %XX (upper-case hex; UTF-8 bytes one by one; a space is
 * %20, never '+').  Returns 0, or SF_ENOMEM (out is then failed).
 */
int sf_url_encode(sf_strbuf *out, const char *s, size_t n, bool keep_slash);

/*
 * Writes url into out (size bytes, always NUL-terminated, cut if longer) for
 * messages and logs: the user information (user:password@) and the values of
 * query parameters whose names hold signature, token, credential, secret or
 * password replaced by "***".
 */
void sf_url_redact(const char *url, char *out, size_t size);

#endif
