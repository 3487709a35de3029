/*
 * Shard and object URLs: what kind a URL is, %-decoding and encoding, and the
 * redacted form shown in messages.  The one place that knows URL syntax.
 */
#ifndef SF_ENGINE_URL_H
#define SF_ENGINE_URL_H

#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"

/* What a shard list entry names; the scheme is matched case-sensitively, as written in shard lists. */
typedef enum sf_url_kind {
  SF_URL_PATH,  /* no scheme: a local path */
  SF_URL_FILE,  /* file:// */
  SF_URL_HTTP,  /* http:// or https:// */
  SF_URL_STORE, /* s3://, gs://, az:// or hf:// (engine/object_store.h) */
  SF_URL_PIPE,  /* pipe:COMMAND */
  SF_URL_OTHER, /* another SCHEME:// that nothing here reads */
} sf_url_kind;

/* The kind of url (NULL is a path). */
sf_url_kind sf_url_kind_of(const char *url);

/*
 * The local path a path or file:// URL names (file:///path and file://localhost/path, %XX decoded), malloc'd
 * (the caller frees it); NULL for other URLs, a file URL without an absolute path, or out of memory.
 */
char *sf_url_local_path(const char *url);

/* True for http(s)://. */
bool sf_url_is_http(const char *url);

/* True for s3://, gs://, az:// and hf://. */
bool sf_url_is_store(const char *url);

/* True for what is downloaded over the network: http://, https://, s3://, gs://, az://, hf://. */
bool sf_url_is_remote(const char *url);

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
