/* What every object store's code uses (store_common.h): secrets, endpoints, headers, XML answers. */
#include "store_common.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libxml/parser.h>
#include <openssl/crypto.h>

#include "url.h"

const char *sf_store_env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* Wipes and frees a string that held a secret. */
void sf_store_free_secret(char *s) {
  if (!s) return;
  OPENSSL_cleanse(s, strlen(s));
  free(s);
}

char *sf_store_trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

void sf_store_clear(sf_store *s) {
  free(s->bucket);
  free(s->key);
  free(s->account);
  sf_store_free_secret(s->sas);
  sf_store_free_secret(s->account_key);
  free(s->revision);
  free(s->scheme);
  free(s->host);
  free(s->base_path);
  free(s->region);
  free(s->access_key_id);
  sf_store_free_secret(s->secret);
  sf_store_free_secret(s->session_token);
  sf_store_free_secret(s->bearer);
  free(s->credentials);
  memset(s, 0, sizeof *s);
}

/* Splits "scheme://authority/path" (or "authority" alone: http) into the store's endpoint. */
int sf_store_set_endpoint(sf_store *s, const char *endpoint, const char *variable, const char *url, sf_error *error) {
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

void sf_object_request_clear(sf_object_request *request) {
  if (!request) return;
  free(request->url);
  /* The list holds the Authorization header (a signature, or a bearer token): wipe it. */
  for (struct curl_slist *h = request->headers; h; h = h->next) OPENSSL_cleanse(h->data, strlen(h->data));
  curl_slist_free_all(request->headers);
  free(request->credentials);
  memset(request, 0, sizeof *request);
}

bool sf_store_add_header(struct curl_slist **list, const char *fmt, ...) {
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

/* ---- XML answers (libxml2: entities decoded, never fetched from the network, never printed) ---- */

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;

/* libxml2 2.9 wants one initialisation before threads use it. */
static void xml_init(void) { xmlInitParser(); }

/* Parses body[0, size); recover reads a body cut short (the start of an error answer) as far as it goes. */
xmlDoc *sf_store_xml_read(const char *body, size_t size, bool recover) {
  if (!body || size == 0 || size > SF_STORE_MAX_RESPONSE) return NULL;
  pthread_once(&xml_once, xml_init);
  int flags = XML_PARSE_NONET | XML_PARSE_NOBLANKS | XML_PARSE_NOERROR | XML_PARSE_NOWARNING;
  return xmlReadMemory(body, (int)size, "answer.xml", NULL, flags | (recover ? XML_PARSE_RECOVER : 0));
}

xmlNode *sf_store_xml_child(xmlNode *n, const char *name) {
  for (xmlNode *c = n ? n->children : NULL; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE && strcmp((const char *)c->name, name) == 0) return c;
  return NULL;
}

/* The text of n's child called name (newly allocated with malloc), or NULL. */
char *sf_store_xml_child_text(xmlNode *n, const char *name) {
  xmlNode *c = sf_store_xml_child(n, name);
  xmlChar *t = c ? xmlNodeGetContent(c) : NULL;
  char *s = t ? strdup((const char *)t) : NULL;
  xmlFree(t);
  return s;
}

/* The root element when it is called name (any name when NULL), else NULL. */
xmlNode *sf_store_xml_root(xmlDoc *doc, const char *name) {
  xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
  return root && (!name || strcmp((const char *)root->name, name) == 0) ? root : NULL;
}

char *sf_object_xml_text(const char *body, size_t size, const char *root, const char *name) {
  xmlDoc *doc = sf_store_xml_read(body, size, true);
  char *s = sf_store_xml_child_text(sf_store_xml_root(doc, root), name);
  xmlFreeDoc(doc);
  return s;
}
