/* AWS Signature Version 4 (AWS4-HMAC-SHA256) over strings: canonical request, string to sign, signature. */
#include "sigv4.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include "strbuf.h"
#include "url.h"

/* One query parameter, canonically encoded. */
typedef struct param {
  char *name;
  char *value;
  bool bare; /* written without '=' ("?uploads"): kept so on the wire, signed as "uploads=" */
} param;

/* Re-encodes s[0, n) canonically (decoded, then encoded by sf_url_encode) into a new string. */
static char *reencode(const char *s, size_t n) {
  char *raw = malloc(n + 1);
  if (!raw) return NULL;
  size_t len = sf_url_decode(raw, s, n, false);
  sf_strbuf out = {0};
  sf_url_encode(&out, raw, len, false);
  free(raw);
  return sf_strbuf_take(&out, NULL);
}

static void params_free(param *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(p[i].name);
    free(p[i].value);
  }
  free(p);
}

/* Splits query at '&' into canonically encoded (name, value) pairs; *out NULL with n 0 for an empty query. */
static int parse_query(const char *query, param **out, size_t *count) {
  *out = NULL;
  *count = 0;
  if (!query || !*query) return 0;
  size_t max = 1;
  for (const char *q = query; *q; q++) max += *q == '&';
  param *p = calloc(max, sizeof *p);
  if (!p) return -1;
  size_t n = 0;
  for (const char *s = query;;) {
    const char *end = strchr(s, '&');
    if (!end) end = s + strlen(s);
    if (end > s) {
      const char *eq = memchr(s, '=', (size_t)(end - s));
      const char *name_end = eq ? eq : end;
      p[n].name = reencode(s, (size_t)(name_end - s));
      p[n].value = eq ? reencode(eq + 1, (size_t)(end - eq - 1)) : strdup("");
      p[n].bare = !eq;
      n++;
      if (!p[n - 1].name || !p[n - 1].value) {
        params_free(p, n);
        return -1;
      }
    }
    if (!*end) break;
    s = end + 1;
  }
  *out = p;
  *count = n;
  return 0;
}

static int compare_params(const void *a, const void *b) {
  const param *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : strcmp(x->value, y->value);
}

/* Joins pairs as name=value&... (bare names without '=' unless canonical); NULL when out of memory. */
static char *join_params(const param *p, size_t n, bool canonical) {
  sf_strbuf s = {0};
  for (size_t i = 0; i < n; i++)
    sf_strbuf_appendf(&s, "%s%s%s%s", i ? "&" : "", p[i].name, p[i].bare && !canonical ? "" : "=", p[i].value);
  return sf_strbuf_take(&s, NULL);
}

char *sf_sigv4_query_normalize(const char *query) {
  param *p;
  size_t n;
  if (parse_query(query, &p, &n) < 0) return NULL;
  char *s = join_params(p, n, false);
  params_free(p, n);
  return s;
}

static void to_hex(const unsigned char *d, size_t n, char *hex) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    hex[2 * i] = digits[d[i] >> 4];
    hex[2 * i + 1] = digits[d[i] & 15];
  }
  hex[2 * n] = '\0';
}

void sf_sigv4_sha256_hex(const void *data, size_t n, char hex[65]) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(data, n, d);
  to_hex(d, sizeof d, hex);
}

static void hmac(const void *key, size_t key_len, const char *msg, unsigned char out[32]) {
  unsigned int len = 32;
  HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), out, &len);
}

/* printf into a new string; NULL when out of memory. */
__attribute__((format(printf, 1, 2))) static char *format(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

int sf_sigv4_sign(const sf_sigv4_request *r, char **canonical, char **authorization) {
  if (canonical) *canonical = NULL;
  if (authorization) *authorization = NULL;
  param *p;
  size_t n;
  if (parse_query(r->query, &p, &n) < 0) return -1;
  if (n > 1) qsort(p, n, sizeof *p, compare_params);
  char *query = join_params(p, n, true);
  params_free(p, n);
  if (!query) return -1;

  bool token = r->session_token && *r->session_token;
  const char *signed_headers =
      token ? "host;x-amz-content-sha256;x-amz-date;x-amz-security-token" : "host;x-amz-content-sha256;x-amz-date";
  char *cr = format("%s\n%s\n%s\nhost:%s\nx-amz-content-sha256:%s\nx-amz-date:%s\n%s%s%s\n%s\n%s", r->method,
                    r->encoded_path && *r->encoded_path ? r->encoded_path : "/", query, r->host, r->payload_sha256,
                    r->amz_date, token ? "x-amz-security-token:" : "", token ? r->session_token : "",
                    token ? "\n" : "", signed_headers, r->payload_sha256);
  free(query);
  if (!cr) return -1;

  char date[9];
  snprintf(date, sizeof date, "%.8s", r->amz_date);
  char cr_hash[65];
  sf_sigv4_sha256_hex(cr, strlen(cr), cr_hash);
  char *scope = format("%s/%s/%s/aws4_request", date, r->region, r->service);
  char *to_sign = scope ? format("AWS4-HMAC-SHA256\n%s\n%s\n%s", r->amz_date, scope, cr_hash) : NULL;
  char *key0 = format("AWS4%s", r->secret_access_key);
  int rc = -1;
  if (scope && to_sign && key0) {
    unsigned char k1[32], k2[32], k3[32], k4[32], sig[32];
    hmac(key0, strlen(key0), date, k1);
    hmac(k1, 32, r->region, k2);
    hmac(k2, 32, r->service, k3);
    hmac(k3, 32, "aws4_request", k4);
    hmac(k4, 32, to_sign, sig);
    char sig_hex[65];
    to_hex(sig, 32, sig_hex);
    char *auth = format("AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", r->access_key_id, scope,
                        signed_headers, sig_hex);
    if (auth) {
      rc = 0;
      if (authorization) *authorization = auth;
      else free(auth);
    }
    /* The derived keys are as good as the secret for a day: do not leave them on the stack. */
    OPENSSL_cleanse(k1, sizeof k1);
    OPENSSL_cleanse(k2, sizeof k2);
    OPENSSL_cleanse(k3, sizeof k3);
    OPENSSL_cleanse(k4, sizeof k4);
  }
  if (key0) {
    OPENSSL_cleanse(key0, strlen(key0));
    free(key0);
  }
  free(scope);
  free(to_sign);
  if (rc == 0 && canonical) *canonical = cr;
  else free(cr);
  return rc;
}
