/* Unit tests for engine/codec/pixels.c: decoded images' buffers come back from the pool by size class,
 * from any thread, large images bypass it, and a tensor outlives nothing it needs. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pixels.h"

static void test_reuse_within_size_class(void **state) {
  (void)state;
  sf_tensor a, b;
  assert_int_equal(sf_pixels_alloc(&a, SF_DTYPE_UINT8, 375, 500, 3), 0);
  assert_int_equal(a.shape[0], 375);
  assert_int_equal(a.shape[1], 500);
  assert_int_equal(a.shape[2], 3);
  assert_true(sf_tensor_is_contiguous(&a));
  assert_true(sf_buffer_size(a.buffer) >= sf_tensor_nbytes(&a));
  memset(sf_tensor_data(&a), 7, sf_tensor_nbytes(&a)); /* ASan: the whole tensor is ours */
  void *first = sf_tensor_data(&a);
  sf_tensor_clear(&a);
  /* 374x500x3 rounds to the same 64 KiB class: the idle buffer comes back, no fresh pages. */
  assert_int_equal(sf_pixels_alloc(&b, SF_DTYPE_UINT8, 374, 500, 3), 0);
  assert_ptr_equal(sf_tensor_data(&b), first);
  sf_tensor_clear(&b);
}

static void test_uint16(void **state) {
  (void)state;
  sf_tensor a;
  assert_int_equal(sf_pixels_alloc(&a, SF_DTYPE_UINT16, 10, 20, 1), 0);
  assert_int_equal(a.dtype, SF_DTYPE_UINT16);
  assert_int_equal(sf_tensor_nbytes(&a), 400);
  sf_tensor_clear(&a);
}

static void *clear_on_thread(void *t) {
  sf_tensor_clear(t);
  return NULL;
}

static void test_returned_from_another_thread(void **state) {
  (void)state;
  sf_tensor a, b;
  assert_int_equal(sf_pixels_alloc(&a, SF_DTYPE_UINT8, 224, 224, 3), 0);
  void *first = sf_tensor_data(&a);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, clear_on_thread, &a), 0);
  pthread_join(th, NULL);
  assert_int_equal(sf_pixels_alloc(&b, SF_DTYPE_UINT8, 224, 224, 3), 0);
  assert_ptr_equal(sf_tensor_data(&b), first);
  sf_tensor_clear(&b);
}

static void test_large_images_bypass_the_pool(void **state) {
  (void)state;
  sf_tensor a;
  assert_int_equal(sf_pixels_alloc(&a, SF_DTYPE_UINT8, 1000, 1000, 3), 0);
  assert_int_equal(sf_buffer_size(a.buffer), 3000000); /* a plain allocation, exactly the size */
  sf_tensor_clear(&a);
}

static void test_bad_shape(void **state) {
  (void)state;
  sf_tensor a;
  assert_true(sf_pixels_alloc(&a, SF_DTYPE_UINT8, -1, 4, 3) < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reuse_within_size_class),
      cmocka_unit_test(test_uint16),
      cmocka_unit_test(test_returned_from_another_thread),
      cmocka_unit_test(test_large_images_bypass_the_pool),
      cmocka_unit_test(test_bad_shape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
