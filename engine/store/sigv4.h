/*
 * AWS Signature Version 4 (header form, AWS4-HMAC-SHA256) for S3 and for
 * GCS's XML API with HMAC keys.  Pure functions over strings: no I/O, no
 * clock (the caller passes the time), so the signer can be checked against
 * botocore with a fixed date.  HMAC-SHA256 and SHA-256 come from libcrypto.
 */
#ifndef SF_ENGINE_SIGV4_H
#define SF_ENGINE_SIGV4_H

#include <stdbool.h>
#include <stddef.h>

/* The SHA-256 of the empty string, in hex (GET, HEAD, DELETE bodies). */
#define SF_SIGV4_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* What one request is signed with. Every string is borrowed for the call. */
typedef struct sf_sigv4_request {
  const char *method;         /* "GET", "PUT", ... */
  const char *host;           /* Host header as libcurl sends it: "bucket.s3.us-east-1.amazonaws.com", "127.0.0.1:4568" */
  const char *encoded_path;   /* path as it goes on the wire, already URI-encoded ("/b/a%20b.tar") */
  const char *query;          /* query as it goes on the wire ("list-type=2&prefix=a%20b"), or NULL/"" */
  const char *payload_sha256; /* hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" */
  const char *amz_date;       /* "YYYYMMDDTHHMMSSZ" (UTC) */
  const char *region;         /* "us-east-1"; "auto" for GCS */
  const char *service;        /* "s3" */
  const char *access_key_id;
  const char *secret_access_key;
  const char *session_token;  /* or NULL: then x-amz-security-token is neither sent nor signed */
} sf_sigv4_request;

/*
 * Builds the canonical request of r (method, path, canonical query string
 * sorted by encoded name then value, the canonical headers host,
 * x-amz-content-sha256, x-amz-date and x-amz-security-token when a session
 * token is set, the signed header list and the payload hash) into a newly
 * allocated string in *canonical, and the Authorization header's value into
 * a newly allocated string in *authorization.  Query names and values are
 * percent-decoded then re-encoded by sf_url_encode's rules (engine/core/url.h), so "a b",
 * "a%20b" and "a%20b" all canonicalise alike; '+' is a literal plus.
 * Either output may be NULL when not wanted; the caller frees both.
 * Returns 0, or -1 when out of memory (outputs set to NULL).
 */
int sf_sigv4_sign(const sf_sigv4_request *r, char **canonical, char **authorization);

/*
 * Returns query (raw "k=v&k2" or already encoded) with every name and value
 * percent-decoded and re-encoded by sf_url_encode's rules, in the
 * original order, as a newly allocated string the caller frees ("" for
 * NULL).  Send this form on the wire: it is what sf_sigv4_sign signs.
 * Returns NULL when out of memory.
 */
char *sf_sigv4_query_normalize(const char *query);

/*
 * Hex SHA-256 of data[0, n) into hex (65 bytes with the NUL).
 */
void sf_sigv4_sha256_hex(const void *data, size_t n, char hex[65]);

#endif
