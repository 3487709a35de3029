/*
 * The one libcurl set-up: global initialisation, and easy handles with the
 * settings every transfer shares (allowed protocols, redirects, timeouts,
 * TLS verification, user agent), plus a response body kept in memory.
 */
#ifndef SF_ENGINE_HTTP_H
#define SF_ENGINE_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "curl_lib.h"

#include "strbuf.h"

/* What differs between transfers; {0} gives the defaults. */
typedef struct sf_http_options {
  const char *protocols;   /* allowed schemes, libcurl's list syntax; NULL: "http,https" */
  bool follow_redirects;   /* follow up to 10 redirects, to the allowed schemes only */
  long connect_timeout_ms; /* 0: 10 s */
  long timeout_ms;         /* the whole transfer; 0: no limit */
  char *error_text;        /* CURL_ERROR_SIZE bytes for libcurl's own message (emptied here), or NULL */
  const char *ca_file;     /* PEM file of the CAs trusted for https (borrowed; copied by libcurl); NULL or "":
                            * the SSL_CERT_FILE variable, else libcurl's bundle */
} sf_http_options;

/*
 * libcurl opened (curl_lib.h) and its global initialisation, run once per process whoever asks first
 * (thread-safe). Returns 0, or SF_EUNSUPPORTED when libcurl cannot be opened or SF_ENOMEM when it did not
 * initialise, with *why (when why is not NULL; static text) saying which.
 */
int sf_http_init(const char **why);

/*
 * A new easy handle for url (NULL: the caller sets CURLOPT_URL) with the
 * shared settings: no signals, the allowed protocols, the redirect policy,
 * TLS peer and host verification, the timeouts, user agent "shardflow".
 * Returns 0 with *easy (owned: curl_easy_cleanup), SF_ENOMEM, or SF_EINVAL
 * when libcurl refuses an option (libcurl older than 7.85).
 */
int sf_http_easy_new(const char *url, const sf_http_options *options, CURL **easy);

/* Text for a failed transfer: libcurl's message in error_text when it left one, else its code's. */
const char *sf_http_error_text(CURLcode rc, const char *error_text);

/* A response body kept in memory up to max bytes (0: no limit); the rest is read and dropped. */
typedef struct sf_http_body {
  sf_strbuf text;
  size_t max;
  bool too_big; /* bytes past max were dropped */
} sf_http_body;

/* CURLOPT_WRITEFUNCTION for the sf_http_body given as CURLOPT_WRITEDATA; 0 (ending the transfer) when out of memory. */
size_t sf_http_body_write(char *data, size_t size, size_t nmemb, void *body);

#endif
