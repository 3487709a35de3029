/*
 * s3://, gs://, az:// and hf:// URLs as signed http(s) requests: credentials, regions, endpoints, addressing,
 * listings.
 */
#include "object_store.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <openssl/crypto.h>

#include <jansson.h>

#include "http.h"
#include "sharedkey.h"
#include "sigv4.h"
#include "strbuf.h"
#include "url.h"

enum { MAX_RESPONSE = 16 << 20 };

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* Wipes and frees a string that held a secret. */
static void free_secret(char *s) {
  if (!s) return;
  OPENSSL_cleanse(s, strlen(s));
  free(s);
}

/* ---- ~/.aws/credentials and ~/.aws/config ---- */

/* Path of an AWS file: the variable's value, else ~/.aws/NAME, into out. */
static void aws_file(const char *variable, const char *name, char *out, size_t size) {
  const char *v = env(variable);
  const char *home = env("HOME");
  if (v) snprintf(out, size, "%s", v);
  else snprintf(out, size, "%s/.aws/%s", home ? home : ".", name);
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

/*
 * The value of key in section of an INI file, newly allocated, or NULL.
 * In ~/.aws/config a profile's section is "[profile NAME]" (but "[default]").
 */
static char *ini_value(const char *path, const char *section, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char line[4096];
  bool in = false;
  char *value = NULL;
  while (!value && fgets(line, sizeof line, f)) {
    char *s = trim(line);
    if (*s == '#' || *s == ';' || !*s) continue;
    if (*s == '[') {
      char *end = strchr(s, ']');
      if (end) *end = '\0';
      in = strcmp(trim(s + 1), section) == 0;
      continue;
    }
    char *eq = strchr(s, '=');
    if (!in || !eq) continue;
    *eq = '\0';
    if (strcmp(trim(s), key) == 0) value = strdup(trim(eq + 1));
  }
  OPENSSL_cleanse(line, sizeof line);
  fclose(f);
  return value;
}

/* ---- configuration of one request ---- */

typedef enum store_kind { STORE_S3, STORE_GS, STORE_AZ, STORE_HF } store_kind;

typedef struct store {
  store_kind kind;
  bool gs;
  char *bucket;       /* az://: the container; hf://: "datasets/ORG/NAME" */
  char *key;          /* may be ""; az://: the blob; hf://: the path in the repository */
  char *account;      /* az://: the storage account */
  char *sas;          /* az://: a SAS token (query string without '?') */
  char *account_key;  /* az://: the account key (base64) for Shared Key */
  char *revision;     /* hf://: branch, tag or commit ("main") */
  /* endpoint */
  char *scheme;       /* "https" */
  char *host;         /* authority as sent in Host: "s3.us-east-1.amazonaws.com", "127.0.0.1:4568" */
  char *base_path;    /* endpoint path without trailing '/', usually "" */
  bool virtual_host;  /* bucket.host/key rather than host/bucket/key */
  /* SigV4 */
  char *region;
  char *access_key_id;
  char *secret;
  char *session_token;
  /* or a bearer token (gs://) */
  char *bearer;
  char *credentials;  /* description for messages */
} store;

static void store_clear(store *s) {
  free(s->bucket);
  free(s->key);
  free(s->account);
  free_secret(s->sas);
  free_secret(s->account_key);
  free(s->revision);
  free(s->scheme);
  free(s->host);
  free(s->base_path);
  free(s->region);
  free(s->access_key_id);
  free_secret(s->secret);
  free_secret(s->session_token);
  free_secret(s->bearer);
  free(s->credentials);
  memset(s, 0, sizeof *s);
}

/* Splits "scheme://authority/path" (or "authority" alone: http) into the store's endpoint. */
static int set_endpoint(store *s, const char *endpoint, const char *variable, const char *url, sf_error *error) {
  size_t scheme = sf_url_scheme_length(endpoint);
  const char *authority = scheme ? endpoint + scheme + 3 : endpoint;
  s->scheme = scheme ? strndup(endpoint, scheme) : strdup("http");
  size_t n = strcspn(authority, "/?#");
  s->host = strndup(authority, n);
  const char *path = authority + n;
  size_t plen = strcspn(path, "?#");
  while (plen > 0 && path[plen - 1] == '/') plen--;
  s->base_path = strndup(path, plen);
  if (!s->scheme || !s->host || !s->base_path)
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  for (char *c = s->scheme; *c; c++) *c = (char)tolower((unsigned char)*c);
  for (char *c = s->host; *c; c++) *c = (char)tolower((unsigned char)*c);
  if ((strcmp(s->scheme, "http") != 0 && strcmp(s->scheme, "https") != 0) || !*s->host)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url),
                        "%s=\"%s\" is not an http(s)://HOST[:PORT] endpoint; fix the variable", variable, endpoint);
  return 0;
}

static bool dns_compatible(const char *bucket) {
  size_t n = strlen(bucket);
  if (n < 3 || n > 63) return false;
  for (const char *c = bucket; *c; c++)
    if (!(islower((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '-')) return false; /* dots break TLS */
  return true;
}

static int parse_az_url(store *s, const char *url, sf_error *error);
static int parse_hf_url(store *s, const char *url, sf_error *error);

/* Parses scheme://bucket/key (az://account/container/blob, hf://datasets/org/name[@revision]/path). */
static int parse_url(store *s, const char *url, sf_error *error) {
  if (!sf_url_is_store(url))
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "not an s3://, gs://, az:// or hf:// URL");
  if (url[0] == 'a') return parse_az_url(s, url, error);
  if (url[0] == 'h') return parse_hf_url(s, url, error);
  s->gs = url[0] == 'g';
  s->kind = s->gs ? STORE_GS : STORE_S3;
  const char *b = url + 5;
  size_t n = strcspn(b, "/");
  if (n == 0)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "no bucket name: write %s://BUCKET/KEY",
                        s->gs ? "gs" : "s3");
  for (size_t i = 0; i < n; i++)
    if (!(isalnum((unsigned char)b[i]) || b[i] == '-' || b[i] == '.' || b[i] == '_'))
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = url),
                          "bucket name \"%.*s\" has a character buckets cannot have ('%c')", (int)n, b, b[i]);
  s->bucket = strndup(b, n);
  s->key = strdup(b[n] ? b + n + 1 : "");
  if (!s->bucket || !s->key) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  return 0;
}

static int s3_config(store *s, const char *url, sf_error *error) {
  const char *profile = env("AWS_PROFILE");
  if (!profile) profile = "default";
  char credentials_path[1024], config_path[1024];
  aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", credentials_path, sizeof credentials_path);
  aws_file("AWS_CONFIG_FILE", "config", config_path, sizeof config_path);
  char config_section[300];
  snprintf(config_section, sizeof config_section, strcmp(profile, "default") ? "profile %s" : "%s", profile);

  /* Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's region in ~/.aws/config, us-east-1. */
  const char *region = env("AWS_REGION");
  if (!region) region = env("AWS_DEFAULT_REGION");
  s->region = region ? strdup(region) : ini_value(config_path, config_section, "region");
  if (!s->region) s->region = strdup("us-east-1");

  /* Credentials: the environment, else the profile in the shared credentials file. */
  const char *id = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
  if (id && secret) {
    s->access_key_id = strdup(id);
    s->secret = strdup(secret);
    const char *token = env("AWS_SESSION_TOKEN");
    s->session_token = token ? strdup(token) : NULL;
    if (asprintf(&s->credentials, "access key id %s from AWS_ACCESS_KEY_ID (secret from AWS_SECRET_ACCESS_KEY%s)", id,
                 token ? ", session token from AWS_SESSION_TOKEN" : "") < 0)
      s->credentials = NULL;
  } else {
    s->access_key_id = ini_value(credentials_path, profile, "aws_access_key_id");
    s->secret = ini_value(credentials_path, profile, "aws_secret_access_key");
    s->session_token = ini_value(credentials_path, profile, "aws_session_token");
    if (!s->access_key_id || !s->secret)
      return sf_error_set(
          error, SF_EDENIED, SF_AT(.url = url),
          "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
          "temporary ones), or put aws_access_key_id/aws_secret_access_key under [%.100s] in %.300s "
          "(AWS_PROFILE picks the profile, AWS_SHARED_CREDENTIALS_FILE the file)",
          profile, credentials_path);
    if (asprintf(&s->credentials, "access key id %s from profile [%s] in %s", s->access_key_id, profile,
                 credentials_path) < 0)
      s->credentials = NULL;
  }
  if (!s->region || !s->access_key_id || !s->secret || !s->credentials)
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");

  /* Endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL (path-style), else AWS's own (virtual-host style). */
  const char *variable = "AWS_ENDPOINT_URL_S3";
  const char *endpoint = env(variable);
  if (!endpoint) endpoint = env(variable = "AWS_ENDPOINT_URL");
  int r;
  if (endpoint) {
    r = set_endpoint(s, endpoint, variable, url, error);
  } else {
    char aws[300];
    snprintf(aws, sizeof aws, "https://s3.%s.amazonaws.com", s->region);
    r = set_endpoint(s, aws, "AWS_REGION", url, error);
  }
  if (r) return r;
  const char *style = env("AWS_S3_ADDRESSING_STYLE");
  if (style && strcasecmp(style, "path") == 0) s->virtual_host = false;
  else if (style && strcasecmp(style, "virtual") == 0) s->virtual_host = true;
  else if (style && strcasecmp(style, "auto") != 0)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url),
                        "AWS_S3_ADDRESSING_STYLE=\"%.40s\": use path, virtual or auto", style);
  else s->virtual_host = !endpoint && dns_compatible(s->bucket);
  return 0;
}

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

static int metadata_token(store *s, const char *url, sf_error *error) {
  const char *host = env("GCE_METADATA_HOST");
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
  sf_http_body b = {.max = MAX_RESPONSE};
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
  free_secret(b.text.data);
  int r = 0;
  if (!token) {
    r = sf_error_set(
        error, SF_EDENIED, SF_AT(.url = url),
        "no Google Cloud credentials: set GOOGLE_OAUTH_ACCESS_TOKEN (e.g. $(gcloud auth print-access-token)), or "
        "GS_ACCESS_KEY_ID and GS_SECRET_ACCESS_KEY (HMAC keys), or run on Google Cloud where the metadata server "
        "(%.100s, GCE_METADATA_HOST) gives one — it answered %s %ld",
        host, rc == CURLE_OK ? "HTTP" : curl_easy_strerror(rc), status);
  } else {
    free_secret(cached_token);
    cached_token = strdup(token);
    cached_until = now + (expires > 120 ? expires - 60 : 60);
    s->bearer = token;
    if (asprintf(&s->credentials, "an access token from the metadata server %s", host) < 0) s->credentials = NULL;
    if (!cached_token || !s->credentials) r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  pthread_mutex_unlock(&token_lock);
  return r;
}

static int gs_config(store *s, const char *url, sf_error *error) {
  const char *variable = "SF_GCS_ENDPOINT";
  const char *endpoint = env(variable);
  if (!endpoint) endpoint = env(variable = "STORAGE_EMULATOR_HOST");
  int r = set_endpoint(s, endpoint ? endpoint : "https://storage.googleapis.com", variable, url, error);
  if (r) return r;
  s->virtual_host = false;
  const char *token = env("GOOGLE_OAUTH_ACCESS_TOKEN");
  const char *id = env("GS_ACCESS_KEY_ID"), *secret = env("GS_SECRET_ACCESS_KEY");
  if (token) {
    s->bearer = strdup(token);
    s->credentials = strdup("the access token in GOOGLE_OAUTH_ACCESS_TOKEN");
    if (!s->bearer || !s->credentials) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
    return 0;
  }
  if (id && secret) {
    /* GCS's XML API takes AWS4-HMAC-SHA256 with HMAC keys; its region is "auto". */
    const char *region = env("GS_REGION");
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

/* ---- requests ---- */

void sf_object_request_clear(sf_object_request *request) {
  if (!request) return;
  free(request->url);
  /* The list holds the Authorization header (a signature, or a bearer token): wipe it. */
  for (struct curl_slist *h = request->headers; h; h = h->next) OPENSSL_cleanse(h->data, strlen(h->data));
  curl_slist_free_all(request->headers);
  free(request->credentials);
  memset(request, 0, sizeof *request);
}

static bool add_header(struct curl_slist **list, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool add_header(struct curl_slist **list, const char *fmt, ...) {
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof line) return false;
  struct curl_slist *l = curl_slist_append(*list, line);
  OPENSSL_cleanse(line, sizeof line);
  if (!l) return false;
  *list = l;
  return true;
}

/* ---- az://ACCOUNT/CONTAINER/BLOB: Azure Blob Storage (Shared Key, SAS tokens, or anonymous) ---- */

/* The REST API version asked for: one every Azure region and Azurite 3.x serve. */
#define AZ_VERSION "2021-08-06"

static int parse_az_url(store *s, const char *url, sf_error *error) {
  s->kind = STORE_AZ;
  const char *a = url + 5;
  const char *query = strchr(a, '?'); /* a SAS token given with the URL */
  size_t end = query ? (size_t)(query - a) : strlen(a);
  size_t n = strcspn(a, "/");
  if (n > end) n = end;
  if (n == 0 || a[n] != '/')
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "write az://ACCOUNT/CONTAINER/BLOB");
  for (size_t i = 0; i < n; i++)
    if (!(islower((unsigned char)a[i]) || isdigit((unsigned char)a[i])))
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = url),
                          "storage account name \"%.*s\" may hold only lower-case letters and digits", (int)n, a);
  const char *c = a + n + 1;
  size_t cn = strcspn(c, "/?");
  if (cn == 0)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "no container: write az://ACCOUNT/CONTAINER/BLOB");
  for (size_t i = 0; i < cn; i++)
    if (!(islower((unsigned char)c[i]) || isdigit((unsigned char)c[i]) || c[i] == '-' || (i == 0 && c[i] == '$')))
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = url),
                          "container name \"%.*s\" may hold only lower-case letters, digits and '-'", (int)cn, c);
  const char *blob = c[cn] == '/' ? c + cn + 1 : c + cn;
  s->account = strndup(a, n);
  s->bucket = strndup(c, cn);
  s->key = strndup(blob, (size_t)(a + end - blob));
  s->sas = query && query[1] ? strdup(query + 1) : NULL;
  if (!s->account || !s->bucket || !s->key || (query && query[1] && !s->sas))
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  return 0;
}

/*
 * The value of name in an Azure connection string ("AccountName=a;AccountKey=k==;BlobEndpoint=...": each
 * value runs from the first '=' to the next ';'), newly allocated, or NULL.
 */
static char *connection_value(const char *connection, const char *name) {
  size_t n = strlen(name);
  for (const char *p = connection; p && *p; p = strchr(p, ';') ? strchr(p, ';') + 1 : NULL) {
    while (*p == ' ') p++;
    if (strncasecmp(p, name, n) == 0 && p[n] == '=') return strndup(p + n + 1, strcspn(p + n + 1, ";"));
  }
  return NULL;
}

/*
 * Credentials, the first found: a SAS token in the URL, AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN, then
 * AZURE_STORAGE_CONNECTION_STRING's AccountKey or SharedAccessSignature when its AccountName is the URL's
 * account; else none. Endpoint: AZURE_STORAGE_ENDPOINT, the connection string's BlobEndpoint (or
 * DefaultEndpointsProtocol and EndpointSuffix), else Azure's own.
 */
static int az_config(store *s, const char *url, sf_error *error) {
  const char *variable = "AZURE_STORAGE_ENDPOINT";
  const char *endpoint = env(variable);
  const char *connection = env("AZURE_STORAGE_CONNECTION_STRING");
  char *name = connection ? connection_value(connection, "AccountName") : NULL;
  char *blob_endpoint = NULL, *conn_key = NULL, *conn_sas = NULL, *protocol = NULL, *suffix = NULL;
  if (connection && (!name || strcmp(name, s->account) == 0)) {
    blob_endpoint = connection_value(connection, "BlobEndpoint");
    conn_key = connection_value(connection, "AccountKey");
    conn_sas = connection_value(connection, "SharedAccessSignature");
    protocol = connection_value(connection, "DefaultEndpointsProtocol");
    suffix = connection_value(connection, "EndpointSuffix");
  }
  char own[400];
  snprintf(own, sizeof own, "%s://%s.blob.%s", protocol ? protocol : "https", s->account,
           suffix ? suffix : "core.windows.net");
  if (!endpoint && blob_endpoint) variable = "AZURE_STORAGE_CONNECTION_STRING's BlobEndpoint";
  int r = set_endpoint(s, endpoint ? endpoint : blob_endpoint ? blob_endpoint : own, variable, url, error);
  const char *key = env("AZURE_STORAGE_KEY"), *token = env("AZURE_STORAGE_SAS_TOKEN");
  const char *from = key ? "AZURE_STORAGE_KEY" : "AZURE_STORAGE_CONNECTION_STRING's AccountKey";
  if (!key && !token && conn_key) key = conn_key;
  if (!key && !token && conn_sas) token = conn_sas;
  if (!r && s->sas) {
    s->credentials = strdup("the SAS token in the URL");
  } else if (!r && key) {
    s->account_key = strdup(key);
    if (asprintf(&s->credentials, "the account key in %s (Shared Key as account %s)", from, s->account) < 0)
      s->credentials = NULL;
    if (!s->account_key) r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  } else if (!r && token) {
    s->sas = strdup(token[0] == '?' ? token + 1 : token);
    s->credentials = strdup(token == conn_sas ? "the SAS token in AZURE_STORAGE_CONNECTION_STRING"
                                              : "the SAS token in AZURE_STORAGE_SAS_TOKEN");
    if (!s->sas) r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  } else if (!r) {
    /* Public containers need nothing; a private one answers 404 or 403, explained by sf_object_http_error. */
    s->credentials = strdup("no credentials (anonymous access; AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN and "
                            "AZURE_STORAGE_CONNECTION_STRING give none for this account)");
  }
  free(name);
  free(blob_endpoint);
  free_secret(conn_key);
  free_secret(conn_sas);
  free(protocol);
  free(suffix);
  if (!r && !s->credentials) r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  return r;
}

/*
 * The request for s (az://): x-ms-date and x-ms-version, the caller's headers, and a Shared Key Authorization
 * over all of them, or the SAS token appended to the query.
 */
static int az_prepare(store *s, const char *url, const char *method, const char *query, long long body_size,
                      const char *const *headers, long long now, sf_object_request *request, char **canonical,
                      sf_error *error) {
  int r = az_config(s, url, error);
  if (r) return r;
  sf_strbuf path = {0};
  sf_strbuf_add(&path, s->base_path);
  sf_strbuf_add(&path, "/");
  sf_url_encode(&path, s->bucket, strlen(s->bucket), false);
  if (*s->key) sf_strbuf_add(&path, "/");
  sf_url_encode(&path, s->key, strlen(s->key), true);
  char *wire_query = sf_sigv4_query_normalize(query);
  char date[32], date_line[48];
  sf_sharedkey_date(now, date);
  snprintf(date_line, sizeof date_line, "x-ms-date: %s", date);
  size_t n = 0;
  while (headers && headers[n]) n++;
  const char **lines = calloc(n + 3, sizeof *lines);
  bool ok = !path.failed && wire_query && lines;
  if (ok) {
    lines[0] = date_line;
    lines[1] = "x-ms-version: " AZ_VERSION;
    for (size_t i = 0; i < n; i++) lines[2 + i] = headers[i];
    const char *join = *wire_query && s->sas ? "&" : "";
    if (asprintf(&request->url, "%s://%s%s%s%s%s%s", s->scheme, s->host, path.data, *wire_query || s->sas ? "?" : "",
                 wire_query, join, s->sas ? s->sas : "") < 0)
      request->url = NULL;
    ok = request->url != NULL;
  }
  for (size_t i = 0; ok && i < n + 2; i++) ok = add_header(&request->headers, "%s", lines[i]);
  if (ok && s->account_key) {
    sf_sharedkey_request sk = {.method = method,
                               .account = s->account,
                               .encoded_path = path.data,
                               .query = wire_query,
                               .content_length = body_size,
                               .headers = lines,
                               .key_base64 = s->account_key};
    char *authorization = NULL;
    int k = sf_sharedkey_sign(&sk, canonical, &authorization);
    if (k == -2) {
      r = sf_error_set(error, SF_EDENIED, SF_AT(.url = url),
                       "AZURE_STORAGE_KEY is not base64: give the account key as the portal or `az storage account "
                       "keys list` shows it");
    } else {
      ok = k == 0 && add_header(&request->headers, "Authorization: %s", authorization);
    }
    free_secret(authorization);
  }
  if (ok && !r) {
    request->credentials = s->credentials;
    s->credentials = NULL;
  }
  free(lines);
  free(wire_query);
  sf_strbuf_clear(&path);
  if (!r && !ok) r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory preparing the request");
  return r;
}

/* ---- hf://datasets/ORG/NAME[@REVISION]/PATH: the Hugging Face Hub's resolve URLs ---- */

static bool hf_name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

static int parse_hf_url(store *s, const char *url, sf_error *error) {
  s->kind = STORE_HF;
  const char *p = url + 5;
  if (strncmp(p, "datasets/", 9) != 0)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url),
                        "hf:// URLs name datasets: write hf://datasets/ORG/NAME/PATH (or NAME@REVISION)");
  p += 9;
  size_t org = strcspn(p, "/");
  const char *name = p + org + 1;
  size_t nn = p[org] == '/' ? strcspn(name, "/@") : 0;
  if (org == 0 || nn == 0)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "write hf://datasets/ORG/NAME/PATH (or NAME@REVISION)");
  for (size_t i = 0; i < org; i++)
    if (!hf_name_char(p[i]))
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "\"%.*s\" is not a Hub user or organisation name",
                          (int)org, p);
  for (size_t i = 0; i < nn; i++)
    if (!hf_name_char(name[i]))
      return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "\"%.*s\" is not a Hub dataset name", (int)nn, name);
  const char *rest = name + nn;
  if (*rest == '@') {
    /* A revision holding '/' (refs/convert/parquet) is written %2F-encoded, as huggingface_hub writes it. */
    size_t rn = strcspn(rest + 1, "/");
    if (rn == 0) return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "an empty revision after '@'");
    s->revision = malloc(rn + 1);
    if (s->revision) sf_url_decode(s->revision, rest + 1, rn, false);
    rest += 1 + rn;
  } else {
    s->revision = strdup("main");
  }
  s->bucket = strndup(url + 5, (size_t)(name + nn - (url + 5)));
  s->key = strdup(*rest == '/' ? rest + 1 : rest);
  if (!s->revision || !s->bucket || !s->key) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  return 0;
}

/* The Hub's token: HF_TOKEN, else the file huggingface-cli login writes (HF_TOKEN_PATH, $HF_HOME/token). */
static int hf_config(store *s, const char *url, sf_error *error) {
  const char *variable = "HF_ENDPOINT";
  const char *endpoint = env(variable);
  int r = set_endpoint(s, endpoint ? endpoint : "https://huggingface.co", variable, url, error);
  if (r) return r;
  const char *token = env("HF_TOKEN");
  if (token) {
    s->bearer = strdup(token);
    s->credentials = strdup("the token in HF_TOKEN");
    return s->bearer && s->credentials ? 0 : sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  char path[1024];
  const char *home = env("HF_HOME"), *file = env("HF_TOKEN_PATH"), *user = env("HOME");
  if (file) snprintf(path, sizeof path, "%s", file);
  else if (home) snprintf(path, sizeof path, "%s/token", home);
  else snprintf(path, sizeof path, "%s/.cache/huggingface/token", user ? user : ".");
  FILE *f = fopen(path, "r");
  char line[1024] = "";
  if (f) {
    if (!fgets(line, sizeof line, f)) line[0] = '\0';
    fclose(f);
  }
  char *t = trim(line);
  if (*t) {
    s->bearer = strdup(t);
    if (asprintf(&s->credentials, "the token in %s", path) < 0) s->credentials = NULL;
  } else {
    s->credentials = strdup("no token (anonymous; HF_TOKEN is unset)");
  }
  OPENSSL_cleanse(line, sizeof line);
  return s->credentials && (!*t || s->bearer) ? 0 : sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
}

/*
 * The request for s (hf://): the file's resolve URL (api NULL), or the Hub API's api ("tree") URL for the
 * same path; the bearer token when there is one.  libcurl sends it to the Hub's host only, never to the
 * host a redirect leads to (a CDN).
 */
static int hf_prepare(store *s, const char *url, const char *method, const char *api, const char *query,
                      const char *const *headers, sf_object_request *request, sf_error *error) {
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = url),
                        "hf:// is read-only here: upload to the Hub with `huggingface-cli upload`");
  int r = hf_config(s, url, error);
  if (r) return r;
  sf_strbuf u = {0};
  sf_strbuf_appendf(&u, "%s://%s%s/", s->scheme, s->host, s->base_path);
  if (api) sf_strbuf_add(&u, "api/");
  sf_url_encode(&u, s->bucket, strlen(s->bucket), true);
  sf_strbuf_appendf(&u, "/%s/", api ? api : "resolve");
  sf_url_encode(&u, s->revision, strlen(s->revision), false);
  if (*s->key) sf_strbuf_add(&u, "/");
  sf_url_encode(&u, s->key, strlen(s->key), true);
  if (query && *query) sf_strbuf_appendf(&u, "?%s", query);
  request->url = sf_strbuf_take(&u, NULL);
  bool ok = request->url && (!s->bearer || add_header(&request->headers, "Authorization: Bearer %s", s->bearer));
  for (size_t i = 0; ok && headers && headers[i]; i++) ok = add_header(&request->headers, "%s", headers[i]);
  request->follow_redirects = true;
  if (!ok) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory preparing the request");
  request->credentials = s->credentials;
  s->credentials = NULL;
  return 0;
}

/* An S3 or GCS request for s (configured): SigV4-signed, or a GCS bearer token; the caller's headers as they are. */
static int s3_prepare(store *s, const char *url, const char *method, const char *query, const char *payload_sha256,
                      const char *const *headers, long long now, sf_object_request *request, char **canonical,
                      sf_error *error) {
  /* Host and path: bucket.host/key (virtual) or host/bucket/key (path-style); the key encoded once. */
  sf_strbuf host = {0}, path = {0};
  if (s->virtual_host) sf_strbuf_appendf(&host, "%s.", s->bucket);
  sf_strbuf_add(&host, s->host);
  sf_strbuf_add(&path, s->base_path);
  sf_strbuf_add(&path, "/");
  if (!s->virtual_host) {
    sf_url_encode(&path, s->bucket, strlen(s->bucket), false);
    if (*s->key) sf_strbuf_add(&path, "/");
  }
  sf_url_encode(&path, s->key, strlen(s->key), true);
  bool ok = !host.failed && !path.failed;
  char *wire_query = ok ? sf_sigv4_query_normalize(query) : NULL;
  const char *hash = payload_sha256 ? payload_sha256 : "UNSIGNED-PAYLOAD";
  if (ok && wire_query &&
      asprintf(&request->url, "%s://%s%s%s%s", s->scheme, host.data, path.data, *wire_query ? "?" : "",
               wire_query) < 0)
    request->url = NULL;
  ok = ok && wire_query && request->url;

  if (ok && s->bearer) {
    ok = add_header(&request->headers, "Authorization: Bearer %s", s->bearer);
  } else if (ok) {
    time_t t = (time_t)now;
    struct tm tm;
    gmtime_r(&t, &tm);
    char amz_date[32];
    strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm);
    sf_sigv4_request sr = {
        .method = method,
        .host = host.data,
        .encoded_path = path.data,
        .query = wire_query,
        .payload_sha256 = hash,
        .amz_date = amz_date,
        .region = s->region,
        .service = "s3",
        .access_key_id = s->access_key_id,
        .secret_access_key = s->secret,
        .session_token = s->session_token,
    };
    char *authorization = NULL;
    ok = sf_sigv4_sign(&sr, canonical, &authorization) == 0;
    ok = ok && add_header(&request->headers, "Authorization: %s", authorization) &&
         add_header(&request->headers, "x-amz-date: %s", amz_date) &&
         add_header(&request->headers, "x-amz-content-sha256: %s", hash) &&
         (!s->session_token || add_header(&request->headers, "x-amz-security-token: %s", s->session_token));
    free(authorization);
  }
  /* SigV4 signs host and the x-amz-* headers only: the caller's (Range, If-Match) go as they are. */
  for (size_t i = 0; ok && headers && headers[i]; i++) ok = add_header(&request->headers, "%s", headers[i]);
  if (ok) {
    request->credentials = s->credentials;
    s->credentials = NULL;
  }
  sf_strbuf_clear(&host);
  sf_strbuf_clear(&path);
  free(wire_query);
  if (!ok) {
    sf_object_request_clear(request);
    if (canonical) {
      free(*canonical);
      *canonical = NULL;
    }
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url),
                        "out of memory (or a header longer than 2 KiB) preparing the request");
  }
  return 0;
}

/* The request for any store URL; headers are sent as given and signed where the store's scheme signs them. */
static int prepare(const char *url, const char *method, const char *query, const char *payload_sha256,
                   long long body_size, const char *const *headers, long long now, sf_object_request *request,
                   char **canonical, sf_error *error) {
  memset(request, 0, sizeof *request);
  if (canonical) *canonical = NULL;
  store s = {0};
  int r = parse_url(&s, url, error);
  if (!r && s.kind == STORE_AZ)
    r = az_prepare(&s, url, method, query, body_size, headers, now, request, canonical, error);
  else if (!r && s.kind == STORE_HF)
    r = hf_prepare(&s, url, method, NULL, query, headers, request, error);
  else if (!r && !(r = s.gs ? gs_config(&s, url, error) : s3_config(&s, url, error)))
    r = s3_prepare(&s, url, method, query, payload_sha256, headers, now, request, canonical, error);
  store_clear(&s);
  if (r) sf_object_request_clear(request);
  return r;
}

int sf_object_request_prepare_at(const char *url, const char *method, const char *query, const char *payload_sha256,
                                 long long now, sf_object_request *request, char **canonical, sf_error *error) {
  return prepare(url, method, query, payload_sha256, 0, NULL, now, request, canonical, error);
}

int sf_object_request_prepare(const char *url, const char *method, const char *query, const char *payload_sha256,
                              sf_object_request *request, sf_error *error) {
  return prepare(url, method, query, payload_sha256, 0, NULL, (long long)time(NULL), request, NULL, error);
}

int sf_object_request_prepare_headers(const char *url, const char *method, const char *query,
                                      const char *payload_sha256, long long body_size, const char *const *headers,
                                      sf_object_request *request, sf_error *error) {
  return prepare(url, method, query, payload_sha256, body_size, headers, (long long)time(NULL), request, NULL, error);
}

/* ---- XML answers (libxml2: entities decoded, never fetched from the network, never printed) ---- */

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;

/* libxml2 2.9 wants one initialisation before threads use it. */
static void xml_init(void) { xmlInitParser(); }

/* Parses body[0, size); recover reads a body cut short (the start of an error answer) as far as it goes. */
static xmlDoc *xml_read(const char *body, size_t size, bool recover) {
  if (!body || size == 0 || size > MAX_RESPONSE) return NULL;
  pthread_once(&xml_once, xml_init);
  int flags = XML_PARSE_NONET | XML_PARSE_NOBLANKS | XML_PARSE_NOERROR | XML_PARSE_NOWARNING;
  return xmlReadMemory(body, (int)size, "answer.xml", NULL, flags | (recover ? XML_PARSE_RECOVER : 0));
}

static xmlNode *child(xmlNode *n, const char *name) {
  for (xmlNode *c = n ? n->children : NULL; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE && strcmp((const char *)c->name, name) == 0) return c;
  return NULL;
}

/* The text of n's child called name (newly allocated with malloc), or NULL. */
static char *child_text(xmlNode *n, const char *name) {
  xmlNode *c = child(n, name);
  xmlChar *t = c ? xmlNodeGetContent(c) : NULL;
  char *s = t ? strdup((const char *)t) : NULL;
  xmlFree(t);
  return s;
}

/* The root element when it is called name (any name when NULL), else NULL. */
static xmlNode *root_called(xmlDoc *doc, const char *name) {
  xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
  return root && (!name || strcmp((const char *)root->name, name) == 0) ? root : NULL;
}

char *sf_object_xml_text(const char *body, size_t size, const char *root, const char *name) {
  xmlDoc *doc = xml_read(body, size, true);
  char *s = child_text(root_called(doc, root), name);
  xmlFreeDoc(doc);
  return s;
}

/* ---- errors ---- */

/* The store's <Code> and <Message> from an error answer, one line each, into code and message. */
static void error_fields(const char *body, size_t size, char *code, size_t code_size, char *message,
                         size_t message_size) {
  xmlDoc *doc = xml_read(body, size, true);
  xmlNode *root = root_called(doc, NULL);
  char *c = child_text(root, "Code"), *m = child_text(root, "Message");
  xmlFreeDoc(doc);
  snprintf(code, code_size, "%s", c ? c : "");
  snprintf(message, message_size, "%s", m ? m : "");
  free(c);
  free(m);
  for (char *p = message; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
}

/* sf_object_http_error for az:// and hf://: their own error codes, credentials and remedies. */
static int other_store_error(const char *url, const char *what, long status, const char *code, const char *message,
                             const char *used, sf_error *error) {
  char from_store[96] = "";
  if (code[0]) snprintf(from_store, sizeof from_store, " %s", code);
  if (strncmp(url, "hf://", 5) == 0) {
    if (status == 404)
      return sf_error_set(error, SF_ENOENT, SF_AT(.url = url),
                          "%s: HTTP 404 — no such dataset, revision or file on the Hub (with %.100s; a private "
                          "dataset answers 404 without a token: set HF_TOKEN)",
                          what, used);
    if (status == 401 || status == 403)
      return sf_error_set(error, SF_EDENIED, SF_AT(.url = url),
                          "%s: HTTP %ld — the Hub refused %.100s: set HF_TOKEN to a token that may read this dataset "
                          "(a gated dataset also wants its terms accepted on the Hub)",
                          what, status, used);
    return sf_error_set(error, SF_ENET, SF_AT(.url = url), "%s: HTTP %ld%s", what, status,
                        status >= 500 ? " — the Hub failed; try again later" : "");
  }
  bool anonymous = strncmp(used, "no credentials", 14) == 0;
  const char *hint = anonymous ? " (no credentials were given: set AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN)" : "";
  if (anonymous && (status == 401 || status == 403))
    return sf_error_set(error, SF_EDENIED, SF_AT(.url = url), "%s: HTTP %ld%s — the container is not public%s", what,
                        status, from_store, hint);
  if (status == 404)
    return sf_error_set(error, SF_ENOENT, SF_AT(.url = url), "%s: HTTP 404%s — no such %s; check the account, "
                        "container and blob names%s",
                        what, from_store, strcmp(code, "ContainerNotFound") == 0 ? "container" : "blob", hint);
  /* Azure says AuthenticationFailed for a signature it cannot verify; Azurite says AuthorizationFailure with the
   * same message. */
  if (status == 403 && (strcmp(code, "AuthenticationFailed") == 0 || strstr(message, "failed to authenticate")))
    return sf_error_set(error, SF_EDENIED, SF_AT(.url = url), "%s: HTTP 403%s — the store refused %.200s: %s", what,
                        from_store, used,
                        strncmp(used, "the SAS token", 13) == 0
                            ? "the SAS token is wrong, expired, or for another account or container; make a new one"
                            : "check that AZURE_STORAGE_KEY is a key of this account (and AZURE_STORAGE_ENDPOINT, and "
                              "the clock)");
  if (status == 401 || status == 403)
    return sf_error_set(error, SF_EDENIED, SF_AT(.url = url),
                        "%s: HTTP %ld%s%s%.150s — access denied for %.200s; check the container's permissions (or "
                        "the SAS token's)%s",
                        what, status, from_store, message[0] ? ": " : "", message, used, hint);
  return sf_error_set(error, SF_ENET, SF_AT(.url = url), "%s: HTTP %ld%s%s%.150s%s", what, status, from_store,
                      message[0] ? ": " : "", message, status >= 500 ? " — the store failed; try again later" : "");
}

int sf_object_http_error(const char *given_url, const char *what, long status, const char *body, size_t size,
                         const sf_object_request *request, sf_error *error) {
  /* An az:// URL may carry a SAS token: its signature is not shown. */
  char url[512];
  sf_url_redact(given_url, url, sizeof url);
  char code[64], message[200];
  error_fields(body, size, code, sizeof code, message, sizeof message);
  const char *used = request && request->credentials ? request->credentials : "no credentials";
  char from_store[96] = "";
  if (code[0]) snprintf(from_store, sizeof from_store, " %s", code);
  bool gs = strncmp(url, "gs://", 5) == 0;
  if (strncmp(url, "az://", 5) == 0 || strncmp(url, "hf://", 5) == 0)
    return other_store_error(url, what, status, code, message, used, error);
  if (status == 404)
    return sf_error_set(error, SF_ENOENT, SF_AT(.url = url), "%s: HTTP 404%s — no such %s; check the bucket and key",
                        what, from_store, strcmp(code, "NoSuchBucket") == 0 ? "bucket" : "object");
  if (status == 403 && (strcmp(code, "SignatureDoesNotMatch") == 0 || strcmp(code, "InvalidAccessKeyId") == 0 ||
                        strcmp(code, "InvalidSecurity") == 0))
    return sf_error_set(error, SF_EDENIED, SF_AT(.url = url),
                        "%s: HTTP 403%s — the store refused the signature made with %.200s: %s", what, from_store, used,
                        strcmp(code, "InvalidAccessKeyId") == 0
                            ? "the key id is unknown to the store; check it and the endpoint"
                            : "check that the secret key belongs to this key id (and the "
                              "region, AWS_REGION, and the clock)");
  if ((status == 301 || status == 400) &&
      (strcmp(code, "PermanentRedirect") == 0 || strcmp(code, "AuthorizationHeaderMalformed") == 0))
    return sf_error_set(error, SF_ENET, SF_AT(.url = url),
                        "%s: HTTP %ld%s — the bucket lives in another region; set AWS_REGION to it (or "
                        "AWS_ENDPOINT_URL to its endpoint)",
                        what, status, from_store);
  if (status == 401)
    return sf_error_set(
        error, SF_EDENIED, SF_AT(.url = url), "%s: HTTP 401%s — the store refused %.200s: %s", what, from_store, used,
        gs ? "the token is wrong or expired; get a new one (gcloud auth print-access-token)" : "check the credentials");
  if (status == 403)
    return sf_error_set(error, SF_EDENIED, SF_AT(.url = url),
                        "%s: HTTP 403%s%s%.150s — access denied for %.200s; check the bucket's "
                        "permissions",
                        what, from_store, message[0] ? ": " : "", message, used);
  return sf_error_set(error, SF_ENET, SF_AT(.url = url), "%s: HTTP %ld%s%s%.150s%s", what, status, from_store,
                      message[0] ? ": " : "", message, status >= 500 ? " — the store failed; try again later" : "");
}

/* ---- whole requests ---- */

typedef struct upload_body {
  const char *data;
  size_t size, at;
} upload_body;

static size_t on_read(char *ptr, size_t size, size_t nmemb, void *opaque) {
  upload_body *b = opaque;
  size_t n = size * nmemb;
  if (n > b->size - b->at) n = b->size - b->at;
  if (n) memcpy(ptr, b->data + b->at, n);
  b->at += n;
  return n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *opaque) {
  char **etag = opaque;
  size_t n = size * nmemb;
  if (n > 5 && strncasecmp(ptr, "etag:", 5) == 0) {
    const char *v = ptr + 5;
    size_t len = n - 5;
    while (len && (*v == ' ' || *v == '\t')) v++, len--;
    while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' ')) len--;
    free(*etag);
    *etag = strndup(v, len);
  }
  return n;
}

/* The method on e: HEAD without a body, PUT uploading up, POST sending body, others by name. */
static void set_method(CURL *e, const char *method, const void *body, upload_body *up) {
  if (strcmp(method, "HEAD") == 0) {
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else if (strcmp(method, "PUT") == 0) {
    curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(e, CURLOPT_READDATA, up);
    curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)up->size);
  } else if (strcmp(method, "POST") == 0) {
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)up->size);
  } else if (strcmp(method, "GET") != 0) {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  }
}

int sf_object_call(const char *url, const char *method, const char *query, const char *const *headers,
                   const void *body, size_t body_size, long *status, char **response, size_t *response_size,
                   char **etag, sf_error *error) {
  if (status) *status = 0;
  if (response) *response = NULL;
  if (response_size) *response_size = 0;
  if (etag) *etag = NULL;
  char hash[65];
  sf_sigv4_sha256_hex(body ? body : "", body ? body_size : 0, hash);
  sf_object_request req;
  int r = sf_object_request_prepare_headers(url, method, query, hash, body ? (long long)body_size : 0, headers, &req,
                                            error);
  if (r) return r;
  char errbuf[CURL_ERROR_SIZE] = "";
  CURL *e;
  if (sf_http_easy_new(req.url, &(sf_http_options){.follow_redirects = req.follow_redirects, .error_text = errbuf},
                       &e) < 0) {
    sf_object_request_clear(&req);
    return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  sf_http_body b = {.max = MAX_RESPONSE};
  upload_body up = {.data = body, .size = body ? body_size : 0};
  char *tag = NULL;
  struct curl_slist *sent = req.headers;
  /* libcurl would add "Expect: 100-continue" and, for POST, a form Content-Type: neither is wanted. */
  sent = curl_slist_append(sent, "Expect:");
  if (sent) req.headers = sent;
  if (strcmp(method, "POST") == 0 && sent) {
    sent = curl_slist_append(sent, "Content-Type: application/xml");
    if (sent) req.headers = sent;
  }
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, req.headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sf_http_body_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, &tag);
  set_method(e, method, body, &up);
  CURLcode rc = curl_easy_perform(e);
  long code = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(e);
  if (status) *status = code;
  if (rc != CURLE_OK) {
    char shown[512];
    sf_url_redact(req.url, shown, sizeof shown);
    r = sf_error_set(error, rc == CURLE_OPERATION_TIMEDOUT ? SF_ETIMEDOUT : SF_ENET, SF_AT(.url = url),
                     "%s %s: %s — check that the endpoint is reachable", method, shown, sf_http_error_text(rc, errbuf));
  } else if (code < 200 || code > 299) {
    r = sf_object_http_error(url, method, code, b.text.data, b.text.len, &req, error);
  } else if (b.too_big) {
    r = sf_error_set(error, SF_ETOOBIG, SF_AT(.url = url), "%s: the response is larger than 16 MiB", method);
  }
  sf_object_request_clear(&req);
  if (r == 0 && response) {
    size_t n = 0;
    *response = sf_strbuf_take(&b.text, &n);
    if (!*response)
      r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
    else if (response_size) *response_size = n;
  }
  if (r == 0 && etag) {
    *etag = tag;
    tag = NULL;
  }
  sf_strbuf_clear(&b.text);
  free(tag);
  return r;
}

/* ---- listings ---- */

/* Appends "&name=value" to a listing's query, the value encoded; nothing when value is NULL. */
static void add_param(sf_strbuf *q, const char *name, const char *value) {
  if (!value) return;
  sf_strbuf_appendf(q, "&%s=", name);
  sf_url_encode(q, value, strlen(value), false);
}

/*
 * One page of an XML listing: GET call_url with query (freed here), parsed into *doc (the caller frees it) whose
 * root element must be root_name. Errors name url (the prefix, a SAS signature redacted); hint says what to check
 * when the answer is not such a document.
 */
static int list_page(const char *call_url, char *query, const char *url, int page, const char *root_name,
                     const char *hint, xmlDoc **doc, xmlNode **root, sf_error *error) {
  char *body = NULL;
  size_t size = 0;
  int r = sf_object_call(call_url, "GET", query, NULL, NULL, 0, NULL, &body, &size, NULL, error);
  free(query);
  if (r) {
    if (error) sf_url_redact(url, error->url, sizeof error->url);
    return r;
  }
  *doc = xml_read(body, size, false);
  free(body);
  *root = root_called(*doc, root_name);
  if (!*root) {
    xmlFreeDoc(*doc);
    *doc = NULL;
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = url), "the listing (page %d) is not a %s XML document; %s",
                        page + 1, root_name, hint);
  }
  return 0;
}

/* Appends a newly allocated "prefix + name" to the listing (*list, *n, *cap). Returns 0 or SF_ENOMEM. */
static int list_add(char ***list, size_t *n, size_t *cap, const char *prefix, const char *name) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 64;
    char **p = realloc(*list, c * sizeof *p);
    if (!p) return SF_ENOMEM;
    *list = p;
    *cap = c;
  }
  if (asprintf(&(*list)[*n], "%s%s", prefix, name) < 0) return SF_ENOMEM;
  (*n)++;
  return 0;
}

/*
 * List Blobs of an az:// prefix: restype=container&comp=list with prefix and marker, pages of
 * SF_OBJECT_LIST_MAX_KEYS (the service's default 5000 otherwise).
 */
static int az_list(store *s, const char *url, char ***list, size_t *n, sf_error *error) {
  char container_url[600];
  snprintf(container_url, sizeof container_url, "az://%s/%s", s->account, s->bucket);
  char prefix[610];
  snprintf(prefix, sizeof prefix, "%s/", container_url);
  size_t cap = 0;
  char *marker = NULL;
  int r = 0;
  for (int page = 0; r == 0; page++) {
    sf_strbuf q = {0};
    sf_strbuf_add(&q, "restype=container&comp=list&prefix=");
    sf_url_encode(&q, s->key, strlen(s->key), false);
    add_param(&q, "maxresults", env("SF_OBJECT_LIST_MAX_KEYS"));
    add_param(&q, "marker", marker);
    char *query = sf_strbuf_take(&q, NULL);
    if (!query) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
    /* The container URL carries the prefix URL's SAS token, if it had one. */
    char call_url[1200];
    snprintf(call_url, sizeof call_url, "%s%s%s", container_url, s->sas ? "?" : "", s->sas ? s->sas : "");
    xmlDoc *doc = NULL;
    xmlNode *root = NULL;
    r = list_page(call_url, query, url, page, "EnumerationResults",
                  "is AZURE_STORAGE_ENDPOINT a Blob service endpoint?", &doc, &root, error);
    if (r) break;
    for (xmlNode *b = child(root, "Blobs") ? child(root, "Blobs")->children : NULL; b && r == 0; b = b->next) {
      if (b->type != XML_ELEMENT_NODE || strcmp((const char *)b->name, "Blob") != 0) continue;
      xmlNode *name_node = child(b, "Name");
      char *name = child_text(b, "Name");
      if (!name) continue;
      /* Names with characters XML cannot carry come percent-encoded, marked Encoded="true". */
      xmlChar *encoded = name_node ? xmlGetProp(name_node, (const xmlChar *)"Encoded") : NULL;
      if (encoded && strcmp((const char *)encoded, "true") == 0) sf_url_decode(name, name, strlen(name), false);
      xmlFree(encoded);
      if (list_add(list, n, &cap, prefix, name) < 0)
        r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
      free(name);
    }
    free(marker);
    marker = child_text(root, "NextMarker");
    xmlFreeDoc(doc);
    if (marker && !*marker) {
      free(marker);
      marker = NULL;
    }
    if (!marker) break;
  }
  free(marker);
  return r;
}

/* The Link header's rel="next" URL of a Hub API answer, kept by on_link_header. */
static size_t on_link_header(char *ptr, size_t size, size_t nmemb, void *opaque) {
  char **next = opaque;
  size_t n = size * nmemb;
  if (n > 5 && strncasecmp(ptr, "link:", 5) == 0) {
    char *line = strndup(ptr + 5, n - 5);
    char *lt = line ? strchr(line, '<') : NULL;
    char *gt = lt ? strchr(lt, '>') : NULL;
    if (gt && strstr(gt, "rel=\"next\"")) {
      free(*next);
      *next = strndup(lt + 1, (size_t)(gt - lt - 1));
    }
    free(line);
  }
  return n;
}

/*
 * The files under an hf:// prefix from the Hub's tree API (/api/datasets/ORG/NAME/tree/REV/PATH?recursive=true),
 * following its Link: rel="next" pages.
 */
static int hf_list(store *s, const char *url, char ***list, size_t *n, sf_error *error) {
  /* The shard URLs keep the prefix's form: hf://datasets/ORG/NAME[@REV]/ + the file's path in the repository. */
  const char *repo_end = url + 5 + strlen(s->bucket);
  if (*repo_end == '@') repo_end += strcspn(repo_end, "/");
  char prefix[700];
  snprintf(prefix, sizeof prefix, "%.*s/", (int)(repo_end - url), url);
  /* The tree API lists a directory: the prefix's part after its last '/' is matched here. */
  char *slash = strrchr(s->key, '/');
  char *name_start = strdup(slash ? slash + 1 : s->key);
  if (!name_start) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  if (slash) *slash = '\0';
  else s->key[0] = '\0';
  char *dir = strdup(s->key);
  size_t cap = 0;
  sf_object_request req = {0};
  int r = dir ? hf_prepare(s, url, "GET", "tree", "recursive=true", NULL, &req, error) : SF_ENOMEM;
  char *next = NULL;
  for (int page = 0; r == 0; page++) {
    char errbuf[CURL_ERROR_SIZE] = "";
    CURL *e = NULL;
    sf_http_body b = {.max = MAX_RESPONSE};
    long status = 0;
    if (sf_http_easy_new(next ? next : req.url, &(sf_http_options){.follow_redirects = true, .error_text = errbuf},
                         &e) < 0) {
      r = SF_ENOMEM;
      break;
    }
    free(next);
    next = NULL;
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, req.headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sf_http_body_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_link_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &next);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    json_t *files = NULL;
    if (rc != CURLE_OK) {
      char shown[512];
      sf_url_redact(req.url, shown, sizeof shown);
      r = sf_error_set(error, SF_ENET, SF_AT(.url = url),
                       "list %s: %s — check that the endpoint (HF_ENDPOINT) is reachable", shown,
                       sf_http_error_text(rc, errbuf));
    } else if (status < 200 || status > 299) {
      r = sf_object_http_error(url, "list", status, b.text.data, b.text.len, &req, error);
    } else if (!(files = json_loadb(b.text.data ? b.text.data : "", b.text.len, 0, NULL)) || !json_is_array(files)) {
      r = sf_error_set(error, SF_EFORMAT, SF_AT(.url = url),
                       "the listing (page %d) is not the Hub's tree API JSON array; is HF_ENDPOINT the Hub?", page + 1);
    }
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
      const char *type = json_string_value(json_object_get(f, "type"));
      const char *path = json_string_value(json_object_get(f, "path"));
      if (r || !type || !path || strcmp(type, "file") != 0) continue;
      const char *base = *dir ? path + strlen(dir) + 1 : path;
      if (*dir && (strncmp(path, dir, strlen(dir)) != 0 || path[strlen(dir)] != '/')) continue;
      if (strncmp(base, name_start, strlen(name_start)) != 0) continue;
      if (list_add(list, n, &cap, prefix, path) < 0)
        r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
    }
    json_decref(files);
    sf_strbuf_clear(&b.text);
    if (!next) break;
  }
  if (r == SF_ENOMEM) sf_error_set(error, r, SF_AT(.url = url), "out of memory");
  free(next);
  free(dir);
  free(name_start);
  sf_object_request_clear(&req);
  return r;
}

/* ListObjectsV2 of an s3:// or gs:// prefix, with continuation tokens. */
static int s3_list(store *s, const char *url, char ***list, size_t *n, sf_error *error) {
  int r = 0;
  char bucket_url[600];
  snprintf(bucket_url, sizeof bucket_url, "%.2s://%s", url, s->bucket);
  char bucket_prefix[610];
  snprintf(bucket_prefix, sizeof bucket_prefix, "%s/", bucket_url);
  size_t cap = 0;
  char *token = NULL;
  for (int page = 0; r == 0; page++) {
    sf_strbuf q = {0};
    sf_strbuf_add(&q, "list-type=2&prefix=");
    sf_url_encode(&q, s->key, strlen(s->key), false);
    sf_strbuf_add(&q, "&encoding-type=url");
    /* SF_OBJECT_LIST_MAX_KEYS: a smaller page (the stores' default and maximum is 1000), for tests. */
    add_param(&q, "max-keys", env("SF_OBJECT_LIST_MAX_KEYS"));
    add_param(&q, "continuation-token", token);
    char *query = sf_strbuf_take(&q, NULL);
    if (!query) {
      r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
      break;
    }
    xmlDoc *doc = NULL;
    xmlNode *root = NULL;
    r = list_page(bucket_url, query, url, page, "ListBucketResult", "is the endpoint an S3/GCS XML API?", &doc, &root,
                  error);
    if (r) break;
    /* Keys are URL-encoded only when the store says so (a store may ignore encoding-type). */
    char *how = child_text(root, "EncodingType");
    bool encoded = how && strcmp(how, "url") == 0;
    free(how);
    for (xmlNode *c = root->children; c && r == 0; c = c->next) {
      if (c->type != XML_ELEMENT_NODE || strcmp((const char *)c->name, "Contents") != 0) continue;
      char *key = child_text(c, "Key");
      if (!key) continue;
      /* S3 writes a space as '+' in url-encoded listings, and a real '+' as %2B. */
      if (encoded) sf_url_decode(key, key, strlen(key), true);
      if (list_add(list, n, &cap, bucket_prefix, key) < 0)
        r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
      free(key);
    }
    char *more = child_text(root, "IsTruncated");
    bool again = more && strcmp(more, "true") == 0;
    free(more);
    free(token);
    token = NULL;
    if (again && r == 0) {
      token = child_text(root, "NextContinuationToken");
      if (token && !*token) {
        free(token);
        token = NULL;
      }
      if (!token)
        r = sf_error_set(error, SF_EFORMAT, SF_AT(.url = url),
                         "the listing says it is truncated but has no NextContinuationToken");
    }
    xmlFreeDoc(doc);
    if (!again) break;
  }
  free(token);
  return r;
}

int sf_object_list(const char *url, char ***urls, size_t *count, sf_error *error) {
  *urls = NULL;
  *count = 0;
  store s = {0};
  char **list = NULL;
  size_t n = 0;
  int r = parse_url(&s, url, error);
  if (!r && s.kind == STORE_AZ) r = az_list(&s, url, &list, &n, error);
  else if (!r && s.kind == STORE_HF) r = hf_list(&s, url, &list, &n, error);
  else if (!r) r = s3_list(&s, url, &list, &n, error);
  store_clear(&s);
  if (r) {
    for (size_t i = 0; i < n; i++) free(list[i]);
    free(list);
    return r;
  }
  *urls = list;
  *count = n;
  return 0;
}

long long sf_object_part_size(void) {
  const char *v = env("SF_OBJECT_PART_SIZE");
  if (!v) return 16ll << 20;
  char *end;
  long long n = strtoll(v, &end, 10);
  if (*end == 'K' || *end == 'k') n <<= 10;
  else if (*end == 'M' || *end == 'm') n <<= 20;
  else if (*end == 'G' || *end == 'g') n <<= 30;
  return n > 0 ? n : 16ll << 20;
}
