/* Unit tests for engine/core/dynlib.c: a library opened on first use, its functions resolved into a table, and
 * the two ways it can be missing (no such library, no such function) reported once, with what to do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <zlib.h>

#include "dynlib.h"
#include "shardflow/error.h"

/* zlib's crc32, opened by its soname (libz.so.1: on every Linux) and called through the table. */
static struct {
  __typeof__(&crc32) crc32;
  __typeof__(&zlibVersion) zlibVersion;
} z;
static const char *const z_symbols[] = {"crc32", "zlibVersion", NULL};

static void test_loads_and_resolves(void **state) {
  (void)state;
  static sf_dynlib lib = {.soname = "libz.so.1", .symbols = z_symbols, .fns = &z, .purpose = "test"};
  assert_int_equal(sf_dynlib_load(&lib), 0);
  assert_non_null(z.crc32);
  const unsigned char text[] = "123456789";
  assert_int_equal(z.crc32(0, text, 9), 0xCBF43926); /* the CRC-32 check value */
  assert_string_equal(z.zlibVersion(), zlibVersion());
  assert_int_equal(sf_dynlib_load(&lib), 0); /* once: the same answer */
}

static void test_missing_library(void **state) {
  (void)state;
  static const char *const none[] = {"f", NULL};
  static struct { void (*f)(void); } t;
  static sf_dynlib lib = {.soname = "libshardflow-no-such.so.9", .symbols = none, .fns = &t, .purpose = "decode X"};
  assert_int_equal(sf_dynlib_load(&lib), SF_EUNSUPPORTED);
  assert_non_null(strstr(lib.why, "cannot load libshardflow-no-such.so.9 to decode X"));
  assert_non_null(strstr(lib.why, "install"));
  assert_null(t.f);
  assert_int_equal(sf_dynlib_load(&lib), SF_EUNSUPPORTED);
}

static void test_missing_function(void **state) {
  (void)state;
  static const char *const names[] = {"crc32", "no_such_zlib_function", NULL};
  static struct { void (*a)(void), (*b)(void); } t;
  static sf_dynlib lib = {.soname = "libz.so.1", .symbols = names, .fns = &t, .purpose = "test"};
  assert_int_equal(sf_dynlib_load(&lib), SF_EUNSUPPORTED);
  assert_non_null(strstr(lib.why, "libz.so.1 has no no_such_zlib_function"));
  assert_null(lib.handle);
  assert_null(t.a); /* nothing left pointing into the library it closed */
}

/* Several sonames (a library's versions, newest first): the first that opens is used, and soname says which. */
static void test_first_soname_that_opens(void **state) {
  (void)state;
  static const char *const names[] = {"libshardflow-no-such.so.9", "libz.so.1", "libc.so.6", NULL};
  static struct {
    __typeof__(&crc32) crc32;
    __typeof__(&zlibVersion) zlibVersion;
  } t;
  static sf_dynlib lib = {.sonames = names, .symbols = z_symbols, .fns = &t, .purpose = "test"};
  assert_int_equal(sf_dynlib_load(&lib), 0);
  assert_string_equal(lib.soname, "libz.so.1");
  const unsigned char text[] = "123456789";
  assert_int_equal(t.crc32(0, text, 9), 0xCBF43926);
  assert_string_equal(t.zlibVersion(), zlibVersion());
}

/* None of the sonames opens: the message names each, and what to install. */
static void test_no_soname_opens(void **state) {
  (void)state;
  static const char *const names[] = {"libshardflow-no-such.so.9", "libshardflow-no-such.so.8", NULL};
  static const char *const none[] = {"f", NULL};
  static struct { void (*f)(void); } t;
  static sf_dynlib lib = {.sonames = names, .symbols = none, .fns = &t, .purpose = "decode X"};
  assert_int_equal(sf_dynlib_load(&lib), SF_EUNSUPPORTED);
  assert_non_null(strstr(lib.why, "cannot load libshardflow-no-such.so.9 or libshardflow-no-such.so.8 to decode X"));
  assert_non_null(strstr(lib.why, "install"));
  assert_null(t.f);
  assert_null(lib.handle);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loads_and_resolves),
      cmocka_unit_test(test_missing_library),
      cmocka_unit_test(test_missing_function),
      cmocka_unit_test(test_first_soname_that_opens),
      cmocka_unit_test(test_no_soname_opens),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
