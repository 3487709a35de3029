/* engine/io/tar_writer: shard patterns, shards cut by count and by size, long and UTF-8 keys, nothing left by a
 * failed or discarded write; read back by the engine's tar reader. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tar_reader.h"
#include "tar_writer.h"

static char dir[] = "/tmp/sf-tar-writer-XXXXXX";

static void test_pattern(void **state) {
  (void)state;
  static const struct {
    const char *text, *shard3;
  } good[] = {
      {"out/s-%06d.tar", "out/s-000003.tar"},
      {"s%d.tar", "s3.tar"},
      {"100%%-%3d.tar", "100%-  3.tar"},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    sf_shard_pattern p;
    sf_error err;
    char path[64];
    assert_int_equal(sf_shard_pattern_parse(&p, good[i].text, &err), 0);
    sf_shard_pattern_format(&p, 3, path, sizeof path);
    assert_string_equal(path, good[i].shard3);
  }
  static const char *const bad[] = {"out.tar", "out-%d-%d.tar", "out-%s.tar", "out-%x.tar", "out-%5.tar", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sf_shard_pattern p;
    sf_error err;
    assert_int_equal(sf_shard_pattern_parse(&p, bad[i], &err), SF_EINVAL);
    assert_non_null(strstr(err.message, "%d"));
  }
}

/* One expected sample of a shard: key and its fields' bytes, in member order. */
typedef struct expect {
  const char *key, *jpg, *cls;
} expect;

/* Reads path with the engine's reader and compares it with n expected samples; returns the file's size. */
static long check_shard(const char *path, const expect *want, int n) {
  sf_tar_reader *r;
  sf_error err;
  sf_shard_reader_options options = {0};
  assert_int_equal(sf_tar_reader_open(&r, path, &options, &err), 0);
  for (int i = 0; i < n; i++) {
    sf_sample *s = NULL;
    assert_int_equal(sf_tar_reader_next(r, &s, &err), 0);
    assert_string_equal(s->key, want[i].key);
    assert_int_equal(s->n_fields, 2);
    const char *bytes[2] = {want[i].jpg, want[i].cls};
    const char *names[2] = {"jpg", "cls"};
    for (int f = 0; f < 2; f++) {
      assert_string_equal(s->fields[f].name, names[f]);
      assert_int_equal(sf_tensor_nbytes(&s->fields[f].tensor), strlen(bytes[f]));
      if (bytes[f][0]) assert_memory_equal(sf_tensor_data(&s->fields[f].tensor), bytes[f], strlen(bytes[f]));
    }
    sf_sample_destroy(&s);
  }
  sf_sample *s = NULL;
  assert_int_equal(sf_tar_reader_next(r, &s, &err), SF_EOF);
  sf_tar_reader_close(&r);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return (long)st.st_size;
}

static const expect samples[] = {
    {"0000000", "first image", "0"},        {"0000001", "second", "1"}, {"0000002", "", "2"},
    {"0000003", "fourth image bytes", "3"}, {"0000004", "five", "14"},
};

/* Writes samples through a new writer into DIR/NAME-%d.tar; returns its stats. */
static sf_tar_writer_stats write_all(const char *name, int64_t max_count, int64_t max_bytes) {
  char text[256];
  snprintf(text, sizeof text, "%s/%s/s-%%d.tar", dir, name);
  sf_shard_pattern p;
  sf_error err;
  assert_int_equal(sf_shard_pattern_parse(&p, text, &err), 0);
  sf_tar_writer *w;
  assert_int_equal(sf_tar_writer_new(&w, &p, max_count, max_bytes, &err), 0);
  for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
    sf_tar_field fields[2] = {{"jpg", samples[i].jpg, strlen(samples[i].jpg)},
                              {"cls", samples[i].cls, strlen(samples[i].cls)}};
    assert_int_equal(sf_tar_writer_add(w, samples[i].key, fields, 2, &err), 0);
  }
  sf_tar_writer_stats stats;
  assert_int_equal(sf_tar_writer_close(&w, &stats, &err), 0);
  assert_null(w);
  return stats;
}

static long shard(const char *name, int n, const expect *want, int count) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s/s-%d.tar", dir, name, n);
  return check_shard(path, want, count);
}

static void test_cut_by_count(void **state) {
  (void)state;
  sf_tar_writer_stats st = write_all("count", 2, 1 << 30);
  assert_int_equal(st.shards, 3);
  assert_int_equal(st.samples, 5);
  long bytes = shard("count", 0, samples, 2) + shard("count", 1, samples + 2, 2) + shard("count", 2, samples + 4, 1);
  assert_int_equal(st.bytes, bytes); /* the count is the files' sizes: no padding after the end blocks */
  char path[256];
  snprintf(path, sizeof path, "%s/count/s-3.tar", dir);
  assert_int_not_equal(access(path, F_OK), 0);
}

static void test_cut_by_size(void **state) {
  (void)state;
  /* A sample is two members of at most 512 bytes: 2048 tar bytes; a shard has 1024 of end blocks. */
  sf_tar_writer_stats st = write_all("size", 100, 1024 + 2 * 2048);
  assert_int_equal(st.shards, 3);
  long bytes = shard("size", 0, samples, 2) + shard("size", 1, samples + 2, 2) + shard("size", 2, samples + 4, 1);
  assert_int_equal(st.bytes, bytes);
  assert_true(bytes <= 3 * (1024 + 2 * 2048));
  /* A sample bigger than the limit still gets a shard of its own. */
  st = write_all("tiny", 100, 1);
  assert_int_equal(st.shards, 5);
  for (int i = 0; i < 5; i++)
    shard("tiny", i, samples + i, 1);
}

static void test_errors(void **state) {
  (void)state;
  sf_shard_pattern p;
  sf_error err;
  sf_tar_writer *w = (sf_tar_writer *)&p;
  assert_int_equal(sf_shard_pattern_parse(&p, "x-%d.tar", &err), 0);
  assert_int_equal(sf_tar_writer_new(&w, &p, 0, 100, &err), SF_EINVAL);
  assert_null(w);
  /* A shard under a regular file: the error names the shard's path. */
  char file[256], text[300];
  snprintf(file, sizeof file, "%s/a_file", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(text, sizeof text, "%s/s-%%d.tar", file);
  assert_int_equal(sf_shard_pattern_parse(&p, text, &err), 0);
  assert_int_equal(sf_tar_writer_new(&w, &p, 10, 1 << 20, &err), 0);
  sf_tar_field field = {"cls", "1", 1};
  assert_int_equal(sf_tar_writer_add(w, "k", &field, 1, &err), SF_EIO);
  assert_non_null(strstr(err.url, "a_file/s-0.tar"));
  sf_tar_writer_stats st;
  assert_int_equal(sf_tar_writer_close(&w, &st, &err), 0);
  assert_int_equal(st.shards, 0);
  assert_int_equal(st.samples, 0);
}

/* The names in dir/sub, sorted and joined by ' ' ("" when empty or missing). */
static void listing(const char *sub, char *out, size_t size) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, sub);
  out[0] = '\0';
  struct dirent **names;
  int n = scandir(path, &names, NULL, alphasort);
  for (int i = 0; i < n; i++) {
    if (strcmp(names[i]->d_name, ".") != 0 && strcmp(names[i]->d_name, "..") != 0)
      snprintf(out + strlen(out), size - strlen(out), "%s%s", out[0] ? " " : "", names[i]->d_name);
    free(names[i]);
  }
  if (n >= 0) free(names);
}

static void test_long_and_utf8_keys(void **state) {
  (void)state;
  /* ustar holds 100 bytes of name (255 when split at a '/'); longer and non-ASCII names need pax headers. */
  char k150[151], deep[400] = "";
  memset(k150, 'k', 150);
  k150[150] = '\0';
  for (int i = 0; i < 40; i++)
    snprintf(deep + strlen(deep), sizeof deep - strlen(deep), "d%02d/", i);
  strcat(deep, "x");
  const expect want[] = {
      {"short", "a", "1"}, {k150, "b", "2"}, {deep, "c", "3"}, {"caf\xc3\xa9-\xe6\x97\xa5", "d", "4"}};
  char text[256];
  snprintf(text, sizeof text, "%s/long/s-%%d.tar", dir);
  sf_shard_pattern p;
  sf_error err;
  assert_int_equal(sf_shard_pattern_parse(&p, text, &err), 0);
  sf_tar_writer *w;
  assert_int_equal(sf_tar_writer_new(&w, &p, 100, 1 << 30, &err), 0);
  for (size_t i = 0; i < 4; i++) {
    sf_tar_field fields[2] = {{"jpg", want[i].jpg, 1}, {"cls", want[i].cls, 1}};
    assert_int_equal(sf_tar_writer_add(w, want[i].key, fields, 2, &err), 0);
  }
  sf_tar_writer_stats st;
  assert_int_equal(sf_tar_writer_close(&w, &st, &err), 0);
  assert_int_equal(shard("long", 0, want, 4), st.bytes); /* pax headers counted too */
  char names[512];
  listing("long", names, sizeof names);
  assert_string_equal(names, "s-0.tar"); /* the partial file was renamed, nothing else is left */
}

static void test_nothing_left_on_failure(void **state) {
  (void)state;
  char text[256], names[512];
  snprintf(text, sizeof text, "%s/discard/s-%%d.tar", dir);
  sf_shard_pattern p;
  sf_error err;
  assert_int_equal(sf_shard_pattern_parse(&p, text, &err), 0);
  /* Discarded part way through the second shard: the first stays whole, nothing of the second appears. */
  sf_tar_writer *w;
  assert_int_equal(sf_tar_writer_new(&w, &p, 2, 1 << 30, &err), 0);
  for (size_t i = 0; i < 3; i++) {
    sf_tar_field fields[2] = {{"jpg", samples[i].jpg, strlen(samples[i].jpg)},
                              {"cls", samples[i].cls, strlen(samples[i].cls)}};
    assert_int_equal(sf_tar_writer_add(w, samples[i].key, fields, 2, &err), 0);
  }
  listing("discard", names, sizeof names);
  assert_non_null(strstr(names, "s-1.tar.partial-")); /* the open shard is not under its name yet */
  assert_null(strstr(names, "s-1.tar "));
  sf_tar_writer_discard(&w);
  assert_null(w);
  sf_tar_writer_discard(&w); /* NULL is fine */
  listing("discard", names, sizeof names);
  assert_string_equal(names, "s-0.tar");
  shard("discard", 0, samples, 2);
  /* A writer whose add failed (a member name past PATH_MAX) removes its open shard at close. */
  snprintf(text, sizeof text, "%s/failed/s-%%d.tar", dir);
  assert_int_equal(sf_shard_pattern_parse(&p, text, &err), 0);
  assert_int_equal(sf_tar_writer_new(&w, &p, 10, 1 << 30, &err), 0);
  sf_tar_field field = {"cls", "1", 1};
  assert_int_equal(sf_tar_writer_add(w, "ok", &field, 1, &err), 0);
  char *huge = malloc(5000);
  assert_non_null(huge);
  memset(huge, 'h', 4999);
  huge[4999] = '\0';
  assert_int_equal(sf_tar_writer_add(w, huge, &field, 1, &err), SF_EINVAL);
  assert_non_null(strstr(err.message, "longer than"));
  free(huge);
  assert_int_equal(sf_tar_writer_add(w, "later", &field, 1, &err), SF_EINVAL); /* only close after an error */
  sf_tar_writer_stats st;
  assert_int_equal(sf_tar_writer_close(&w, &st, &err), 0);
  listing("failed", names, sizeof names);
  assert_string_equal(names, "");
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pattern),
      cmocka_unit_test(test_cut_by_count),
      cmocka_unit_test(test_cut_by_size),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_long_and_utf8_keys),
      cmocka_unit_test(test_nothing_left_on_failure),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) return 1;
  return failed;
}
