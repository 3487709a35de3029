/* URL kinds, %-decoding and encoding, redaction for messages (engine/url.h). */
#include "url.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* ASCII classes spelled out: <ctype.h> would follow the embedding program's locale. */
static bool alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool alnum(char c) { return alpha(c) || (c >= '0' && c <= '9'); }

size_t sf_url_scheme_length(const char *url) {
  if (!url || !alpha(url[0])) return 0;
  size_t n = 1;
  while (alnum(url[n]) || url[n] == '+' || url[n] == '-' || url[n] == '.') n++;
  return strncmp(url + n, "://", 3) == 0 ? n : 0;
}

sf_url_kind sf_url_kind_of(const char *url) {
  if (!url) return SF_URL_PATH;
  if (strncmp(url, "pipe:", 5) == 0) return SF_URL_PIPE;
  size_t n = sf_url_scheme_length(url);
  if (n == 0) return SF_URL_PATH;
  if ((n == 4 && strncmp(url, "http", 4) == 0) || (n == 5 && strncmp(url, "https", 5) == 0)) return SF_URL_HTTP;
  if (n == 2 && (strncmp(url, "s3", 2) == 0 || strncmp(url, "gs", 2) == 0 || strncmp(url, "az", 2) == 0 ||
                 strncmp(url, "hf", 2) == 0))
    return SF_URL_STORE;
  if (n == 4 && strncmp(url, "file", 4) == 0) return SF_URL_FILE;
  return SF_URL_OTHER;
}

bool sf_url_is_http(const char *url) { return sf_url_kind_of(url) == SF_URL_HTTP; }

bool sf_url_is_store(const char *url) { return sf_url_kind_of(url) == SF_URL_STORE; }

bool sf_url_is_remote(const char *url) {
  sf_url_kind k = sf_url_kind_of(url);
  return k == SF_URL_HTTP || k == SF_URL_STORE;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

size_t sf_url_decode(char *out, const char *s, size_t n, bool plus_is_space) {
  size_t len = 0;
  for (size_t i = 0; i < n; i++) {
    int hi, lo;
    if (s[i] == '%' && i + 2 < n && (hi = hexval(s[i + 1])) >= 0 && (lo = hexval(s[i + 2])) >= 0) {
      out[len++] = (char)(hi * 16 + lo);
      i += 2;
    } else {
      out[len++] = plus_is_space && s[i] == '+' ? ' ' : s[i];
    }
  }
  out[len] = '\0';
  return len;
}

static bool unreserved(char c) { return alnum(c) || c == '-' || c == '.' || c == '_' || c == '~'; }

int sf_url_encode(sf_strbuf *out, const char *s, size_t n, bool keep_slash) {
  static const char hex[] = "0123456789ABCDEF";
  size_t from = 0; /* start of the run of bytes that stay as they are */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (unreserved((char)c) || (keep_slash && c == '/')) continue;
    char escape[3] = {'%', hex[c >> 4], hex[c & 15]};
    sf_strbuf_append(out, s + from, i - from);
    sf_strbuf_append(out, escape, 3);
    from = i + 1;
  }
  return sf_strbuf_append(out, s + from, n - from);
}

/* A query parameter whose value is a secret (X-Amz-Signature, access_token, X-Goog-Credential, ...). */
static bool secret_param(const char *name, size_t len) {
  static const char *const words[] = {"signature", "token", "credential", "secret", "password", NULL};
  char low[64];
  if (len >= sizeof low) len = sizeof low - 1;
  for (size_t i = 0; i < len; i++) low[i] = (char)tolower((unsigned char)name[i]);
  low[len] = '\0';
  if (strcmp(low, "sig") == 0) return true; /* an Azure SAS token's signature */
  for (int i = 0; words[i]; i++)
    if (strstr(low, words[i])) return true;
  return false;
}

void sf_url_redact(const char *url, char *out, size_t size) {
  if (!size) return;
  size_t o = 0;
#define PUT(c)                      \
  do {                              \
    if (o + 1 < size) out[o++] = c; \
  } while (0)
  const char *p = url, *scheme = strstr(url, "://");
  if (scheme) {
    for (; p < scheme + 3; p++) PUT(*p);
    const char *end = p + strcspn(p, "/?#");
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (at) {
      for (const char *s = "***"; *s; s++) PUT(*s);
      p = at;
    }
  }
  bool in_query = false;
  while (*p) {
    if (*p == '#') in_query = false;
    PUT(*p);
    if (*p == '?' || (in_query && *p == '&')) {
      in_query = true;
      const char *name = p + 1, *eq = name + strcspn(name, "=&#");
      if (*eq == '=' && secret_param(name, (size_t)(eq - name))) {
        for (const char *s = name; s <= eq; s++) PUT(*s);
        for (const char *s = "***"; *s; s++) PUT(*s);
        p = eq + 1 + strcspn(eq + 1, "&#");
        continue;
      }
    }
    p++;
  }
  out[o] = '\0';
#undef PUT
}

char *sf_url_local_path(const char *url) {
  switch (sf_url_kind_of(url)) {
  case SF_URL_PATH: return strdup(url);
  case SF_URL_FILE: {
    const char *p = url + strlen("file://");
    if (strncmp(p, "localhost/", 10) == 0) p += 9;
    if (*p != '/') return NULL;
    size_t n = strlen(p);
    char *out = malloc(n + 1);
    if (out) sf_url_decode(out, p, n, false);
    return out;
  }
  default: return NULL;
  }
}
