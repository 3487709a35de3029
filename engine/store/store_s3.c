/* s3:// (and gs:// with HMAC keys or a token): AWS credentials and regions, addressing, SigV4-signed requests. */
#include "store_common.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <openssl/crypto.h>

#include "sigv4.h"
#include "strbuf.h"
#include "url.h"

/* ---- ~/.aws/credentials and ~/.aws/config ---- */

/* Path of an AWS file: the variable's value, else ~/.aws/NAME, into out. */
static void aws_file(const char *variable, const char *name, char *out, size_t size) {
  const char *v = sf_store_env(variable);
  const char *home = sf_store_env("HOME");
  if (v) snprintf(out, size, "%s", v);
  else snprintf(out, size, "%s/.aws/%s", home ? home : ".", name);
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
    char *s = sf_store_trim(line);
    if (*s == '#' || *s == ';' || !*s) continue;
    if (*s == '[') {
      char *end = strchr(s, ']');
      if (end) *end = '\0';
      in = strcmp(sf_store_trim(s + 1), section) == 0;
      continue;
    }
    char *eq = strchr(s, '=');
    if (!in || !eq) continue;
    *eq = '\0';
    if (strcmp(sf_store_trim(s), key) == 0) value = strdup(sf_store_trim(eq + 1));
  }
  OPENSSL_cleanse(line, sizeof line);
  fclose(f);
  return value;
}

static bool dns_compatible(const char *bucket) {
  size_t n = strlen(bucket);
  if (n < 3 || n > 63) return false;
  for (const char *c = bucket; *c; c++)
    if (!(islower((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '-')) return false; /* dots break TLS */
  return true;
}

/* Parses s3://BUCKET/KEY and gs://BUCKET/KEY. */
int sf_store_s3_parse_url(sf_store *s, const char *url, sf_error *error) {
  if (url[0] == 'h') return sf_store_hf_parse_url(s, url, error);
  s->gs = url[0] == 'g';
  s->kind = s->gs ? SF_STORE_GS : SF_STORE_S3;
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

int sf_store_s3_config(sf_store *s, const char *url, sf_error *error) {
  const char *profile = sf_store_env("AWS_PROFILE");
  if (!profile) profile = "default";
  char credentials_path[1024], config_path[1024];
  aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", credentials_path, sizeof credentials_path);
  aws_file("AWS_CONFIG_FILE", "config", config_path, sizeof config_path);
  char config_section[300];
  snprintf(config_section, sizeof config_section, strcmp(profile, "default") ? "profile %s" : "%s", profile);

  /* Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's region in ~/.aws/config, us-east-1. */
  const char *region = sf_store_env("AWS_REGION");
  if (!region) region = sf_store_env("AWS_DEFAULT_REGION");
  s->region = region ? strdup(region) : ini_value(config_path, config_section, "region");
  if (!s->region) s->region = strdup("us-east-1");

  /* Credentials: the environment, else the profile in the shared credentials file. */
  const char *id = sf_store_env("AWS_ACCESS_KEY_ID"), *secret = sf_store_env("AWS_SECRET_ACCESS_KEY");
  if (id && secret) {
    s->access_key_id = strdup(id);
    s->secret = strdup(secret);
    const char *token = sf_store_env("AWS_SESSION_TOKEN");
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
  const char *endpoint = sf_store_env(variable);
  if (!endpoint) endpoint = sf_store_env(variable = "AWS_ENDPOINT_URL");
  int r;
  if (endpoint) {
    r = sf_store_set_endpoint(s, endpoint, variable, url, error);
  } else {
    char aws[300];
    snprintf(aws, sizeof aws, "https://s3.%s.amazonaws.com", s->region);
    r = sf_store_set_endpoint(s, aws, "AWS_REGION", url, error);
  }
  if (r) return r;
  const char *style = sf_store_env("AWS_S3_ADDRESSING_STYLE");
  if (style && strcasecmp(style, "path") == 0) s->virtual_host = false;
  else if (style && strcasecmp(style, "virtual") == 0) s->virtual_host = true;
  else if (style && strcasecmp(style, "auto") != 0)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url),
                        "AWS_S3_ADDRESSING_STYLE=\"%.40s\": use path, virtual or auto", style);
  else s->virtual_host = !endpoint && dns_compatible(s->bucket);
  return 0;
}

/* An S3 or GCS request for s (configured): SigV4-signed, or a GCS bearer token; the caller's headers as they are. */
int sf_store_s3_prepare(sf_store *s, const char *url, const char *method, const char *query, const char *payload_sha256,
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
    ok = sf_store_add_header(&request->headers, "Authorization: Bearer %s", s->bearer);
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
    ok = ok && sf_store_add_header(&request->headers, "Authorization: %s", authorization) &&
         sf_store_add_header(&request->headers, "x-amz-date: %s", amz_date) &&
         sf_store_add_header(&request->headers, "x-amz-content-sha256: %s", hash) &&
         (!s->session_token || sf_store_add_header(&request->headers, "x-amz-security-token: %s", s->session_token));
    free(authorization);
  }
  /* SigV4 signs host and the x-amz-* headers only: the caller's (Range, If-Match) go as they are. */
  for (size_t i = 0; ok && headers && headers[i]; i++) ok = sf_store_add_header(&request->headers, "%s", headers[i]);
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
