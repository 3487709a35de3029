/* engine/core/url.c: URL kinds, %-decoding and encoding, redaction for messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "url.h"
#include "shardflow/error.h"

static void test_kinds(void **state) {
  static const struct {
    const char *url;
    sf_url_kind kind;
  } cases[] = {
      {"/data/shard-000.tar", SF_URL_PATH},
      {"shard.tar", SF_URL_PATH},
      {"dir/a://b.tar", SF_URL_PATH}, /* a scheme starts the URL */
      {"1ab://x", SF_URL_PATH},       /* a scheme starts with a letter */
      {"", SF_URL_PATH},
      {NULL, SF_URL_PATH},
      {"file:///data/a.tar", SF_URL_FILE},
      {"http://h/a.tar", SF_URL_HTTP},
      {"https://h:8443/a.tar", SF_URL_HTTP},
      {"HTTP://h/a.tar", SF_URL_OTHER}, /* shard lists spell schemes in lower case */
      {"httpx://h/a.tar", SF_URL_OTHER},
      {"s3://bucket/key", SF_URL_STORE},
      {"gs://bucket/key", SF_URL_STORE},
      {"s3:/bucket", SF_URL_PATH},
      {"pipe:curl -s http://h/a.tar", SF_URL_PIPE},
      {"ftp://h/a.tar", SF_URL_OTHER},
      {"svn+ssh://h/a.tar", SF_URL_OTHER},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    if (sf_url_kind_of(cases[i].url) != cases[i].kind)
      fail_msg("%s: kind %d", cases[i].url, sf_url_kind_of(cases[i].url));
  }
  assert_true(sf_url_is_remote("http://h/a") && sf_url_is_remote("s3://b/k") && sf_url_is_remote("gs://b/k"));
  assert_false(sf_url_is_remote("file:///a") || sf_url_is_remote("/a") || sf_url_is_remote("pipe:cat a"));
  assert_true(sf_url_is_http("https://h/") && !sf_url_is_http("s3://b/"));
  assert_true(sf_url_is_store("gs://b/") && !sf_url_is_store("https://h/"));
  assert_true(sf_url_is_store("az://a/c/b") && sf_url_is_store("hf://datasets/o/n/p") && !sf_url_is_store("ab://x/y"));
  assert_true(sf_url_is_remote("az://a/c/b") && sf_url_is_remote("hf://datasets/o/n/p"));
  assert_int_equal(sf_url_scheme_length("svn+ssh://h"), 7);
  assert_int_equal(sf_url_scheme_length("https://h"), 5);
  assert_int_equal(sf_url_scheme_length("https:/h"), 0);
  assert_int_equal(sf_url_scheme_length("/a://b"), 0);
}

static void test_decode(void **state) {
  char out[64];
  assert_int_equal(sf_url_decode(out, "a%20b%2fc%2Bd+e", 15, false), 9);
  assert_string_equal(out, "a b/c+d+e");
  assert_int_equal(sf_url_decode(out, "a%20b%2Bd+e", 11, true), 7);
  assert_string_equal(out, "a b+d e"); /* form encoding: '+' is a space, %2B a plus */
  /* A '%' without two hex digits stays, also at the very end and when n cuts the escape. */
  sf_url_decode(out, "100%-%zz-%4", 11, false);
  assert_string_equal(out, "100%-%zz-%4");
  sf_url_decode(out, "%41%42", 4, false);
  assert_string_equal(out, "A%");
  /* Bytes come back one by one (UTF-8), and %00 is a byte too. */
  assert_int_equal(sf_url_decode(out, "%C3%A9%00x", 10, false), 4);
  assert_memory_equal(out, "\xc3\xa9\0x", 4);
  /* In place. */
  char s[] = "s3%3A%2F%2Fb";
  sf_url_decode(s, s, strlen(s), false);
  assert_string_equal(s, "s3://b");
}

static char *encode(const char *s, bool keep_slash) {
  sf_strbuf b = {0};
  assert_int_equal(sf_url_encode(&b, s, strlen(s), keep_slash), 0);
  return sf_strbuf_take(&b, NULL);
}

static void test_encode(void **state) {
  static const struct {
    const char *in;
    bool keep_slash;
    const char *out;
  } cases[] = {
      {"AZaz09-._~", false, "AZaz09-._~"},
      {"train set/shard+1.tar", true, "train%20set/shard%2B1.tar"},
      {"train set/shard+1.tar", false, "train%20set%2Fshard%2B1.tar"},
      {"a&b<c>\"'=?#%", false, "a%26b%3Cc%3E%22%27%3D%3F%23%25"},
      {"\xc3\xa9\x7f", false, "%C3%A9%7F"},
      {"", false, ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *got = encode(cases[i].in, cases[i].keep_slash);
    assert_string_equal(got, cases[i].out);
    /* Decoding gives the input back. */
    char back[64];
    sf_url_decode(back, got, strlen(got), false);
    assert_string_equal(back, cases[i].in);
    free(got);
  }
  /* Appends after what is there. */
  sf_strbuf b = {0};
  sf_strbuf_add(&b, "prefix=");
  sf_url_encode(&b, "a b", 3, false);
  assert_string_equal(b.data, "prefix=a%20b");
  sf_strbuf_clear(&b);
}

static void test_redact(void **state) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"https://user:pw@host:8443/a.tar", "https://***@host:8443/a.tar"},
      {"https://host/a@b.tar", "https://host/a@b.tar"}, /* an '@' in the path is not user information */
      {"https://h/a.tar?X-Amz-Signature=abc&X-Amz-Date=2024&X-Amz-Credential=AK%2F1",
       "https://h/a.tar?X-Amz-Signature=***&X-Amz-Date=2024&X-Amz-Credential=***"},
      {"https://h/a.tar?access_token=t0k&part=1#frag", "https://h/a.tar?access_token=***&part=1#frag"},
      {"https://h/a.tar?list-type=2&prefix=a%20b", "https://h/a.tar?list-type=2&prefix=a%20b"},
      {"https://h/a.tar?password=p#token=x", "https://h/a.tar?password=***#token=x"}, /* the fragment is not a query */
      {"/data/token=x.tar", "/data/token=x.tar"},
      {"s3://bucket/key", "s3://bucket/key"},
      /* An Azure SAS token: its signature is "sig"; "signedversion"-like names are not secrets. */
      {"az://a/c/b.tar?sv=2019-02-02&sr=c&sig=AbC%2B%3D&se=2099", "az://a/c/b.tar?sv=2019-02-02&sr=c&sig=***&se=2099"},
      {"https://h/?sigma=1", "https://h/?sigma=1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char out[256];
    sf_url_redact(cases[i].in, out, sizeof out);
    assert_string_equal(out, cases[i].out);
  }
  /* A small buffer: cut, NUL-terminated, never a secret's start. */
  char small[20];
  sf_url_redact("https://u:secret@h/a.tar", small, sizeof small);
  assert_string_equal(small, "https://***@h/a.tar");
  char tiny[12];
  sf_url_redact("https://h/?token=abcdef", tiny, sizeof tiny);
  assert_string_equal(tiny, "https://h/?");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kinds),
      cmocka_unit_test(test_decode),
      cmocka_unit_test(test_encode),
      cmocka_unit_test(test_redact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
