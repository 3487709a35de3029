/* Unit tests for engine/codec/normalize.c: the SIMD RGB -> float32 CHW row gives augment's table values bit for
 * bit (tables built here as augment builds them), forwards and flipped, at every row length, never reading past
 * the row. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "normalize.h"

/* Mean/std sets: ImageNet's, the CIFAR graph's, none (x/255) and a made-up one. */
static const double stats[][2][3] = {
    {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}},
    {{0.4914, 0.4822, 0.4465}, {0.2023, 0.1994, 0.2010}},
    {{0, 0, 0}, {1, 1, 1}},
    {{0.5, 0.25, 0.75}, {0.5, 0.125, 0.3}},
};

/* augment's init: x/255, then (x - mean)/std in double, rounded once to float; and the same as multiply-adds. */
static void tables(int k, float t[3][256], sf_normalize *nm) {
  for (int c = 0; c < 3; c++) {
    double m = stats[k][0][c], s = stats[k][1][c];
    for (int x = 0; x < 256; x++) t[c][x] = (float)((x / 255.0 - m) / s);
    nm->scale[c] = 1.0 / (255.0 * s);
    nm->shift[c] = -m / s;
  }
}

static void test_affine_matches_tables(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof stats / sizeof stats[0]; k++) {
    float t[3][256];
    sf_normalize nm;
    tables((int)k, t, &nm);
    for (int c = 0; c < 3; c++) assert_true(sf_normalize_matches(t[c], nm.scale[c], nm.shift[c]));
  }
  /* and the check can say no: one ulp off in an entry */
  float t[3][256];
  sf_normalize nm;
  tables(0, t, &nm);
  t[1][200] = nextafterf(t[1][200], 10.0f);
  assert_false(sf_normalize_matches(t[1], nm.scale[1], nm.shift[1]));
}

static void check_rows(int flip) {
  srand(7 + flip);
  for (size_t k = 0; k < sizeof stats / sizeof stats[0]; k++) {
    float t[3][256];
    sf_normalize nm;
    tables((int)k, t, &nm);
    for (int64_t n = 0; n <= 70; n++) {
      /* the row at the very end of its allocation: ASan sees any read past it */
      uint8_t *row = malloc((size_t)(3 * n) + 1);
      for (int64_t i = 0; i < 3 * n; i++) row[i] = (uint8_t)rand();
      const uint8_t *q = flip && n ? row + 3 * (n - 1) : row;
      ptrdiff_t step = flip ? -3 : 3;
      float *planes = malloc(sizeof(float) * (size_t)(3 * n + 3)), *ref = malloc(sizeof(float) * (size_t)(3 * n + 3));
      float *const out[3] = {planes + 1, planes + 1 + n, planes + 1 + 2 * n}; /* rows not 32-byte aligned */
      for (int64_t i = 0; i < 3 * n + 3; i++) planes[i] = ref[i] = -1234.5f;
      for (int c = 0; c < 3; c++)
        for (int64_t i = 0; i < n; i++) ref[1 + c * n + i] = t[c][q[i * step + c]];
      sf_rgb_rows b = {q, 0, step, n, 1, 0};
      if (sf_normalize_rgb_f32(&b, &nm, out))
        assert_memory_equal(planes, ref, sizeof(float) * (size_t)(3 * n + 3));
      for (int64_t i = 0; i < 3 * n + 3; i++) planes[i] = -1234.5f;
      sf_normalize_rgb_f32_scalar(&b, &nm, out);
      assert_memory_equal(planes, ref, sizeof(float) * (size_t)(3 * n + 3));
      free(row);
      free(planes);
      free(ref);
    }
  }
}

static void test_rows_forward(void **state) {
  (void)state;
  check_rows(0);
}

static void test_rows_flipped(void **state) {
  (void)state;
  check_rows(1);
}

/* Every byte value in every lane position, both directions: a permuted shuffle mask would show here. */
static void test_every_byte_every_lane(void **state) {
  (void)state;
  float t[3][256];
  sf_normalize nm;
  tables(0, t, &nm);
  enum { N = 256 + 7 };
  uint8_t row[3 * N];
  for (int i = 0; i < 3 * N; i++) row[i] = (uint8_t)(i * 7 + i / 3);
  float planes[3][N];
  float *const out[3] = {planes[0], planes[1], planes[2]};
  for (int flip = 0; flip < 2; flip++) {
    const uint8_t *q = flip ? row + 3 * (N - 1) : row;
    sf_rgb_rows b = {q, 0, flip ? -3 : 3, N, 1, 0};
    if (!sf_normalize_rgb_f32(&b, &nm, out)) skip();
    for (int c = 0; c < 3; c++)
      for (int i = 0; i < N; i++) assert_true(planes[c][i] == t[c][q[(flip ? -3 : 3) * i + c]]);
  }
}

/* augment's to_bf16: the float32's upper half, rounded to nearest even. */
static uint16_t to_bf16(float v) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

/* bfloat16: augment's bf16 tables (the float32 entries rounded), every row length, both directions. */
static void test_bf16_rows(void **state) {
  (void)state;
  srand(13);
  for (size_t k = 0; k < sizeof stats / sizeof stats[0]; k++) {
    float t[3][256];
    sf_normalize nm;
    tables((int)k, t, &nm);
    for (int flip = 0; flip < 2; flip++)
      for (int64_t n = 0; n <= 70; n++) {
        uint8_t *row = malloc((size_t)(3 * n) + 1);
        uint16_t *planes = malloc(sizeof(uint16_t) * (size_t)(3 * n + 2)), *ref = malloc(sizeof(uint16_t) * (size_t)(3 * n + 2));
        for (int64_t i = 0; i < 3 * n; i++) row[i] = (uint8_t)rand();
        const uint8_t *q = flip && n ? row + 3 * (n - 1) : row;
        ptrdiff_t step = flip ? -3 : 3;
        for (int64_t i = 0; i < 3 * n + 2; i++) planes[i] = ref[i] = 0xDEAD;
        for (int c = 0; c < 3; c++)
          for (int64_t i = 0; i < n; i++) ref[1 + c * n + i] = to_bf16(t[c][q[i * step + c]]);
        uint16_t *const out[3] = {planes + 1, planes + 1 + n, planes + 1 + 2 * n};
        sf_rgb_rows b = {q, 0, step, n, 1, 0};
        if (sf_normalize_rgb_bf16(&b, &nm, out))
          assert_memory_equal(planes, ref, sizeof(uint16_t) * (size_t)(3 * n + 2));
        free(row), free(planes), free(ref);
      }
  }
}

/* uint8 kept: HWC (a copy, or reversed pixels) and CHW planes, at every row length, both directions. */
static void test_uint8_rows(void **state) {
  (void)state;
  srand(11);
  for (int flip = 0; flip < 2; flip++)
    for (int64_t n = 0; n <= 70; n++) {
      uint8_t *row = malloc((size_t)(3 * n) + 1), *hwc = malloc((size_t)(3 * n) + 2), *chw = malloc((size_t)(3 * n) + 2);
      uint8_t *ref_hwc = malloc((size_t)(3 * n) + 2), *ref_chw = malloc((size_t)(3 * n) + 2);
      for (int64_t i = 0; i < 3 * n; i++) row[i] = (uint8_t)rand();
      const uint8_t *q = flip && n ? row + 3 * (n - 1) : row;
      ptrdiff_t step = flip ? -3 : 3;
      memset(hwc, 0xAB, (size_t)(3 * n) + 2), memset(chw, 0xAB, (size_t)(3 * n) + 2);
      memset(ref_hwc, 0xAB, (size_t)(3 * n) + 2), memset(ref_chw, 0xAB, (size_t)(3 * n) + 2);
      for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < 3; c++) ref_hwc[1 + 3 * i + c] = ref_chw[1 + c * n + i] = q[i * step + c];
      uint8_t *const planes[3] = {chw + 1, chw + 1 + n, chw + 1 + 2 * n};
      sf_rgb_rows b = {q, 0, step, n, 1, 0};
      if (sf_normalize_rgb_u8(&b, hwc + 1)) assert_memory_equal(hwc, ref_hwc, (size_t)(3 * n) + 2);
      else assert_true(flip); /* a copy always goes */
      if (sf_normalize_rgb_u8_planes(&b, planes)) assert_memory_equal(chw, ref_chw, (size_t)(3 * n) + 2);
      free(row), free(hwc), free(chw), free(ref_hwc), free(ref_chw);
    }
}

/*
 * A block of rows, as augment writes a crop: source rows sy bytes apart inside a wider image, output
 * rows oy floats apart inside wider planes (the padding columns between them left as they were), every
 * row length from 0 to 40 (the overlapping last step of each row), both directions, float32 and bfloat16.
 */
static void test_blocks(void **state) {
  (void)state;
  srand(17);
  float t[3][256];
  sf_normalize nm;
  tables(1, t, &nm);
  enum { ROWS = 5, SW = 48, OW = 44 };
  for (int flip = 0; flip < 2; flip++)
    for (int64_t n = 0; n <= 40; n++) {
      uint8_t *img = malloc(3 * SW * ROWS);
      for (int i = 0; i < 3 * SW * ROWS; i++) img[i] = (uint8_t)rand();
      const int64_t x0 = 2; /* first source pixel read (its mirror when flipped) */
      const uint8_t *q = img + 3 * (flip ? x0 + n - 1 : x0);
      sf_rgb_rows b = {q, 3 * SW, flip ? -3 : 3, n, ROWS, OW};
      float *planes = malloc(sizeof(float) * 3 * OW * ROWS), *ref = malloc(sizeof(float) * 3 * OW * ROWS);
      uint16_t *half = malloc(sizeof(uint16_t) * 3 * OW * ROWS), *ref_half = malloc(sizeof(uint16_t) * 3 * OW * ROWS);
      for (int i = 0; i < 3 * OW * ROWS; i++) planes[i] = ref[i] = -7.0f, half[i] = ref_half[i] = 0xBEEF;
      for (int c = 0; c < 3; c++)
        for (int r = 0; r < ROWS; r++)
          for (int64_t i = 0; i < n; i++) {
            const int at = c * OW * ROWS + r * OW + 1 + (int)i;
            ref[at] = t[c][q[r * 3 * SW + i * b.step + c]];
            ref_half[at] = to_bf16(ref[at]);
          }
      float *const out[3] = {planes + 1, planes + OW * ROWS + 1, planes + 2 * OW * ROWS + 1};
      uint16_t *const hout[3] = {half + 1, half + OW * ROWS + 1, half + 2 * OW * ROWS + 1};
      if (sf_normalize_rgb_f32(&b, &nm, out)) assert_memory_equal(planes, ref, sizeof(float) * 3 * OW * ROWS);
      if (sf_normalize_rgb_bf16(&b, &nm, hout)) assert_memory_equal(half, ref_half, sizeof(uint16_t) * 3 * OW * ROWS);
      for (int i = 0; i < 3 * OW * ROWS; i++) planes[i] = -7.0f;
      sf_normalize_rgb_f32_scalar(&b, &nm, out);
      assert_memory_equal(planes, ref, sizeof(float) * 3 * OW * ROWS);
      free(img), free(planes), free(ref), free(half), free(ref_half);
    }
}

/*
 * A block as large as an ImageNet-sized sample (224 pixels a row, rows 64-byte aligned in 64-byte aligned
 * planes, 256 KiB of output or more): where the CPU has AVX-512 this is the streaming kernel's (whole
 * 64-byte lines, non-temporal stores). Both directions, source rows inside a wider image, output rows 16
 * floats apart that must stay as they were; every value equals the tables'.
 */
static void test_large_aligned_blocks(void **state) {
  (void)state;
  srand(29);
  float t[3][256];
  sf_normalize nm;
  tables(0, t, &nm);
  enum { N = 224, ROWS = 120, SW = N + 5, OY = N + 16, PLANE = OY * ROWS };
  uint8_t *img = malloc(3 * SW * ROWS);
  for (int i = 0; i < 3 * SW * ROWS; i++) img[i] = (uint8_t)rand();
  float *planes = aligned_alloc(64, sizeof(float) * 3 * PLANE);
  bool written = true;
  for (int flip = 0; flip < 2 && written; flip++) {
    const int64_t x0 = 3; /* first source pixel read (its mirror when flipped) */
    const uint8_t *q = img + 3 * (flip ? x0 + N - 1 : x0);
    sf_rgb_rows b = {q, 3 * SW, flip ? -3 : 3, N, ROWS, OY};
    for (int i = 0; i < 3 * PLANE; i++) planes[i] = -7.0f;
    float *const out[3] = {planes, planes + PLANE, planes + 2 * PLANE};
    written = sf_normalize_rgb_f32(&b, &nm, out);
    for (int c = 0; c < 3 && written; c++)
      for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < OY; i++) {
          float want = i < N ? t[c][q[r * 3 * SW + i * b.step + c]] : -7.0f;
          if (planes[c * PLANE + r * OY + i] != want)
            fail_msg("flip %d channel %d row %d pixel %d: %g, want %g", flip, c, r, i,
                     (double)planes[c * PLANE + r * OY + i], (double)want);
        }
  }
  free(img);
  free(planes);
  if (!written) skip(); /* no SIMD path here */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_affine_matches_tables),
      cmocka_unit_test(test_rows_forward),
      cmocka_unit_test(test_rows_flipped),
      cmocka_unit_test(test_every_byte_every_lane),
      cmocka_unit_test(test_uint8_rows),
      cmocka_unit_test(test_bf16_rows),
      cmocka_unit_test(test_blocks),
      cmocka_unit_test(test_large_aligned_blocks),
  };
  /* every kernel this CPU has, widest first: each must give the tables' bits */
  int failed = 0;
  for (int isa = SF_NORMALIZE_AVX512; isa >= SF_NORMALIZE_SCALAR; isa--) {
    sf_normalize_limit((sf_normalize_isa)isa);
    failed += cmocka_run_group_tests(tests, NULL, NULL);
  }
  return failed;
}
