/*
 * s3://, gs://, az:// and hf:// URLs as signed http(s) requests (object_store.h): each store's own code is in
 * store_s3.c, store_gcs.c, store_azure.c and store_hf.c; here are what all share: the request for a URL, the
 * errors its answers mean, and a whole request sent. Listings are in object_list.c.
 */
#include "store_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "http.h"
#include "sigv4.h"
#include "strbuf.h"
#include "url.h"

/* Parses any store URL into s: the scheme picks the store's parser. */
int sf_store_parse_url(sf_store *s, const char *url, sf_error *error) {
  if (!sf_url_is_store(url))
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = url), "not an s3://, gs://, az:// or hf:// URL");
  if (url[0] == 'a') return sf_store_az_parse_url(s, url, error);
  if (url[0] == 'h') return sf_store_hf_parse_url(s, url, error);
  return sf_store_s3_parse_url(s, url, error);
}

/* The request for any store URL; headers are sent as given and signed where the store's scheme signs them. */
static int prepare(const char *url, const char *method, const char *query, const char *payload_sha256,
                   long long body_size, const char *const *headers, long long now, sf_object_request *request,
                   char **canonical, sf_error *error) {
  memset(request, 0, sizeof *request);
  if (canonical) *canonical = NULL;
  sf_store s = {0};
  int r = sf_store_parse_url(&s, url, error);
  if (!r && s.kind == SF_STORE_AZ)
    r = sf_store_az_prepare(&s, url, method, query, body_size, headers, now, request, canonical, error);
  else if (!r && s.kind == SF_STORE_HF)
    r = sf_store_hf_prepare(&s, url, method, NULL, query, headers, request, error);
  else if (!r && !(r = s.gs ? sf_store_gcs_config(&s, url, error) : sf_store_s3_config(&s, url, error)))
    r = sf_store_s3_prepare(&s, url, method, query, payload_sha256, headers, now, request, canonical, error);
  sf_store_clear(&s);
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

/* ---- errors ---- */

/* The store's <Code> and <Message> from an error answer, one line each, into code and message. */
static void error_fields(const char *body, size_t size, char *code, size_t code_size, char *message,
                         size_t message_size) {
  xmlDoc *doc = sf_store_xml_read(body, size, true);
  xmlNode *root = sf_store_xml_root(doc, NULL);
  char *c = sf_store_xml_child_text(root, "Code"), *m = sf_store_xml_child_text(root, "Message");
  xmlFreeDoc(doc);
  snprintf(code, code_size, "%s", c ? c : "");
  snprintf(message, message_size, "%s", m ? m : "");
  free(c);
  free(m);
  for (char *p = message; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
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
  if (strncmp(url, "hf://", 5) == 0) return sf_store_hf_http_error(url, what, status, used, error);
  if (strncmp(url, "az://", 5) == 0) return sf_store_az_http_error(url, what, status, code, message, used, error);
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
  sf_http_body b = {.max = SF_STORE_MAX_RESPONSE};
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

long long sf_object_part_size(void) {
  const char *v = sf_store_env("SF_OBJECT_PART_SIZE");
  if (!v) return 16ll << 20;
  char *end;
  long long n = strtoll(v, &end, 10);
  if (*end == 'K' || *end == 'k') n <<= 10;
  else if (*end == 'M' || *end == 'm') n <<= 20;
  else if (*end == 'G' || *end == 'g') n <<= 30;
  return n > 0 ? n : 16ll << 20;
}
