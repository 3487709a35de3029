/* The one libcurl set-up (engine/http.h): every transfer of the engine starts here. */
#include "http.h"

#include <pthread.h>
#include <stdlib.h>

#include "shardflow/error.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static CURLcode init_result;

static void init(void) { init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

int sf_http_init(const char **why) {
  const char *scratch;
  if (!why) why = &scratch;
  if (sf_curl_open(why) < 0) return SF_EUNSUPPORTED;
  pthread_once(&once, init);
  *why = "libcurl did not initialise (out of memory?)";
  return init_result == CURLE_OK ? 0 : SF_ENOMEM;
}

int sf_http_easy_new(const char *url, const sf_http_options *o, CURL **easy) {
  static const sf_http_options defaults = {0};
  if (!o) o = &defaults;
  *easy = NULL;
  if (sf_http_init(NULL) < 0) return SF_ENOMEM;
  CURL *e = curl_easy_init();
  if (!e) return SF_ENOMEM;
  const char *protocols = o->protocols ? o->protocols : "http,https";
  if (o->error_text) o->error_text[0] = '\0';
  int bad = 0;
  if (url) bad |= curl_easy_setopt(e, CURLOPT_URL, url);
  bad |= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
  bad |= curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, protocols);
  bad |= curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, protocols);
  bad |= curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, o->follow_redirects ? 1L : 0L);
  bad |= curl_easy_setopt(e, CURLOPT_MAXREDIRS, 10L);
  bad |= curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
  bad |= curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  bad |= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 10000L);
  bad |= curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, o->timeout_ms > 0 ? o->timeout_ms : 0L);
  bad |= curl_easy_setopt(e, CURLOPT_USERAGENT, "shardflow");
  if (o->error_text) bad |= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, o->error_text);
  /* libcurl reads no variable for its CA bundle (only the curl command does): a private CA given the
   * usual way, SSL_CERT_FILE, would otherwise be ignored. */
  const char *ca_file = o->ca_file && *o->ca_file ? o->ca_file : getenv("SSL_CERT_FILE");
  const char *ca_dir = o->ca_file && *o->ca_file ? NULL : getenv("SSL_CERT_DIR");
  if (ca_file && *ca_file) bad |= curl_easy_setopt(e, CURLOPT_CAINFO, ca_file);
  if (ca_dir && *ca_dir) bad |= curl_easy_setopt(e, CURLOPT_CAPATH, ca_dir);
  if (bad) {
    curl_easy_cleanup(e);
    return SF_EINVAL;
  }
  *easy = e;
  return 0;
}

const char *sf_http_error_text(CURLcode rc, const char *error_text) {
  return error_text && error_text[0] ? error_text : curl_easy_strerror(rc);
}

size_t sf_http_body_write(char *data, size_t size, size_t nmemb, void *opaque) {
  sf_http_body *b = opaque;
  size_t n = size * nmemb, keep = n;
  if (b->max && keep > b->max - b->text.len) {
    keep = b->max - b->text.len;
    b->too_big = true;
  }
  return sf_strbuf_append(&b->text, data, keep) == 0 ? n : 0;
}
