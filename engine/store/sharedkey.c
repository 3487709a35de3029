/* Azure Storage Shared Key (SharedKey scheme, Blob service) over strings: string to sign, signature. */
#include "sharedkey.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "strbuf.h"
#include "url.h"

/* The standard headers whose values the string to sign lists, in its order (Content-Length comes separately). */
static const char *const standard[] = {"Content-Encoding", "Content-Language", NULL /* Content-Length */,
                                       "Content-MD5",      "Content-Type",     "Date",
                                       "If-Modified-Since", "If-Match",        "If-None-Match",
                                       "If-Unmodified-Since", "Range"};

/* The value of the line "Name: value" when its name is name (any case), else NULL; *n gets the value's length. */
static const char *header_value(const char *line, const char *name, size_t *n) {
  size_t k = strlen(name);
  if (strncasecmp(line, name, k) != 0 || line[k] != ':') return NULL;
  const char *v = line + k + 1;
  while (*v == ' ' || *v == '\t') v++;
  size_t len = strlen(v);
  while (len && (v[len - 1] == ' ' || v[len - 1] == '\t')) len--;
  *n = len;
  return v;
}

typedef struct pair {
  char *name;  /* lower-cased */
  char *value; /* trimmed (headers) or decoded (query) */
} pair;

static int compare_pairs(const void *a, const void *b) {
  const pair *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : strcmp(x->value, y->value);
}

static void pairs_free(pair *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(p[i].name);
    free(p[i].value);
  }
  free(p);
}

static char *lower_dup(const char *s, size_t n) {
  char *d = strndup(s, n);
  for (char *c = d; c && *c; c++)
    if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
  return d;
}

/* The x-ms-* headers of lines, sorted by lower-cased name; -1 when out of memory. */
static int ms_headers(const char *const *lines, pair **out, size_t *count) {
  size_t max = 0, n = 0;
  for (size_t i = 0; lines && lines[i]; i++) max++;
  pair *p = calloc(max ? max : 1, sizeof *p);
  if (!p) return -1;
  for (size_t i = 0; lines && lines[i]; i++) {
    const char *colon = strchr(lines[i], ':');
    if (!colon || strncasecmp(lines[i], "x-ms-", 5) != 0) continue;
    size_t name_len = (size_t)(colon - lines[i]);
    while (name_len && lines[i][name_len - 1] == ' ') name_len--;
    const char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    size_t len = strlen(v);
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t')) len--;
    p[n].name = lower_dup(lines[i], name_len);
    p[n].value = strndup(v, len);
    n++;
    if (!p[n - 1].name || !p[n - 1].value) {
      pairs_free(p, n);
      return -1;
    }
  }
  qsort(p, n, sizeof *p, compare_pairs);
  *out = p;
  *count = n;
  return 0;
}

/* The query's parameters, names lower-cased and values percent-decoded, sorted; -1 when out of memory. */
static int query_params(const char *query, pair **out, size_t *count) {
  size_t max = 1, n = 0;
  for (const char *q = query ? query : ""; *q; q++) max += *q == '&';
  pair *p = calloc(max, sizeof *p);
  if (!p) return -1;
  for (const char *s = query ? query : ""; *s;) {
    size_t len = strcspn(s, "&");
    const char *eq = memchr(s, '=', len);
    size_t name_len = eq ? (size_t)(eq - s) : len;
    if (len) {
      p[n].name = malloc(name_len + 1);
      p[n].value = malloc(len + 1);
      n++;
      if (!p[n - 1].name || !p[n - 1].value) {
        pairs_free(p, n);
        return -1;
      }
      sf_url_decode(p[n - 1].name, s, name_len, false);
      for (char *c = p[n - 1].name; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
      sf_url_decode(p[n - 1].value, eq ? eq + 1 : "", eq ? len - name_len - 1 : 0, false);
    }
    s += len + (s[len] == '&');
  }
  qsort(p, n, sizeof *p, compare_pairs);
  *out = p;
  *count = n;
  return 0;
}

/* The string to sign of r into out. */
static int build(const sf_sharedkey_request *r, sf_strbuf *out) {
  sf_strbuf_appendf(out, "%s\n", r->method);
  for (size_t s = 0; s < sizeof standard / sizeof *standard; s++) {
    if (!standard[s]) {
      if (r->content_length > 0) sf_strbuf_appendf(out, "%lld", r->content_length);
      sf_strbuf_add(out, "\n");
      continue;
    }
    for (size_t i = 0; r->headers && r->headers[i]; i++) {
      size_t n;
      const char *v = header_value(r->headers[i], standard[s], &n);
      if (v) {
        sf_strbuf_append(out, v, n);
        break;
      }
    }
    sf_strbuf_add(out, "\n");
  }
  pair *h = NULL, *q = NULL;
  size_t nh = 0, nq = 0;
  if (ms_headers(r->headers, &h, &nh) < 0) return -1;
  if (query_params(r->query, &q, &nq) < 0) {
    pairs_free(h, nh);
    return -1;
  }
  for (size_t i = 0; i < nh; i++) sf_strbuf_appendf(out, "%s:%s\n", h[i].name, h[i].value);
  sf_strbuf_appendf(out, "/%s%s", r->account, r->encoded_path && *r->encoded_path ? r->encoded_path : "/");
  for (size_t i = 0; i < nq; i++) {
    /* Repeated names: one line, the values joined with ',' (sorted above). */
    if (i && strcmp(q[i].name, q[i - 1].name) == 0) sf_strbuf_appendf(out, ",%s", q[i].value);
    else sf_strbuf_appendf(out, "\n%s:%s", q[i].name, q[i].value);
  }
  pairs_free(h, nh);
  pairs_free(q, nq);
  return out->failed ? -1 : 0;
}

int sf_sharedkey_sign(const sf_sharedkey_request *r, char **to_sign, char **authorization) {
  if (to_sign) *to_sign = NULL;
  if (authorization) *authorization = NULL;
  sf_strbuf s = {0};
  if (build(r, &s) < 0) {
    sf_strbuf_clear(&s);
    return -1;
  }
  /* The key: base64 without whitespace; EVP_DecodeBlock counts the padding as zero bytes, which are dropped. */
  size_t klen = strlen(r->key_base64);
  unsigned char *key = malloc(klen / 4 * 3 + 3);
  int n = key && klen % 4 == 0 && klen ? EVP_DecodeBlock(key, (const unsigned char *)r->key_base64, (int)klen) : -1;
  if (n >= 0 && klen >= 1 && r->key_base64[klen - 1] == '=') n--;
  if (n >= 0 && klen >= 2 && r->key_base64[klen - 2] == '=') n--;
  int rc = 0;
  if (n <= 0) rc = key ? -2 : -1;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (rc == 0 && !HMAC(EVP_sha256(), key, n, (const unsigned char *)s.data, s.len, mac, &mac_len)) rc = -1;
  if (key) OPENSSL_cleanse(key, klen / 4 * 3 + 3);
  free(key);
  if (rc == 0 && authorization) {
    char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
    EVP_EncodeBlock((unsigned char *)b64, mac, (int)mac_len);
    if (asprintf(authorization, "SharedKey %s:%s", r->account, b64) < 0) {
      *authorization = NULL;
      rc = -1;
    }
  }
  if (rc == 0 && to_sign) {
    *to_sign = sf_strbuf_take(&s, NULL);
    if (!*to_sign) rc = -1;
  }
  sf_strbuf_clear(&s);
  if (rc < 0 && authorization) {
    free(*authorization);
    *authorization = NULL;
  }
  return rc;
}

void sf_sharedkey_date(long long t, char out[32]) {
  /* Names spelled out: strftime's %a and %b would follow the embedding program's locale. */
  static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t tt = (time_t)t;
  struct tm tm;
  gmtime_r(&tt, &tm);
  snprintf(out, 32, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12],
           tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}
