/* Atomic copies between local files and http(s) object stores (PUT + WebDAV MOVE; GET + rename). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>
#include <zlib.h>

#include "shardflow/storage.h"

static bool is_http(const char *s) { return strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0; }

static bool has_other_scheme(const char *s) { return strstr(s, "://") && !is_http(s); }

/* A temporary name next to path: same directory (rename stays atomic), unlikely to collide. */
static void temporary_name(const char *path, char *out, size_t size) {
  snprintf(out, size, "%s.partial-%ld-%08x", path, (long)getpid(), (unsigned)rand());
}

static CURL *easy(const char *url, char *errbuf) {
  CURL *e = curl_easy_init();
  if (!e) return NULL;
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "shardflow");
  errbuf[0] = '\0';
  return e;
}

/* Runs a transfer; maps a failure to an error record about url. */
static int perform(CURL *e, const char *url, const char *what, const char *errbuf, sf_error *error) {
  CURLcode rc = curl_easy_perform(e);
  if (rc == CURLE_OK) return 0;
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  const char *text = errbuf[0] ? errbuf : curl_easy_strerror(rc);
  if (status == 404)
    return sf_error_set(error, SF_ENOENT, NULL, url, NULL, -1, -1, "%s: HTTP 404 — no such object (%s)", what, text);
  if (status == 405 || status == 501)
    return sf_error_set(error, SF_ENET, NULL, url, NULL, -1, -1,
                        "%s: HTTP %ld — the server does not accept PUT/MOVE; enable WebDAV (nginx: dav_methods "
                        "PUT MOVE DELETE)", what, status);
  return sf_error_set(error, SF_ENET, NULL, url, NULL, -1, -1, "%s failed: %s%s", what, text,
                      status >= 400 ? " — check the URL and the server's access rules" : "");
}

typedef struct sink {
  FILE *file;       /* download target, or NULL when only checksumming */
  uLong crc;
  curl_off_t bytes;
} sink;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *opaque) {
  sink *s = opaque;
  size_t n = size * nmemb;
  if (s->file && fwrite(ptr, 1, n, s->file) != n) return 0;
  s->crc = crc32(s->crc, (const Bytef *)ptr, (uInt)n);
  s->bytes += (curl_off_t)n;
  return n;
}

/* GET url into s; checks the length against Content-Length when the server sends one. */
static int get(const char *url, sink *s, sf_error *error) {
  char errbuf[CURL_ERROR_SIZE];
  CURL *e = easy(url, errbuf);
  if (!e) return SF_ENOMEM;
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  int r = perform(e, url, "download", errbuf, error);
  curl_off_t expected = -1;
  if (r == 0) curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &expected);
  curl_easy_cleanup(e);
  if (r == 0 && expected >= 0 && expected != s->bytes)
    r = sf_error_set(error, SF_EFORMAT, NULL, url, NULL, s->bytes, -1,
                     "the transfer ended after %lld of %lld bytes — try again", (long long)s->bytes,
                     (long long)expected);
  return r;
}

static int download(const char *src, const char *dst, sf_error *error) {
  char tmp[4096];
  temporary_name(dst, tmp, sizeof tmp);
  sink s = {.file = fopen(tmp, "wb"), .crc = crc32(0, NULL, 0)};
  if (!s.file)
    return sf_error_set(error, SF_EIO, NULL, dst, NULL, -1, -1, "cannot create %s: %s", tmp, strerror(errno));
  int r = get(src, &s, error);
  if (fflush(s.file) != 0 || fsync(fileno(s.file)) != 0)
    r = r ? r : sf_error_set(error, SF_EIO, NULL, dst, NULL, -1, -1, "cannot write %s: %s", tmp, strerror(errno));
  fclose(s.file);
  if (r == 0 && rename(tmp, dst) != 0)
    r = sf_error_set(error, SF_EIO, NULL, dst, NULL, -1, -1, "cannot rename onto %s: %s", dst, strerror(errno));
  if (r < 0) unlink(tmp);
  return r;
}

/* CRC-32 and length of a local file. */
static int checksum_file(const char *path, uLong *crc, curl_off_t *bytes, sf_error *error) {
  FILE *f = fopen(path, "rb");
  if (!f) return sf_error_set(error, errno == ENOENT ? SF_ENOENT : SF_EIO, NULL, path, NULL, -1, -1,
                              "cannot open: %s", strerror(errno));
  static unsigned char buf[1 << 16];
  *crc = crc32(0, NULL, 0);
  *bytes = 0;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    *crc = crc32(*crc, buf, (uInt)n);
    *bytes += (curl_off_t)n;
  }
  bool bad = ferror(f);
  fclose(f);
  return bad ? sf_error_set(error, SF_EIO, NULL, path, NULL, *bytes, -1, "read error") : 0;
}

static int delete_url(const char *url) {
  char errbuf[CURL_ERROR_SIZE];
  CURL *e = easy(url, errbuf);
  if (!e) return SF_ENOMEM;
  curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
  curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  CURLcode rc = curl_easy_perform(e);
  curl_easy_cleanup(e);
  return rc == CURLE_OK ? 0 : SF_ENET;
}

static int upload(const char *src, const char *dst, bool verify, sf_error *error) {
  uLong crc = 0;
  curl_off_t size = 0;
  int r = checksum_file(src, &crc, &size, error);
  if (r < 0) return r;
  FILE *f = fopen(src, "rb");
  if (!f) return sf_error_set(error, SF_EIO, NULL, src, NULL, -1, -1, "cannot open: %s", strerror(errno));
  char tmp[4096], errbuf[CURL_ERROR_SIZE];
  temporary_name(dst, tmp, sizeof tmp);
  CURL *e = easy(tmp, errbuf);
  if (!e) {
    fclose(f);
    return SF_ENOMEM;
  }
  curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(e, CURLOPT_READDATA, f);
  curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, size);
  r = perform(e, dst, "upload (PUT)", errbuf, error);
  curl_easy_cleanup(e);
  fclose(f);
  if (r == 0) {
    /* MOVE makes the object appear under its name at once (RFC 4918 9.9). */
    char destination[4200];
    snprintf(destination, sizeof destination, "Destination: %s", dst);
    struct curl_slist *headers = curl_slist_append(NULL, destination);
    headers = curl_slist_append(headers, "Overwrite: T");
    e = easy(tmp, errbuf);
    if (!e || !headers) {
      r = SF_ENOMEM;
    } else {
      curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "MOVE");
      curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
      r = perform(e, dst, "upload (MOVE into place)", errbuf, error);
    }
    curl_easy_cleanup(e);
    curl_slist_free_all(headers);
  }
  if (r < 0) {
    delete_url(tmp);
    return r;
  }
  if (!verify) return 0;
  sink s = {.crc = crc32(0, NULL, 0)};
  r = get(dst, &s, error);
  if (r == 0 && (s.bytes != size || s.crc != crc)) {
    delete_url(dst);
    r = sf_error_set(error, SF_EFORMAT, NULL, dst, NULL, -1, -1,
                     "read back %lld bytes with CRC-32 %08lx, sent %lld bytes with %08lx: the object was "
                     "removed; try again",
                     (long long)s.bytes, (unsigned long)s.crc, (long long)size, (unsigned long)crc);
  }
  return r;
}

static int copy_local(const char *src, const char *dst, sf_error *error) {
  FILE *in = fopen(src, "rb");
  if (!in) return sf_error_set(error, errno == ENOENT ? SF_ENOENT : SF_EIO, NULL, src, NULL, -1, -1,
                               "cannot open: %s", strerror(errno));
  char tmp[4096];
  temporary_name(dst, tmp, sizeof tmp);
  FILE *out = fopen(tmp, "wb");
  int r = 0;
  if (!out) {
    r = sf_error_set(error, SF_EIO, NULL, dst, NULL, -1, -1, "cannot create %s: %s", tmp, strerror(errno));
  } else {
    static unsigned char buf[1 << 16];
    size_t n;
    while (r == 0 && (n = fread(buf, 1, sizeof buf, in)) > 0)
      if (fwrite(buf, 1, n, out) != n) r = sf_error_set(error, SF_EIO, NULL, dst, NULL, -1, -1, "write failed");
    if (r == 0 && (ferror(in) || fflush(out) != 0 || fsync(fileno(out)) != 0))
      r = sf_error_set(error, SF_EIO, NULL, dst, NULL, -1, -1, "copy failed: %s", strerror(errno));
    fclose(out);
    if (r == 0 && rename(tmp, dst) != 0)
      r = sf_error_set(error, SF_EIO, NULL, dst, NULL, -1, -1, "cannot rename onto it: %s", strerror(errno));
    if (r < 0) unlink(tmp);
  }
  fclose(in);
  return r;
}

int sf_storage_copy(const char *src, const char *dst, bool verify, sf_error *error) {
  if (!src || !dst) return sf_error_set(error, SF_EINVAL, NULL, NULL, NULL, -1, -1, "copy needs a source and a target");
  if (has_other_scheme(src) || has_other_scheme(dst))
    return sf_error_set(error, SF_EINVAL, NULL, has_other_scheme(src) ? src : dst, NULL, -1, -1,
                        "only local paths and http(s):// URLs can be copied for now");
  if (is_http(src) && is_http(dst))
    return sf_error_set(error, SF_EINVAL, NULL, dst, NULL, -1, -1, "copy between two URLs: go through a local file");
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (is_http(src)) return download(src, dst, error);
  if (is_http(dst)) return upload(src, dst, verify, error);
  return copy_local(src, dst, error);
}
