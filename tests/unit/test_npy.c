/* Unit tests for engine/codec/npy.c: .npy 1.0 headers and data for every dtype, strided views, errors;
 * the reader: a zero-copy view when aligned, a copy when not, a written file read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "npy.h"

static char dir[256];

static int setup(void **state) {
  snprintf(dir, sizeof dir, "/tmp/sf_test_npy_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static uint8_t *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *data = malloc((size_t)n + 1);
  assert_non_null(data);
  assert_int_equal(fread(data, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return data;
}

/*
 * Writes t and checks the file against the format spec: magic, version 1.0,
 * little-endian header length, the dict text exactly, space padding, '\n'
 * before the data, data offset a multiple of 64, then the expected bytes.
 */
static void check_file(const sf_tensor *t, const char *dict, const void *data, size_t data_size) {
  char path[300];
  snprintf(path, sizeof path, "%s/t.npy", dir);
  sf_error err = {0};
  assert_int_equal(sf_npy_write(path, t, &err), 0);
  size_t size;
  uint8_t *f = slurp(path, &size);
  assert_true(size >= 10);
  assert_memory_equal(f, "\x93NUMPY\x01\x00", 8);
  size_t hlen = f[8] | (size_t)f[9] << 8;
  size_t start = 10 + hlen;
  assert_int_equal(start % 64, 0);
  assert_int_equal(size, start + data_size);
  size_t dlen = strlen(dict);
  assert_true(hlen > dlen);
  assert_memory_equal(f + 10, dict, dlen);
  for (size_t i = 10 + dlen; i < start - 1; i++) assert_int_equal(f[i], ' ');
  assert_int_equal(f[start - 1], '\n');
  if (data_size) assert_memory_equal(f + start, data, data_size);
  free(f);
}

static void make(sf_tensor *t, sf_dtype dtype, int ndim, const int64_t *shape, const void *data) {
  assert_int_equal(sf_tensor_alloc(t, dtype, ndim, shape), 0);
  if (sf_tensor_nbytes(t)) memcpy(sf_tensor_data(t), data, sf_tensor_nbytes(t));
}

static void test_uint8_2d(void **state) {
  const uint8_t v[6] = {1, 2, 3, 250, 251, 252};
  int64_t shape[2] = {2, 3};
  sf_tensor t;
  make(&t, SF_DTYPE_UINT8, 2, shape, v);
  check_file(&t, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", v, sizeof v);
  sf_tensor_clear(&t);
}

static void test_int32_1d(void **state) {
  const int32_t v[5] = {-1, 0, 1, 2147483647, -2147483647 - 1};
  int64_t shape[1] = {5};
  sf_tensor t;
  make(&t, SF_DTYPE_INT32, 1, shape, v);
  /* little-endian bytes, written out by hand */
  const uint8_t le[20] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 0, 0, 0,
                          0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0x80};
  check_file(&t, "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }", le, sizeof le);
  sf_tensor_clear(&t);
}

static void test_int64_scalar(void **state) {
  const int64_t v = 0x0102030405060708LL;
  sf_tensor t;
  make(&t, SF_DTYPE_INT64, 0, NULL, &v);
  const uint8_t le[8] = {8, 7, 6, 5, 4, 3, 2, 1};
  check_file(&t, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", le, sizeof le);
  sf_tensor_clear(&t);
}

static void test_float32_4d(void **state) {
  float v[2 * 3 * 4 * 5];
  for (int i = 0; i < 120; i++) v[i] = (float)i * 0.5f - 3.0f;
  int64_t shape[4] = {2, 3, 4, 5};
  sf_tensor t;
  make(&t, SF_DTYPE_FLOAT32, 4, shape, v);
  check_file(&t, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4, 5), }", v, sizeof v);
  sf_tensor_clear(&t);
}

static void test_bfloat16_raw_bits(void **state) {
  const uint16_t v[3] = {0x3f80, 0xbf80, 0x7f80}; /* 1.0, -1.0, +inf */
  int64_t shape[2] = {3, 1};
  sf_tensor t;
  make(&t, SF_DTYPE_BFLOAT16, 2, shape, v);
  const uint8_t le[6] = {0x80, 0x3f, 0x80, 0xbf, 0x80, 0x7f};
  check_file(&t, "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 1), }", le, sizeof le);
  sf_tensor_clear(&t);
}

static void test_empty(void **state) {
  int64_t shape[2] = {0, 4};
  sf_tensor t;
  make(&t, SF_DTYPE_FLOAT32, 2, shape, NULL);
  check_file(&t, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", NULL, 0);
  sf_tensor_clear(&t);
}

/* A transposed view must come out in logical C order, not buffer order. */
static void test_strided_transpose(void **state) {
  const uint8_t v[6] = {0, 1, 2, 3, 4, 5}; /* [2,3] buffer */
  int64_t shape[2] = {2, 3};
  sf_tensor t;
  make(&t, SF_DTYPE_UINT8, 2, shape, v);
  t.shape[0] = 3, t.shape[1] = 2;
  t.strides[0] = 1, t.strides[1] = 3;
  const uint8_t want[6] = {0, 3, 1, 4, 2, 5};
  check_file(&t, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2), }", want, sizeof want);
  sf_tensor_clear(&t);
}

/* Every other element of an int64 row, at a byte offset into the buffer. */
static void test_strided_offset(void **state) {
  const int64_t v[8] = {10, 11, 12, 13, 14, 15, 16, 17};
  int64_t shape[1] = {8};
  sf_tensor t;
  make(&t, SF_DTYPE_INT64, 1, shape, v);
  t.offset = 8;
  t.shape[0] = 3;
  t.strides[0] = 2;
  const int64_t want[3] = {11, 13, 15};
  check_file(&t, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", want, sizeof want);
  sf_tensor_clear(&t);
}

/* Header lengths that land exactly on 64 get a full 64 bytes of padding (numpy's rule). */
static void test_header_alignment_all_ndims(void **state) {
  for (int nd = 0; nd <= SF_TENSOR_MAX_DIMS; nd++) {
    int64_t shape[SF_TENSOR_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = (i % 2) ? 1 : 2;
    sf_tensor t;
    assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, nd, shape), 0);
    memset(sf_tensor_data(&t), 7, sf_tensor_nbytes(&t));
    char path[300];
    snprintf(path, sizeof path, "%s/a.npy", dir);
    assert_int_equal(sf_npy_write(path, &t, NULL), 0);
    size_t size;
    uint8_t *f = slurp(path, &size);
    size_t hlen = f[8] | (size_t)f[9] << 8;
    assert_int_equal((10 + hlen) % 64, 0);
    assert_int_equal(size, 10 + hlen + sf_tensor_nbytes(&t));
    free(f);
    sf_tensor_clear(&t);
  }
}

static void test_unwritable_path(void **state) {
  int64_t shape[1] = {2};
  sf_tensor t;
  const uint8_t v[2] = {1, 2};
  make(&t, SF_DTYPE_UINT8, 1, shape, v);
  char path[300];
  snprintf(path, sizeof path, "%s/no/such/dir/x.npy", dir);
  sf_error err;
  memset(&err, 0, sizeof err);
  assert_int_equal(sf_npy_write(path, &t, &err), SF_EIO);
  assert_int_equal(err.code, SF_EIO);
  assert_string_equal(err.url, path);
  assert_non_null(strstr(err.message, path));
  assert_int_equal(sf_npy_write(path, &t, NULL), SF_EIO); /* error may be NULL */
  sf_tensor_clear(&t);
}

static void test_unknown_dtype(void **state) {
  sf_tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = SF_DTYPE_COUNT_;
  char path[300];
  snprintf(path, sizeof path, "%s/bad.npy", dir);
  sf_error err;
  assert_int_equal(sf_npy_write(path, &t, &err), SF_EUNSUPPORTED);
  assert_string_equal(err.url, path);
  assert_int_equal(access(path, F_OK), -1); /* nothing half-written */
}

/* The reader on what the writer wrote: a view of the same buffer (data 64-byte aligned). */
static void test_read_back_is_a_view(void **state) {
  (void)state;
  sf_tensor t;
  const int64_t shape[2] = {3, 5};
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_FLOAT32, 2, shape), 0);
  float *v = sf_tensor_data(&t);
  for (int i = 0; i < 15; i++)
    v[i] = (float)i * 0.5f;
  char path[300];
  snprintf(path, sizeof path, "%s/back.npy", dir);
  sf_error e;
  assert_int_equal(sf_npy_write(path, &t, &e), 0);
  size_t size;
  uint8_t *bytes = slurp(path, &size);
  sf_buffer *b = sf_buffer_new(size + 1);
  memcpy(sf_buffer_data(b), bytes, size);
  sf_tensor got;
  assert_int_equal(sf_npy_read(b, 0, size, &got, &e), 0);
  assert_ptr_equal(got.buffer, b);
  assert_int_equal(got.offset % 64, 0); /* numpy's ARRAY_ALIGN */
  assert_int_equal(got.dtype, SF_DTYPE_FLOAT32);
  assert_int_equal(got.ndim, 2);
  assert_memory_equal(sf_tensor_data(&got), v, 15 * sizeof(float));
  sf_tensor_clear(&got);
  /* One byte later the floats are misaligned: the reader copies them into a buffer of its own. */
  memmove(sf_buffer_data(b) + 1, bytes, size);
  assert_int_equal(sf_npy_read(b, 1, size, &got, &e), 0);
  assert_ptr_not_equal(got.buffer, b);
  assert_int_equal((uintptr_t)sf_tensor_data(&got) % 4, 0);
  assert_memory_equal(sf_tensor_data(&got), v, 15 * sizeof(float));
  sf_tensor_clear(&got);
  sf_buffer_unref(&b);
  sf_tensor_clear(&t);
  free(bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uint8_2d),
      cmocka_unit_test(test_int32_1d),
      cmocka_unit_test(test_int64_scalar),
      cmocka_unit_test(test_float32_4d),
      cmocka_unit_test(test_bfloat16_raw_bits),
      cmocka_unit_test(test_empty),
      cmocka_unit_test(test_strided_transpose),
      cmocka_unit_test(test_strided_offset),
      cmocka_unit_test(test_header_alignment_all_ndims),
      cmocka_unit_test(test_unwritable_path),
      cmocka_unit_test(test_unknown_dtype),
      cmocka_unit_test(test_read_back_is_a_view),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
