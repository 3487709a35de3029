/* Listings of s3://, gs://, az:// and hf:// prefixes (sf_object_list): each store's protocol, page by page. */
#include "store_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "http.h"
#include "strbuf.h"
#include "url.h"

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
  *doc = sf_store_xml_read(body, size, false);
  free(body);
  *root = sf_store_xml_root(*doc, root_name);
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
static int az_list(sf_store *s, const char *url, char ***list, size_t *n, sf_error *error) {
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
    add_param(&q, "maxresults", sf_store_env("SF_OBJECT_LIST_MAX_KEYS"));
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
    xmlNode *blobs = sf_store_xml_child(root, "Blobs");
    for (xmlNode *b = blobs ? blobs->children : NULL; b && r == 0; b = b->next) {
      if (b->type != XML_ELEMENT_NODE || strcmp((const char *)b->name, "Blob") != 0) continue;
      xmlNode *name_node = sf_store_xml_child(b, "Name");
      char *name = sf_store_xml_child_text(b, "Name");
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
    marker = sf_store_xml_child_text(root, "NextMarker");
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
static int hf_list(sf_store *s, const char *url, char ***list, size_t *n, sf_error *error) {
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
  int r = dir ? sf_store_hf_prepare(s, url, "GET", "tree", "recursive=true", NULL, &req, error) : SF_ENOMEM;
  char *next = NULL;
  for (int page = 0; r == 0; page++) {
    char errbuf[CURL_ERROR_SIZE] = "";
    CURL *e = NULL;
    sf_http_body b = {.max = SF_STORE_MAX_RESPONSE};
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
static int s3_list(sf_store *s, const char *url, char ***list, size_t *n, sf_error *error) {
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
    add_param(&q, "max-keys", sf_store_env("SF_OBJECT_LIST_MAX_KEYS"));
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
    char *how = sf_store_xml_child_text(root, "EncodingType");
    bool encoded = how && strcmp(how, "url") == 0;
    free(how);
    for (xmlNode *c = root->children; c && r == 0; c = c->next) {
      if (c->type != XML_ELEMENT_NODE || strcmp((const char *)c->name, "Contents") != 0) continue;
      char *key = sf_store_xml_child_text(c, "Key");
      if (!key) continue;
      /* S3 writes a space as '+' in url-encoded listings, and a real '+' as %2B. */
      if (encoded) sf_url_decode(key, key, strlen(key), true);
      if (list_add(list, n, &cap, bucket_prefix, key) < 0)
        r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
      free(key);
    }
    char *more = sf_store_xml_child_text(root, "IsTruncated");
    bool again = more && strcmp(more, "true") == 0;
    free(more);
    free(token);
    token = NULL;
    if (again && r == 0) {
      token = sf_store_xml_child_text(root, "NextContinuationToken");
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
  sf_store s = {0};
  char **list = NULL;
  size_t n = 0;
  int r = sf_store_parse_url(&s, url, error);
  if (!r && s.kind == SF_STORE_AZ) r = az_list(&s, url, &list, &n, error);
  else if (!r && s.kind == SF_STORE_HF) r = hf_list(&s, url, &list, &n, error);
  else if (!r) r = s3_list(&s, url, &list, &n, error);
  sf_store_clear(&s);
  if (r) {
    for (size_t i = 0; i < n; i++) free(list[i]);
    free(list);
    return r;
  }
  *urls = list;
  *count = n;
  return 0;
}
