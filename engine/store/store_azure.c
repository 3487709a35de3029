/* az://ACCOUNT/CONTAINER/BLOB: Azure Blob Storage requests (Shared Key, SAS tokens, or anonymous) and errors. */
#include "store_common.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sharedkey.h"
#include "sigv4.h"
#include "strbuf.h"
#include "url.h"

/* ---- az://ACCOUNT/CONTAINER/BLOB: Azure Blob Storage (Shared Key, SAS tokens, or anonymous) ---- */

/* The REST API version asked for: one every Azure region and Azurite 3.x serve. */
#define AZ_VERSION "2021-08-06"

int sf_store_az_parse_url(sf_store *s, const char *url, sf_error *error) {
  s->kind = SF_STORE_AZ;
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
static int az_config(sf_store *s, const char *url, sf_error *error) {
  const char *variable = "AZURE_STORAGE_ENDPOINT";
  const char *endpoint = sf_store_env(variable);
  const char *connection = sf_store_env("AZURE_STORAGE_CONNECTION_STRING");
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
  int r = sf_store_set_endpoint(s, endpoint ? endpoint : blob_endpoint ? blob_endpoint : own, variable, url, error);
  const char *key = sf_store_env("AZURE_STORAGE_KEY"), *token = sf_store_env("AZURE_STORAGE_SAS_TOKEN");
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
  sf_store_free_secret(conn_key);
  sf_store_free_secret(conn_sas);
  free(protocol);
  free(suffix);
  if (!r && !s->credentials) r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  return r;
}

/*
 * The request for s (az://): x-ms-date and x-ms-version, the caller's headers, and a Shared Key Authorization
 * over all of them, or the SAS token appended to the query.
 */
int sf_store_az_prepare(sf_store *s, const char *url, const char *method, const char *query, long long body_size,
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
  for (size_t i = 0; ok && i < n + 2; i++) ok = sf_store_add_header(&request->headers, "%s", lines[i]);
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
      ok = k == 0 && sf_store_add_header(&request->headers, "Authorization: %s", authorization);
    }
    sf_store_free_secret(authorization);
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

/* sf_object_http_error for az://: Azure's error codes, credentials and remedies. */
int sf_store_az_http_error(const char *url, const char *what, long status, const char *code, const char *message,
                           const char *used, sf_error *error) {
  char from_store[96] = "";
  if (code[0]) snprintf(from_store, sizeof from_store, " %s", code);
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
