/*
 * Object stores named by URL: s3://BUCKET/KEY (AWS Signature Version 4),
 * gs://BUCKET/KEY (Google Cloud Storage's XML API with an OAuth bearer token,
 * or HMAC keys with SigV4), az://ACCOUNT/CONTAINER/BLOB (Azure Blob Storage:
 * Shared Key, or a SAS token) and hf://datasets/ORG/NAME[@REVISION]/PATH (the
 * Hugging Face Hub's resolve URLs, read-only, with a bearer token).  Turns such a URL into an http(s) request that
 * libcurl can send.  Contract header: engine/store/object_store.c implements it,
 * with one file per store and object_list.c for listings (store_common.h lists them).
 */
#ifndef SF_ENGINE_OBJECT_STORE_H
#define SF_ENGINE_OBJECT_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include "curl_lib.h"

#include "shardflow/error.h"

/* A request ready for libcurl: the URL and the headers that sign it. */
typedef struct sf_object_request {
  char *url;                   /* http(s) URL (owned) */
  struct curl_slist *headers;  /* Host-independent headers: Authorization, x-amz-date, ... (owned) */
  char *credentials;           /* where the credentials came from, for messages: "AWS_ACCESS_KEY_ID=AKIA... from
                                  the environment" (never a secret; owned; NULL when unsigned) */
  bool follow_redirects;       /* the store answers with redirects to follow (hf://: to its CDN); libcurl sends the
                                  Authorization header to the first host only */
} sf_object_request;

/*
 * Prepares method (GET, HEAD, PUT, POST, DELETE) on url (s3://, gs://, az://, hf://: sf_url_is_store())
 * with query (raw "k=v&k2" or NULL) and the payload's SHA-256 in hex (NULL:
 * UNSIGNED-PAYLOAD).  Headers a caller adds afterwards (Range, If-Match) are
 * not signed and need not be.  Call again for every attempt (signatures
 * carry the time).  Returns 0; SF_EINVAL (bad URL), SF_EDENIED (no
 * credentials found: the message lists where they are looked for).  Secrets
 * never appear in *error.
 */
int sf_object_request_prepare(const char *url, const char *method, const char *query,
                              const char *payload_sha256, sf_object_request *request, sf_error *error);

/*
 * sf_object_request_prepare with the request's body size in bytes (0: none)
 * and headers, a NULL-terminated list of "Name: value" lines (Range,
 * If-Match, If-None-Match, x-ms-blob-type, ...; NULL for none), which are
 * added to request->headers and signed where the store's scheme signs them:
 * Azure's Shared Key signs the body size, Range, the If-* conditions and
 * every x-ms-* header, so an az:// request must carry all of them here.
 * hf:// is read-only: other methods than GET and HEAD give SF_EUNSUPPORTED.
 * Same returns as above.
 */
int sf_object_request_prepare_headers(const char *url, const char *method, const char *query,
                                      const char *payload_sha256, long long body_size, const char *const *headers,
                                      sf_object_request *request, sf_error *error);

/* Frees the URL and headers; zeroes *request. */
void sf_object_request_clear(sf_object_request *request);

/*
 * sf_object_request_prepare at a given time (seconds since the epoch, UTC),
 * for tests that compare signatures with a reference.  When canonical is not
 * NULL it receives the SigV4 canonical request (newly allocated, caller
 * frees; NULL for bearer-token requests).  Same returns as above.
 */
int sf_object_request_prepare_at(const char *url, const char *method, const char *query, const char *payload_sha256,
                                 long long now, sf_object_request *request, char **canonical, sf_error *error);

/*
 * Turns an HTTP failure of a store request into an error record about url
 * (the s3:// or gs:// URL): the status, the store's own error code and
 * message from the XML body (body[0, size) may be NULL), and what to do —
 * for 403 SignatureDoesNotMatch / InvalidAccessKeyId, which credentials were
 * used (request->credentials) and which variable holds the secret; for 401,
 * which token source was used.  what says what was being done ("download").
 * Returns the code set: SF_ENOENT (404), SF_EDENIED (401, 403), SF_ENET.
 */
int sf_object_http_error(const char *url, const char *what, long status, const char *body, size_t size,
                         const sf_object_request *request, sf_error *error);

/*
 * A whole request to a store, body in memory: sends method to url with query,
 * headers (as sf_object_request_prepare_headers takes them; NULL for none)
 * and body[0, body_size) (signed with its SHA-256), follows no redirects
 * (but hf://'s),
 * and keeps the response body (at most 16 MiB) in *response and the ETag
 * header in *etag (both newly allocated, caller frees; either pointer may be
 * NULL when not wanted).  *status gets the HTTP status.
 * Returns 0 for 2xx; otherwise an error from sf_object_http_error, SF_ENET
 * (connection failed: the message names the endpoint), SF_EINVAL,
 * SF_EDENIED (no credentials), SF_ENOMEM.
 */
int sf_object_call(const char *url, const char *method, const char *query, const char *const *headers,
                   const void *body, size_t body_size, long *status, char **response, size_t *response_size,
                   char **etag, sf_error *error);

/*
 * Lists the objects under url, a prefix "s3://bucket/dir/" or "gs://bucket/dir/"
 * (ListObjectsV2 with continuation tokens; for gs:// the XML API's
 * list-type=2, which GCS serves with the same protocol), "az://account/container/dir/"
 * (List Blobs with markers) or "hf://datasets/org/name/dir/" (the Hub's tree
 * API, recursive, following its Link pages; files only).  Keys are asked
 * with encoding-type=url and decoded.  *urls receives count newly allocated
 * "s3://bucket/key" strings in the store's order (lexicographic by key), in
 * one allocated array; the caller frees each and the array.
 * Returns 0 (count may be 0); errors as sf_object_call, SF_EFORMAT for a
 * listing that is not the expected XML.
 */
int sf_object_list(const char *url, char ***urls, size_t *count, sf_error *error);

/*
 * The text of the element called name directly under the root element of
 * the XML answer body[0, size) ("UploadId" of an InitiateMultipartUploadResult,
 * "Code" of an Error), its entities decoded, newly allocated (the caller
 * frees), or NULL when there is none, the body is not XML or out of memory.
 * When root is not NULL the root element must be called so.  A body cut
 * short is read as far as it goes.
 */
char *sf_object_xml_text(const char *body, size_t size, const char *root, const char *name);

/*
 * Multipart-upload part size in bytes: SF_OBJECT_PART_SIZE (bytes, or with
 * a K/M/G suffix) when set, else 16 MiB.  Files up to this size go up in
 * one PUT.  S3 itself refuses parts under 5 MiB except the last; smaller
 * values are for tests against local servers.
 */
long long sf_object_part_size(void);

#endif
