/*
 * Object stores named by URL: s3://BUCKET/KEY (AWS Signature Version 4) and
 * gs://BUCKET/KEY (Google Cloud Storage's XML API with an OAuth bearer token,
 * or HMAC keys with SigV4).  Turns such a URL into an http(s) request that
 * libcurl can send.  Contract header: engine/object_store.c implements it
 * (the helper owning it adds listings and uploads below).
 */
#ifndef SF_ENGINE_OBJECT_STORE_H
#define SF_ENGINE_OBJECT_STORE_H

#include <stdbool.h>

#include <curl/curl.h>

#include "shardflow/error.h"

/* A request ready for libcurl: the URL and the headers that sign it. */
typedef struct sf_object_request {
  char *url;                   /* http(s) URL (owned) */
  struct curl_slist *headers;  /* Host-independent headers: Authorization, x-amz-date, ... (owned) */
} sf_object_request;

/* True for s3:// and gs:// URLs. */
bool sf_object_url_is_store(const char *url);

/*
 * Prepares method (GET, HEAD, PUT, POST, DELETE) on url (s3:// or gs://)
 * with query (raw "k=v&k2" or NULL) and the payload's SHA-256 in hex (NULL:
 * UNSIGNED-PAYLOAD).  Headers a caller adds afterwards (Range, If-Match) are
 * not signed and need not be.  Call again for every attempt (signatures
 * carry the time).  Returns 0; SF_EINVAL (bad URL), SF_EDENIED (no
 * credentials found: the message lists where they are looked for).  Secrets
 * never appear in *error.
 */
int sf_object_request_prepare(const char *url, const char *method, const char *query,
                              const char *payload_sha256, sf_object_request *request, sf_error *error);

/* Frees the URL and headers; zeroes *request. */
void sf_object_request_clear(sf_object_request *request);

#endif
