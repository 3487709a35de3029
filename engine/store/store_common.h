/*
 * What the object-store files share. object_store.h is their contract; the files, each using only those
 * listed before it: store_common.c (secrets, endpoints, headers, XML answers), one file per store
 * (store_s3.c, store_gcs.c, store_azure.c, store_hf.c: a URL's parts, credentials, the signed request,
 * what the store's errors mean), object_store.c (the request for any URL, errors, a whole request sent) and
 * object_list.c (listings).
 */
#ifndef SF_ENGINE_STORE_COMMON_H
#define SF_ENGINE_STORE_COMMON_H

#include <stdbool.h>
#include <stddef.h>

#include "curl_lib.h"
#include <libxml/tree.h>

#include "object_store.h"

/* The most of an answer kept in memory (a listing page, an error body, a token). */
enum { SF_STORE_MAX_RESPONSE = 16 << 20 };

typedef enum sf_store_kind { SF_STORE_S3, SF_STORE_GS, SF_STORE_AZ, SF_STORE_HF } sf_store_kind;

/* One request's store: what its URL names, its endpoint and credentials (sf_store_clear frees them). */
typedef struct sf_store {
  sf_store_kind kind;
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
} sf_store;

/* ---- store_common.c ---- */

/* Frees what s holds (wiping the secrets) and zeroes it. */
void sf_store_clear(sf_store *s);
/* The environment variable's value, or NULL when unset or empty. */
const char *sf_store_env(const char *name);
/* Wipes and frees a string that held a secret (NULL-safe). */
void sf_store_free_secret(char *s);
/* s without leading and trailing white space (the end is cut in place). */
char *sf_store_trim(char *s);
/*
 * Splits endpoint, "scheme://authority/path" (or "authority" alone: http), into s's scheme, host and base path;
 * variable names where it came from, for the message. Returns 0, SF_EINVAL (not http(s)) or SF_ENOMEM.
 */
int sf_store_set_endpoint(sf_store *s, const char *endpoint, const char *variable, const char *url, sf_error *error);
/* Appends the formatted header line (at most 2 KiB) to *list, its copy wiped. Returns false when out of memory. */
bool sf_store_add_header(struct curl_slist **list, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses an XML answer body[0, size); recover reads a body cut short as far as it goes. NULL if it is none. */
xmlDoc *sf_store_xml_read(const char *body, size_t size, bool recover);
/* n's first child element called name, or NULL (n may be NULL). */
xmlNode *sf_store_xml_child(xmlNode *n, const char *name);
/* The text of n's child called name (newly allocated with malloc), or NULL. */
char *sf_store_xml_child_text(xmlNode *n, const char *name);
/* The root element of doc when it is called name (any name when NULL), else NULL (doc may be NULL). */
xmlNode *sf_store_xml_root(xmlDoc *doc, const char *name);

/* ---- each store: its URL's parts into s (SF_EINVAL with what to write, or SF_ENOMEM) ---- */

int sf_store_s3_parse_url(sf_store *s, const char *url, sf_error *error); /* s3://, gs:// */
int sf_store_az_parse_url(sf_store *s, const char *url, sf_error *error);
int sf_store_hf_parse_url(sf_store *s, const char *url, sf_error *error);

/* ---- S3, and GCS's XML API (store_s3.c, store_gcs.c) ---- */

/* Region, credentials and endpoint of an s3:// request from the environment and ~/.aws. SF_EDENIED: none found. */
int sf_store_s3_config(sf_store *s, const char *url, sf_error *error);
/* Endpoint and credentials of a gs:// request: a token, HMAC keys, or the metadata server's token. */
int sf_store_gcs_config(sf_store *s, const char *url, sf_error *error);
/* The request for s (configured): SigV4-signed, or with its bearer token; as sf_object_request_prepare_at. */
int sf_store_s3_prepare(sf_store *s, const char *url, const char *method, const char *query,
                        const char *payload_sha256, const char *const *headers, long long now,
                        sf_object_request *request, char **canonical, sf_error *error);

/* ---- Azure Blob Storage (store_azure.c) ---- */

/* Configures s (credentials, endpoint) and makes its request; as sf_object_request_prepare_headers. */
int sf_store_az_prepare(sf_store *s, const char *url, const char *method, const char *query, long long body_size,
                        const char *const *headers, long long now, sf_object_request *request, char **canonical,
                        sf_error *error);
/* sf_object_http_error for az://: code and message are the answer's (may be ""), used the credentials. */
int sf_store_az_http_error(const char *url, const char *what, long status, const char *code, const char *message,
                           const char *used, sf_error *error);

/* ---- the Hugging Face Hub (store_hf.c) ---- */

/* Configures s (token, endpoint) and makes its request: a file's resolve URL, or api's ("tree") for the path. */
int sf_store_hf_prepare(sf_store *s, const char *url, const char *method, const char *api, const char *query,
                        const char *const *headers, sf_object_request *request, sf_error *error);
/* sf_object_http_error for hf://. */
int sf_store_hf_http_error(const char *url, const char *what, long status, const char *used, sf_error *error);

/* ---- object_store.c ---- */

/* Parses any store URL into s (the scheme picks the store); SF_EINVAL for another scheme. */
int sf_store_parse_url(sf_store *s, const char *url, sf_error *error);

#endif
