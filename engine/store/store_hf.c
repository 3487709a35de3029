/* hf://datasets/ORG/NAME[@REVISION]/PATH: the Hugging Face Hub's resolve URLs, its token, and its errors. */
#include "store_common.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "strbuf.h"
#include "url.h"

/* ---- hf://datasets/ORG/NAME[@REVISION]/PATH: the Hugging Face Hub's resolve URLs ---- */

static bool hf_name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

int sf_store_hf_parse_url(sf_store *s, const char *url, sf_error *error) {
  s->kind = SF_STORE_HF;
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
static int hf_config(sf_store *s, const char *url, sf_error *error) {
  const char *variable = "HF_ENDPOINT";
  const char *endpoint = sf_store_env(variable);
  int r = sf_store_set_endpoint(s, endpoint ? endpoint : "https://huggingface.co", variable, url, error);
  if (r) return r;
  const char *token = sf_store_env("HF_TOKEN");
  if (token) {
    s->bearer = strdup(token);
    s->credentials = strdup("the token in HF_TOKEN");
    return s->bearer && s->credentials ? 0 : sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
  }
  char path[1024];
  const char *home = sf_store_env("HF_HOME"), *file = sf_store_env("HF_TOKEN_PATH"), *user = sf_store_env("HOME");
  if (file) snprintf(path, sizeof path, "%s", file);
  else if (home) snprintf(path, sizeof path, "%s/token", home);
  else snprintf(path, sizeof path, "%s/.cache/huggingface/token", user ? user : ".");
  FILE *f = fopen(path, "r");
  char line[1024] = "";
  if (f) {
    if (!fgets(line, sizeof line, f)) line[0] = '\0';
    fclose(f);
  }
  char *t = sf_store_trim(line);
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
int sf_store_hf_prepare(sf_store *s, const char *url, const char *method, const char *api, const char *query,
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
  bool ok =
      request->url && (!s->bearer || sf_store_add_header(&request->headers, "Authorization: Bearer %s", s->bearer));
  for (size_t i = 0; ok && headers && headers[i]; i++) ok = sf_store_add_header(&request->headers, "%s", headers[i]);
  request->follow_redirects = true;
  if (!ok) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory preparing the request");
  request->credentials = s->credentials;
  s->credentials = NULL;
  return 0;
}

/* sf_object_http_error for hf://: what the Hub's answers mean, and what to do. */
int sf_store_hf_http_error(const char *url, const char *what, long status, const char *used, sf_error *error) {
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
