/* engine/core/strbuf.c: the growable string — appends, formatting, truncation, hand-over, out of memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "strbuf.h"
#include "shardflow/error.h"

static void test_append(void **state) {
  sf_strbuf b = {0};
  assert_int_equal(sf_strbuf_add(&b, "stages:"), 0);
  assert_int_equal(sf_strbuf_append(&b, "\n  - x\0y", 8), 0); /* bytes, NULs included */
  assert_int_equal(b.len, 15);
  assert_memory_equal(b.data, "stages:\n  - x\0y", 16); /* and the terminating NUL */
  size_t len = 0;
  char *s = sf_strbuf_take(&b, &len);
  assert_int_equal(len, 15);
  assert_null(b.data);
  assert_int_equal(b.len, 0);
  free(s);
}

static void test_appendf_grows(void **state) {
  sf_strbuf b = {0};
  char want[20000] = "";
  size_t n = 0;
  for (int i = 0; i < 2000; i++) {
    assert_int_equal(sf_strbuf_appendf(&b, "%d,", i), 0);
    n += (size_t)snprintf(want + n, sizeof want - n, "%d,", i);
  }
  /* One piece larger than everything so far: the first attempt cannot fit it. */
  char big[30000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  assert_int_equal(sf_strbuf_appendf(&b, "[%s]", big), 0);
  assert_int_equal(b.len, n + sizeof big + 1);
  assert_memory_equal(b.data, want, n);
  assert_int_equal(b.data[n], '[');
  assert_int_equal(b.data[b.len - 1], ']');
  assert_int_equal(b.data[b.len], '\0');
  assert_true(b.cap > b.len);
  sf_strbuf_clear(&b);
  assert_null(b.data);
}

static void test_truncate(void **state) {
  sf_strbuf b = {0};
  sf_strbuf_add(&b, "shard-");
  size_t mark = b.len;
  sf_strbuf_add(&b, "000");
  sf_strbuf_truncate(&b, mark);
  assert_string_equal(b.data, "shard-");
  sf_strbuf_add(&b, "001");
  assert_string_equal(b.data, "shard-001");
  sf_strbuf_truncate(&b, 100); /* longer than the string: nothing */
  assert_string_equal(b.data, "shard-001");
  sf_strbuf_clear(&b);
}

static void test_take_empty(void **state) {
  sf_strbuf b = {0};
  size_t len = 7;
  char *s = sf_strbuf_take(&b, &len);
  assert_non_null(s);
  assert_string_equal(s, "");
  assert_int_equal(len, 0);
  free(s);
  sf_strbuf_clear(&b); /* clearing an empty string is fine */
}

/* An append that cannot be had (here: a size that would overflow) fails, and so does everything after it. */
static void test_out_of_memory_is_sticky(void **state) {
  sf_strbuf b = {0};
  sf_strbuf_add(&b, "kept so far");
  assert_int_equal(sf_strbuf_append(&b, "x", SIZE_MAX - 8), SF_ENOMEM);
  assert_true(b.failed);
  assert_string_equal(b.data, "kept so far"); /* untouched */
  assert_int_equal(sf_strbuf_add(&b, "more"), SF_ENOMEM);
  assert_int_equal(sf_strbuf_appendf(&b, "%d", 1), SF_ENOMEM);
  assert_string_equal(b.data, "kept so far");
  size_t len = 7;
  assert_null(sf_strbuf_take(&b, &len)); /* one check at the end; the memory is freed */
  assert_int_equal(len, 0);
  assert_null(b.data);
  assert_false(b.failed); /* reset: usable again */
  assert_int_equal(sf_strbuf_add(&b, "again"), 0);
  sf_strbuf_clear(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_append),
      cmocka_unit_test(test_appendf_grows),
      cmocka_unit_test(test_truncate),
      cmocka_unit_test(test_take_empty),
      cmocka_unit_test(test_out_of_memory_is_sticky),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
