/* Atomic copies between local files and object stores: http(s) (PUT + WebDAV MOVE; GET + rename), s3:// and
 * gs:// (signed PUT, or a multipart upload for files larger than one part; signed GET + rename), az:// (Put Blob,
 * or Put Block + Put Block List), hf:// (downloads only). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "curl_lib.h"
#include <openssl/evp.h>
#include <zlib.h>

#include "files.h"
#include "http.h"
#include "object_store.h"
#include "strbuf.h"
#include "url.h"
#include "shardflow/storage.h"

/* A URL that is neither a local path nor one this module copies to or from (file://, ftp://, ...). */
static bool has_other_scheme(const char *s) {
  sf_url_kind k = sf_url_kind_of(s);
  return k == SF_URL_FILE || k == SF_URL_OTHER;
}

/*
 * Creates the temporary file of a copy to the local path: a fresh, unguessable name next to path (rename stays
 * atomic; engine/core/files.h), its directory made if missing; partials of killed copies there are removed
 * first. Returns the open file, or NULL with errno set.
 */
static FILE *open_partial(const char *path, char *tmp, size_t size) {
  sf_remove_stale_partials(path);
  int fd = sf_file_create_partial(path, tmp, size, 0666);
  if (fd < 0) {
    snprintf(tmp, size, "a partial file next to %s", path);
    errno = -fd;
    return NULL;
  }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    int e = errno;
    close(fd);
    unlink(tmp);
    errno = e;
  }
  return f;
}

/* The shared transfer settings (engine/http.h); an HTTP error status fails the transfer. */
static CURL *easy(const char *url, bool follow_redirects, char *errbuf) {
  CURL *e;
  if (sf_http_easy_new(url, &(sf_http_options){.follow_redirects = follow_redirects, .error_text = errbuf}, &e) < 0)
    return NULL;
  curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L);
  return e;
}

/* Runs a transfer; maps a failure to an error record about url. */
static int perform(CURL *e, const char *url, const char *what, const char *errbuf, sf_error *error) {
  CURLcode rc = curl_easy_perform(e);
  if (rc == CURLE_OK) return 0;
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  const char *text = sf_http_error_text(rc, errbuf);
  if (status == 404)
    return sf_error_set(error, SF_ENOENT, SF_AT(.url = url), "%s: HTTP 404 — no such object (%s)", what, text);
  if (status == 405 || status == 501)
    return sf_error_set(error, SF_ENET, SF_AT(.url = url),
                        "%s: HTTP %ld — the server does not accept PUT/MOVE; enable WebDAV (nginx: dav_methods "
                        "PUT MOVE DELETE)",
                        what, status);
  return sf_error_set(error, SF_ENET, SF_AT(.url = url), "%s failed: %s%s", what, text,
                      status >= 400 ? " — check the URL and the server's access rules" : "");
}

typedef struct sink {
  FILE *file;       /* download target, or NULL when only checksumming */
  uLong crc;
  curl_off_t bytes;
  CURL *easy;       /* store downloads: an error status sends the body to errors instead */
  sf_http_body errors;
} sink;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *opaque) {
  sink *s = opaque;
  size_t n = size * nmemb;
  long status = 0;
  if (s->easy && curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK && status >= 300) {
    (void)sf_http_body_write(ptr, size, nmemb, &s->errors); /* best effort: the message without it is still clear */
    return n;
  }
  if (s->file && fwrite(ptr, 1, n, s->file) != n) return 0;
  s->crc = crc32(s->crc, (const Bytef *)ptr, (uInt)n);
  s->bytes += (curl_off_t)n;
  return n;
}

/* GET url into s; checks the length against Content-Length when the server sends one. */
static int get(const char *url, sink *s, sf_error *error) {
  char errbuf[CURL_ERROR_SIZE];
  CURL *e = easy(url, true, errbuf);
  if (!e) return SF_ENOMEM;
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
  int r = perform(e, url, "download", errbuf, error);
  curl_off_t expected = -1;
  if (r == 0) curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &expected);
  curl_easy_cleanup(e);
  if (r == 0 && expected >= 0 && expected != s->bytes)
    r = sf_error_set(error, SF_EFORMAT, SF_AT(.url = url, .offset = s->bytes),
                     "the transfer ended after %lld of %lld bytes — try again", (long long)s->bytes,
                     (long long)expected);
  return r;
}

/* Signed GET of a store's object into s; store errors explained by sf_object_http_error. */
static int store_get(const char *url, sink *s, sf_error *error) {
  sf_object_request req;
  int r = sf_object_request_prepare(url, "GET", NULL, NULL, &req, error);
  if (r < 0) return r;
  char errbuf[CURL_ERROR_SIZE];
  CURL *e = easy(req.url, req.follow_redirects, errbuf);
  if (!e) {
    sf_object_request_clear(&req);
    return SF_ENOMEM;
  }
  curl_easy_setopt(e, CURLOPT_FAILONERROR, 0L);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, req.headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
  s->easy = e;
  CURLcode rc = curl_easy_perform(e);
  long status = 0;
  curl_off_t expected = -1;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &expected);
  s->easy = NULL;
  if (rc != CURLE_OK) {
    char shown[512];
    sf_url_redact(req.url, shown, sizeof shown);
    r = sf_error_set(error, SF_ENET, SF_AT(.url = url, .offset = s->bytes),
                     "download from %s failed: %s — check the endpoint", shown, sf_http_error_text(rc, errbuf));
  } else if (status >= 300) {
    r = sf_object_http_error(url, "download", status, s->errors.text.data, s->errors.text.len, &req, error);
  } else if (expected >= 0 && expected != s->bytes) {
    r = sf_error_set(error, SF_EFORMAT, SF_AT(.url = url, .offset = s->bytes),
                     "the transfer ended after %lld of %lld bytes — try again", (long long)s->bytes,
                     (long long)expected);
  }
  curl_easy_cleanup(e);
  sf_object_request_clear(&req);
  sf_strbuf_clear(&s->errors.text);
  return r;
}

static int download(const char *src, const char *dst, sf_error *error) {
  char tmp[4096];
  sink s = {.file = open_partial(dst, tmp, sizeof tmp), .crc = crc32(0, NULL, 0), .errors.max = 4096};
  if (!s.file) return sf_error_set(error, SF_EIO, SF_AT(.url = dst), "cannot create %s: %s", tmp, strerror(errno));
  int r = sf_url_is_store(src) ? store_get(src, &s, error) : get(src, &s, error);
  if (fflush(s.file) != 0 || fsync(fileno(s.file)) != 0)
    r = r ? r : sf_error_set(error, SF_EIO, SF_AT(.url = dst), "cannot write %s: %s", tmp, strerror(errno));
  fclose(s.file);
  if (r == 0 && rename(tmp, dst) != 0)
    r = sf_error_set(error, SF_EIO, SF_AT(.url = dst), "cannot rename onto %s: %s", dst, strerror(errno));
  if (r < 0) unlink(tmp);
  return r;
}

/* CRC-32 and length of a local file. */
static int checksum_file(const char *path, uLong *crc, curl_off_t *bytes, sf_error *error) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return sf_error_set(error, errno == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = path), "cannot open: %s",
                        strerror(errno));
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
  return bad ? sf_error_set(error, SF_EIO, SF_AT(.url = path, .offset = *bytes), "read error") : 0;
}

static int delete_url(const char *url) {
  char errbuf[CURL_ERROR_SIZE];
  CURL *e = easy(url, false, errbuf);
  if (!e) return SF_ENOMEM;
  curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
  curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  CURLcode rc = curl_easy_perform(e);
  curl_easy_cleanup(e);
  return rc == CURLE_OK ? 0 : SF_ENET;
}

/* Opens the file an upload sends, with its length and CRC-32 for the read-back. */
static int open_upload_source(const char *src, FILE **f, uLong *crc, curl_off_t *size, sf_error *error) {
  int r = checksum_file(src, crc, size, error);
  if (r < 0) return r;
  *f = fopen(src, "rb");
  if (!*f) return sf_error_set(error, SF_EIO, SF_AT(.url = src), "cannot open: %s", strerror(errno));
  return 0;
}

static int upload(const char *src, const char *dst, bool verify, sf_error *error) {
  uLong crc = 0;
  curl_off_t size = 0;
  FILE *f;
  int r = open_upload_source(src, &f, &crc, &size, error);
  if (r < 0) return r;
  char tmp[4096], errbuf[CURL_ERROR_SIZE];
  r = sf_partial_name(dst, tmp, sizeof tmp);
  if (r < 0) {
    fclose(f);
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = dst), "cannot name the upload's temporary object: %s",
                        strerror(-r));
  }
  CURL *e = easy(tmp, false, errbuf);
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
    e = easy(tmp, false, errbuf);
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
    r = sf_error_set(error, SF_EFORMAT, SF_AT(.url = dst),
                     "read back %lld bytes with CRC-32 %08lx, sent %lld bytes with %08lx: the object was "
                     "removed; try again",
                     (long long)s.bytes, (unsigned long)s.crc, (long long)size, (unsigned long)crc);
  }
  return r;
}

/* sf_object_call for uploads, tried up to 4 times when the store fails (5xx, 429) or the connection does. */
static int call_retrying(const char *url, const char *method, const char *query, const char *const *headers,
                         const void *body, size_t size, char **response, char **etag, sf_error *error) {
  int r = 0;
  for (int attempt = 0; attempt < 4; attempt++) {
    uint32_t jitter = 0; /* from the kernel: uploaders that failed together do not retry in step */
    if (attempt && sf_random_bytes(&jitter, sizeof jitter) < 0) jitter = 0;
    if (attempt) usleep((useconds_t)(200000u << attempt) + (useconds_t)(jitter % 100000));
    long status = 0;
    r = sf_object_call(url, method, query, headers, body, size, &status, response, NULL, etag, error);
    bool transient = (r == SF_ENET || r == SF_ETIMEDOUT) && (status == 0 || status == 429 || status >= 500);
    if (!transient) break;
  }
  return r;
}

/* Reads n bytes at offset of f into a new buffer (*out); SF_EIO names path. */
static int read_part(FILE *f, const char *path, long long offset, size_t n, char **out, sf_error *error) {
  *out = malloc(n ? n : 1);
  if (!*out) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = path), "out of memory for a %zu-byte part", n);
  if (fseeko(f, (off_t)offset, SEEK_SET) != 0 || fread(*out, 1, n, f) != n) {
    free(*out);
    *out = NULL;
    return sf_error_set(error, SF_EIO, SF_AT(.url = path, .offset = offset), "read error (did the file change?)");
  }
  return 0;
}

/*
 * Multipart upload (S3's protocol, which GCS's XML API speaks too): create, upload parts of part_size bytes
 * (each signed with its SHA-256), complete with the parts' ETags; any failure aborts the upload so no parts
 * are left behind.  The object appears only when the upload completes.
 */
static int store_multipart(FILE *f, const char *src, const char *dst, long long size, long long part_size,
                           sf_error *error) {
  char *body = NULL;
  int r = sf_object_call(dst, "POST", "uploads", NULL, NULL, 0, NULL, &body, NULL, NULL, error);
  if (r < 0) return r;
  char *upload_id = body ? sf_object_xml_text(body, strlen(body), "InitiateMultipartUploadResult", "UploadId") : NULL;
  free(body);
  if (!upload_id)
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = dst),
                        "the store did not return an UploadId for the multipart upload; does it support them?");
  long long parts = (size + part_size - 1) / part_size;
  sf_strbuf complete = {0};
  char *query = malloc(strlen(upload_id) + 64);
  if (!query) r = SF_ENOMEM;
  sf_strbuf_add(&complete, "<CompleteMultipartUpload>");
  for (long long i = 0; i < parts && r == 0; i++) {
    long long offset = i * part_size;
    size_t n = (size_t)(size - offset < part_size ? size - offset : part_size);
    char *part = NULL, *etag = NULL;
    r = read_part(f, src, offset, n, &part, error);
    snprintf(query, strlen(upload_id) + 64, "partNumber=%lld&uploadId=%s", i + 1, upload_id);
    if (!r) r = call_retrying(dst, "PUT", query, NULL, part, n, NULL, &etag, error);
    if (!r && (!etag || strlen(etag) > 150))
      r = sf_error_set(error, SF_EFORMAT, SF_AT(.url = dst, .offset = offset), "part %lld came back without an ETag",
                       i + 1);
    if (!r)
      sf_strbuf_appendf(&complete, "<Part><PartNumber>%lld</PartNumber><ETag>%s</ETag></Part>", i + 1, etag);
    free(part);
    free(etag);
  }
  if (!r && sf_strbuf_add(&complete, "</CompleteMultipartUpload>") < 0) r = SF_ENOMEM;
  if (!r) {
    snprintf(query, strlen(upload_id) + 64, "uploadId=%s", upload_id);
    body = NULL;
    r = call_retrying(dst, "POST", query, NULL, complete.data, complete.len, &body, NULL, error);
    /* CompleteMultipartUpload may answer 200 and put the failure in the body. */
    char *failed = body ? sf_object_xml_text(body, strlen(body), "Error", "Code") : NULL;
    if (!r && failed)
      r = sf_object_http_error(dst, "complete the multipart upload", 500, body, strlen(body), NULL, error);
    free(failed);
    free(body);
  }
  if (r == SF_ENOMEM) sf_error_set(error, r, SF_AT(.url = dst), "out of memory");
  if (r < 0 && query) {
    sf_error ignored;
    snprintf(query, strlen(upload_id) + 64, "uploadId=%s", upload_id);
    sf_object_call(dst, "DELETE", query, NULL, NULL, 0, NULL, NULL, NULL, NULL, &ignored);
  }
  sf_strbuf_clear(&complete);
  free(query);
  free(upload_id);
  return r;
}

/*
 * Azure block blob upload: Put Block for each part under a block id of the same length (base64 of "block-%09lld"),
 * then Put Block List commits them in order; the blob appears (or is replaced) only then.  Blocks left by a
 * failed upload are never committed, and Azure drops them after a week.
 */
static int az_blocks(FILE *f, const char *src, const char *dst, long long size, long long part_size,
                     sf_error *error) {
  long long parts = (size + part_size - 1) / part_size;
  if (parts > 50000)
    return sf_error_set(error, SF_ETOOBIG, SF_AT(.url = dst),
                        "%lld blocks of SF_OBJECT_PART_SIZE=%lld bytes: Azure takes at most 50,000; set a larger "
                        "SF_OBJECT_PART_SIZE",
                        parts, part_size);
  sf_strbuf list = {0};
  sf_strbuf_add(&list, "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
  int r = 0;
  for (long long i = 0; i < parts && r == 0; i++) {
    long long offset = i * part_size;
    size_t n = (size_t)(size - offset < part_size ? size - offset : part_size);
    char raw[16], id[32], query[96];
    snprintf(raw, sizeof raw, "block-%09lld", i);
    EVP_EncodeBlock((unsigned char *)id, (const unsigned char *)raw, 15); /* 15 bytes: 20 characters, no padding */
    snprintf(query, sizeof query, "comp=block&blockid=%s", id);
    char *part = NULL;
    r = read_part(f, src, offset, n, &part, error);
    if (!r) r = call_retrying(dst, "PUT", query, NULL, part, n, NULL, NULL, error);
    free(part);
    sf_strbuf_appendf(&list, "<Latest>%s</Latest>", id);
  }
  if (!r && sf_strbuf_add(&list, "</BlockList>") < 0)
    r = sf_error_set(error, SF_ENOMEM, SF_AT(.url = dst), "out of memory");
  if (!r) r = call_retrying(dst, "PUT", "comp=blocklist", NULL, list.data, list.len, NULL, NULL, error);
  sf_strbuf_clear(&list);
  return r;
}

/* Upload to a store: one signed PUT, or a multipart (block) upload past one part; then the read-back. */
static int store_upload(const char *src, const char *dst, bool verify, sf_error *error) {
  uLong crc = 0;
  curl_off_t size = 0;
  FILE *f;
  int r = open_upload_source(src, &f, &crc, &size, error);
  if (r < 0) return r;
  long long part_size = sf_object_part_size();
  bool az = strncmp(dst, "az://", 5) == 0;
  if ((long long)size <= part_size) {
    char *data = NULL;
    /* Azure's Put Blob says which kind of blob it makes (s3:// and gs:// take no such header). */
    static const char *const block_blob[] = {"x-ms-blob-type: BlockBlob", NULL};
    r = read_part(f, src, 0, (size_t)size, &data, error);
    if (!r) r = call_retrying(dst, "PUT", NULL, az ? block_blob : NULL, data, (size_t)size, NULL, NULL, error);
    free(data);
  } else if (az) {
    r = az_blocks(f, src, dst, (long long)size, part_size, error);
  } else {
    r = store_multipart(f, src, dst, (long long)size, part_size, error);
  }
  fclose(f);
  if (r < 0 || !verify) return r;
  sink s = {.crc = crc32(0, NULL, 0), .errors.max = 4096};
  r = store_get(dst, &s, error);
  if (r == 0 && (s.bytes != size || s.crc != crc))
    r = sf_error_set(error, SF_EFORMAT, SF_AT(.url = dst),
                     "read back %lld bytes with CRC-32 %08lx, sent %lld bytes with %08lx; try again",
                     (long long)s.bytes, (unsigned long)s.crc, (long long)size, (unsigned long)crc);
  return r;
}

static int copy_local(const char *src, const char *dst, sf_error *error) {
  FILE *in = fopen(src, "rb");
  if (!in)
    return sf_error_set(error, errno == ENOENT ? SF_ENOENT : SF_EIO, SF_AT(.url = src), "cannot open: %s",
                        strerror(errno));
  char tmp[4096];
  FILE *out = open_partial(dst, tmp, sizeof tmp);
  int r = 0;
  if (!out) {
    r = sf_error_set(error, SF_EIO, SF_AT(.url = dst), "cannot create %s: %s", tmp, strerror(errno));
  } else {
    static unsigned char buf[1 << 16];
    size_t n;
    while (r == 0 && (n = fread(buf, 1, sizeof buf, in)) > 0)
      if (fwrite(buf, 1, n, out) != n) r = sf_error_set(error, SF_EIO, SF_AT(.url = dst), "write failed");
    if (r == 0 && (ferror(in) || fflush(out) != 0 || fsync(fileno(out)) != 0))
      r = sf_error_set(error, SF_EIO, SF_AT(.url = dst), "copy failed: %s", strerror(errno));
    fclose(out);
    if (r == 0 && rename(tmp, dst) != 0)
      r = sf_error_set(error, SF_EIO, SF_AT(.url = dst), "cannot rename onto it: %s", strerror(errno));
    if (r < 0) unlink(tmp);
  }
  fclose(in);
  return r;
}

int sf_storage_copy(const char *src, const char *dst, bool verify, sf_error *error) {
  if (!src || !dst) return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "copy needs a source and a target");
  if (has_other_scheme(src) || has_other_scheme(dst))
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = has_other_scheme(src) ? src : dst),
                        "only local paths, http(s)://, s3://, gs://, az:// and hf:// URLs can be copied");
  if (sf_url_is_remote(src) && sf_url_is_remote(dst))
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = dst), "copy between two URLs: go through a local file");
  if (sf_url_is_remote(src)) return download(src, dst, error);
  if (sf_url_is_store(dst)) return store_upload(src, dst, verify, error);
  if (sf_url_is_http(dst)) return upload(src, dst, verify, error);
  return copy_local(src, dst, error);
}
