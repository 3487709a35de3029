/* gs:// credentials: an access token (given, or the metadata server's, cached), or HMAC keys for SigV4. */
#include "store_common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http.h"

/* ---- GCS bearer tokens from the metadata server, cached until a minute before they expire ---- */

static pthread_mutex_t token_lock = PTHREAD_MUTEX_INITIALIZER;
static char *cached_token;
static time_t cached_until;

/* A JSON string member's value (no escapes in tokens), newly allocated, or NULL. */
static char *json_member(const char *json, const char *name) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\"", name);
  const char *p = strstr(json, pattern);
  if (!p) return NULL;
  p = strchr(p + strlen(pattern), '"');
  if (!p) return NULL;
  const char *e = strchr(p + 1, '"');
  return e ? strndup(p + 1, (size_t)(e - p - 1)) : NULL;
}

static int metadata_token(sf_store *s, const char *url, sf_error *error) {
  const char *host = sf_store_env("GCE_METADATA_HOST");
  if (!host) host = "metadata.google.internal";
  pthread_mutex_lock(&token_lock);
  time_t now = time(NULL);
  if (cached_token && now < cached_until) {
    s->bearer = strdup(cached_token);
    pthread_mutex_unlock(&token_lock);
    return s->bearer ? 0 : sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  char endpoint[512];
  snprintf(endpoint, sizeof endpoint, "http://%s/computeMetadata/v1/instance/service-accounts/default/token", host);
  /* Plain http, quickly: the metadata server is link-local, and off Google Cloud there is none to wait for. */
  sf_http_options o = {.protocols = "http", .connect_timeout_ms = 2000, .timeout_ms = 5000};
  CURL *e = NULL;
  struct curl_slist *h = curl_slist_append(NULL, "Metadata-Flavor: Google");
  sf_http_body b = {.max = SF_STORE_MAX_RESPONSE};
  long status = 0;
  CURLcode rc = CURLE_OUT_OF_MEMORY;
  if (h && sf_http_easy_new(endpoint, &o, &e) == 0) {
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sf_http_body_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  }
  curl_easy_cleanup(e);
  curl_slist_free_all(h);
  const char *json = b.text.data;
  char *token = rc == CURLE_OK && status == 200 && json ? json_member(json, "access_token") : NULL;
  long expires = 0;
  const char *x = json ? strstr(json, "\"expires_in\"") : NULL;
  if (x && (x = strchr(x, ':'))) expires = strtol(x + 1, NULL, 10);
  sf_store_free_secret(b.text.data);
  int r = 0;
  if (!token) {
    r = sf_error_set(
        error, SF_EDENIED, SF_AT(.url = url),
        "no Google Cloud credentials: set GOOGLE_OAUTH_ACCESS_TOKEN (e.g. $(gcloud auth print-access-token)), or "
        "GS_ACCESS_KEY_ID and GS_SECRET_ACCESS_KEY (HMAC keys), or run on Google Cloud where the metadata server "
        "(%.100s, GCE_METADATA_HOST) gives one — it answered %s %ld",
        host, rc == CURLE_OK ? "HTTP" : curl_easy_strerror(rc), status);
  } else {
    sf_store_free_secret(cached_token);
    cached_token = strdup(token);
    cached_until = now + (expires > 120 ? expires - 60 : 60);
    s->bearer = token;
    if (asprintf(&s->credentials, "an access token from the metadata server %s", host) < 0) s->credentials = NULL;
    if (!cached_token || !s->credentials) r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  pthread_mutex_unlock(&token_lock);
  return r;
}

int sf_store_gcs_config(sf_store *s, const char *url, sf_error *error) {
  const char *variable = "SF_GCS_ENDPOINT";
  const char *endpoint = sf_store_env(variable);
  if (!endpoint) endpoint = sf_store_env(variable = "STORAGE_EMULATOR_HOST");
  int r = sf_store_set_endpoint(s, endpoint ? endpoint : "https://storage.googleapis.com", variable, url, error);
  if (r) return r;
  s->virtual_host = false;
  const char *token = sf_store_env("GOOGLE_OAUTH_ACCESS_TOKEN");
  const char *id = sf_store_env("GS_ACCESS_KEY_ID"), *secret = sf_store_env("GS_SECRET_ACCESS_KEY");
  if (token) {
    s->bearer = strdup(token);
    s->credentials = strdup("the access token in GOOGLE_OAUTH_ACCESS_TOKEN");
    if (!s->bearer || !s->credentials) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
    return 0;
  }
  if (id && secret) {
    /* GCS's XML API takes AWS4-HMAC-SHA256 with HMAC keys; its region is "auto". */
    const char *region = sf_store_env("GS_REGION");
    s->region = strdup(region ? region : "auto");
    s->access_key_id = strdup(id);
    s->secret = strdup(secret);
    if (asprintf(&s->credentials, "HMAC access key id %s from GS_ACCESS_KEY_ID (secret from GS_SECRET_ACCESS_KEY)",
                 id) < 0)
      s->credentials = NULL;
    if (!s->region || !s->access_key_id || !s->secret || !s->credentials)
      return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
    return 0;
  }
  return metadata_token(s, url, error);
}
