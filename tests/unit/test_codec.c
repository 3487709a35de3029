/* Unit tests for the public codec API (include/shardflow/codec.h) as a plugin calls it: this file includes only
 * include/shardflow/ and links only the shared libshardflow. An image decoded and encoded round trip; a transform
 * written into the caller's buffer against the values computed here pixel by pixel (window, padding, flip,
 * (x/255 - mean)/std, layout) from a strided view; a JPEG left undecoded, cropped and resized through its region
 * against the whole decode and sf_image_resize; .npy read against bytes laid out by hand; and the plans refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <shardflow/codec.h>

enum { H = 13, W = 17, C = 3 };
static const double mean[C] = {0.485, 0.456, 0.406}, stdev[C] = {0.229, 0.224, 0.225};

/* Pseudo-random bytes; smooth = true gives a gradient with a little noise (JPEG keeps it close). */
static void fill(uint8_t *p, int64_t h, int64_t w, int64_t c, ptrdiff_t row, bool smooth) {
  uint32_t x = 12345;
  for (int64_t i = 0; i < h; i++)
    for (int64_t j = 0; j < w * c; j++) {
      x = x * 1103515245u + 12345u;
      p[i * row + j] = smooth ? (uint8_t)((i * 3 + j * 2 + (x >> 28)) & 0xff) : (uint8_t)(x >> 16);
    }
}

/* An ordinary field holding t (taken over), in a new sample (*s). */
static sf_field *field_of(sf_sample **s, const char *name, bool encoded, sf_tensor *t) {
  *s = sf_sample_new();
  assert_non_null(*s);
  sf_field *f = sf_sample_add_field(*s, name, encoded, t);
  assert_non_null(f);
  return f;
}

/*
 * The definition: output (row i, column k, channel c) reads window position (pos + i, pos + k) of the plain-copy
 * axes' image at (origin + .), mirrored on x when flipped (k -> n-1-k); outside [0, scaled) it reads 0. float32:
 * (x/255 - mean)/std rounded once (x/255 without mean/std); uint8: x. Written CHW or HWC.
 */
static void reference(const sf_tensor *src, const sf_image_axis *y, const sf_image_axis *x, bool flip, bool norm,
                      sf_dtype dtype, bool chw, void *out) {
  const uint8_t *p = sf_tensor_data(src);
  for (int64_t i = 0; i < y->n; i++)
    for (int64_t k = 0; k < x->n; k++)
      for (int c = 0; c < C; c++) {
        int64_t row = y->pos + i, col = x->pos + (flip ? x->n - 1 - k : k);
        int v = row >= 0 && row < y->scaled && col >= 0 && col < x->scaled
                    ? p[(y->origin + row) * src->strides[0] + (x->origin + col) * src->strides[1] + c * src->strides[2]]
                    : 0;
        size_t at = chw ? (size_t)((c * y->n + i) * x->n + k) : (size_t)((i * x->n + k) * C + c);
        if (dtype == SF_DTYPE_FLOAT32) ((float *)out)[at] = (float)(norm ? (v / 255.0 - mean[c]) / stdev[c] : v / 255.0);
        else ((uint8_t *)out)[at] = (uint8_t)v;
      }
}

static void test_decode_round_trip(void **state) {
  (void)state;
  sf_tensor img, back;
  assert_int_equal(sf_tensor_alloc(&img, SF_DTYPE_UINT8, 3, (int64_t[]){H, W, C}), 0);
  fill(sf_tensor_data(&img), H, W, C, W * C, false);
  sf_buffer *png = NULL;
  sf_error e = {.code = 0};
  assert_int_equal(sf_image_encode("png", &img, 0, &png, &e), 0);
  assert_true(sf_image_format_known("png") && sf_image_format_known("jpg") && !sf_image_format_known("txt"));
  sf_image_limits limits = {0};
  assert_int_equal(sf_image_decode("png", png, 0, sf_buffer_size(png), SF_IMAGE_RGB, NULL, &back, &e), 0);
  assert_true(back.dtype == SF_DTYPE_UINT8 && back.ndim == 3 && back.shape[0] == H && back.shape[1] == W &&
              back.shape[2] == C);
  assert_memory_equal(sf_tensor_data(&back), sf_tensor_data(&img), H * W * C);
  sf_tensor_clear(&back);
  /* Corrupt data is the caller's error with a message, not a crash (limits zeroed: the defaults, as NULL). */
  sf_buffer_data(png)[20] ^= 0xff; /* inside IHDR: its CRC no longer matches */
  assert_int_equal(sf_image_decode("png", png, 0, sf_buffer_size(png), SF_IMAGE_RGB, &limits, &back, &e), SF_EFORMAT);
  assert_true(e.message[0] != '\0');
  sf_buffer_unref(&png);
  sf_tensor_clear(&img);
}

static void test_write_matches_definition(void **state) {
  (void)state;
  /* A strided view: rows W*C+5 bytes apart, as a crop of a larger image would be. */
  const ptrdiff_t row = W * C + 5;
  sf_buffer *b = sf_buffer_new((size_t)(H * row));
  assert_non_null(b);
  fill(sf_buffer_data(b), H, W, C, row, false);
  sf_tensor src = {.dtype = SF_DTYPE_UINT8, .ndim = 3, .shape = {H, W, C}, .strides = {row, C, 1}, .buffer = b};
  sf_buffer *norm = NULL, *plain = NULL;
  assert_int_equal(sf_image_tables_new(mean, stdev, C, &norm), 0);
  assert_int_equal(sf_image_tables_new(NULL, NULL, 0, &plain), 0);
  /* A window past the top and the right edge (zero padding), of a sub-image at (1, 2); flipped and not. */
  const sf_image_axis y = {1, H - 1, H - 1, -2, 10}, x = {2, W - 3, W - 3, 5, 16};
  for (int flip = 0; flip < 2; flip++)
    for (int chw = 0; chw < 2; chw++)
      for (int d = 0; d < 3; d++) {
        sf_dtype dtype = d ? SF_DTYPE_FLOAT32 : SF_DTYPE_UINT8;
        sf_image_transform t = {.y = y, .x = x, .flip = flip, .tables = d == 2 ? norm : plain, .dtype = dtype,
                                .layout = chw ? SF_IMAGE_CHW : SF_IMAGE_HWC, .channels = C};
        int64_t shape[3];
        sf_image_transform_shape(&t, shape);
        assert_int_equal(shape[chw ? 0 : 2], C);
        assert_int_equal(shape[chw ? 1 : 0], 10);
        assert_int_equal(shape[chw ? 2 : 1], 16);
        size_t n = (size_t)(10 * 16 * C) * sf_dtype_size(dtype);
        uint8_t *got = malloc(n), *want = malloc(n);
        assert_int_equal(sf_image_transform_write(&t, &src, got, NULL), 0);
        reference(&src, &y, &x, flip, d == 2, dtype, chw, want);
        assert_memory_equal(got, want, n);
        /* The same plan applied to a field (deferred or not, written later) gives the same values. */
        sf_tensor own;
        sf_tensor_ref(&own, &src);
        sf_sample *s;
        sf_field *f = field_of(&s, "img", false, &own);
        assert_int_equal(sf_image_transform_apply(f, &t, NULL, NULL), 0);
        assert_int_equal(sf_tensor_nbytes(&f->tensor), n);
        /* Left deferred (the source is smaller than the output); a deferred field is no source: materialise it. */
        size_t size;
        assert_non_null(f->recipe);
        assert_non_null(sf_field_recipe_data(f, &size));
        assert_true(size > 0);
        sf_error e = {.code = 0};
        assert_int_equal(sf_image_transform_apply(f, &t, NULL, &e), SF_EINVAL);
        assert_non_null(strstr(e.message, "materialise"));
        memset(got, 0xa5, n);
        sf_field_write(f, got);
        assert_memory_equal(got, want, n);
        sf_sample_destroy(&s);
        free(got);
        free(want);
      }
  /* The tables' values as a kernel of one's own reads them: the definition, per channel and dtype. */
  for (int c = 0; c < C; c++) {
    const float *f32 = sf_image_tables_values(norm, SF_DTYPE_FLOAT32, c);
    const uint16_t *bf16 = sf_image_tables_values(norm, SF_DTYPE_BFLOAT16, c);
    const uint8_t *u8 = sf_image_tables_values(norm, SF_DTYPE_UINT8, c);
    assert_true(f32 && bf16 && u8 && sf_image_tables_values(plain, SF_DTYPE_FLOAT32, c));
    for (int v = 0; v < 256; v++) {
      float want = (float)((v / 255.0 - mean[c]) / stdev[c]);
      uint32_t bits;
      memcpy(&bits, &want, 4);
      bits += 0x7fffu + ((bits >> 16) & 1u); /* bfloat16: float32 rounded to nearest even */
      assert_true(f32[v] == want && bf16[v] == (uint16_t)(bits >> 16) && u8[v] == v);
      assert_true(((const float *)sf_image_tables_values(plain, SF_DTYPE_FLOAT32, c))[v] == (float)(v / 255.0));
    }
  }
  assert_null(sf_image_tables_values(norm, SF_DTYPE_FLOAT32, C));
  assert_null(sf_image_tables_values(norm, SF_DTYPE_INT32, 0));
  assert_null(sf_image_tables_values(b, SF_DTYPE_FLOAT32, 0));
  sf_buffer_unref(&norm);
  sf_buffer_unref(&plain);
  sf_buffer_unref(&b);
}

/* A field holding a JPEG (quality 95) of a smooth hh x ww image, and in *whole its full decode. */
static sf_field *jpeg_field(sf_sample **s, int64_t hh, int64_t ww, sf_tensor *whole) {
  sf_tensor img;
  assert_int_equal(sf_tensor_alloc(&img, SF_DTYPE_UINT8, 3, (int64_t[]){hh, ww, C}), 0);
  fill(sf_tensor_data(&img), hh, ww, C, ww * C, true);
  sf_buffer *jpg = NULL;
  sf_error e = {.code = 0};
  assert_int_equal(sf_image_encode("jpg", &img, 95, &jpg, &e), 0);
  sf_tensor_clear(&img);
  sf_image_limits limits = {.depth = 8};
  assert_int_equal(sf_image_decode("jpg", jpg, 0, sf_buffer_size(jpg), SF_IMAGE_RGB, &limits, whole, &e), 0);
  sf_tensor bytes;
  assert_int_equal(sf_tensor_view(&bytes, SF_DTYPE_UINT8, 1, (int64_t[]){(int64_t)sf_buffer_size(jpg)}, jpg, 0),
                   0); /* takes over jpg */
  sf_field *f = field_of(s, "jpg", true, &bytes);
  assert_false(sf_image_is_deferred_jpeg(f));
  assert_int_equal(sf_image_defer_jpeg(f, SF_IMAGE_RGB, &limits), 1);
  assert_true(sf_image_is_deferred_jpeg(f));
  assert_true(f->tensor.ndim == 3 && f->tensor.shape[0] == hh && f->tensor.shape[1] == ww && f->tensor.shape[2] == C);
  return f;
}

static void test_jpeg_region_matches_whole_decode(void **state) {
  (void)state;
  enum { JH = 40, JW = 56 };
  sf_buffer *norm = NULL;
  assert_int_equal(sf_image_tables_new(mean, stdev, C, &norm), 0);
  /* A centre crop, flipped, padded on the left and right: only its rows and columns are decoded (exact IDCT). */
  sf_sample *s;
  sf_tensor whole;
  sf_field *f = jpeg_field(&s, JH, JW, &whole);
  sf_image_transform t = {.y = {0, JH, JH, 9, 24}, .x = {0, JW, JW, -4, 64}, .flip = true, .tables = norm,
                          .dtype = SF_DTYPE_FLOAT32, .layout = SF_IMAGE_CHW, .channels = C, .m = 8};
  sf_image_axis_reads(&t.y, &t.rect[0], &t.rect[2]);
  sf_image_axis_reads(&t.x, &t.rect[1], &t.rect[3]);
  assert_true(t.rect[0] == 9 && t.rect[2] == 33 && t.rect[1] == 0 && t.rect[3] == JW);
  size_t n = (size_t)(24 * 64 * C) * sizeof(float);
  float *got = malloc(n), *want = malloc(n);
  sf_error e = {.code = 0};
  assert_int_equal(sf_image_transform_apply(f, &t, NULL, &e), 0);
  assert_false(sf_image_is_deferred_jpeg(f));
  sf_field_write(f, got);
  reference(&whole, &t.y, &t.x, true, true, SF_DTYPE_FLOAT32, true, want);
  assert_memory_equal(got, want, n);
  sf_sample_destroy(&s);
  sf_tensor_clear(&whole);

  /* A resize to half, its centre 16 x 20: from the JPEG's region, equal to sf_image_resize of the whole decode. */
  f = jpeg_field(&s, JH, JW, &whole);
  t = (sf_image_transform){.y = {0, JH, JH / 2, 2, 16}, .x = {0, JW, JW / 2, 4, 20}, .tables = norm,
                           .dtype = SF_DTYPE_FLOAT32, .layout = SF_IMAGE_HWC, .channels = C, .m = 8};
  sf_image_axis_reads(&t.y, &t.rect[0], &t.rect[2]);
  sf_image_axis_reads(&t.x, &t.rect[1], &t.rect[3]);
  assert_true(t.rect[2] - t.rect[0] < JH && t.rect[3] - t.rect[1] < JW); /* a region, not the whole image */
  assert_int_equal(sf_image_transform_apply(f, &t, NULL, &e), 0);
  n = (size_t)(16 * 20 * C) * sizeof(float);
  sf_field_write(f, got);
  sf_tensor half;
  assert_int_equal(sf_image_resize(&whole, JH / 2, JW / 2, &half), 0);
  assert_true(half.shape[0] == JH / 2 && half.shape[1] == JW / 2 && half.shape[2] == C);
  sf_image_transform plain = t;
  plain.y = (sf_image_axis){0, JH / 2, JH / 2, 2, 16};
  plain.x = (sf_image_axis){0, JW / 2, JW / 2, 4, 20};
  assert_int_equal(sf_image_transform_write(&plain, &half, want, &e), 0);
  assert_memory_equal(got, want, n);
  sf_tensor_clear(&half);
  sf_sample_destroy(&s);

  /* Decoded whole now (sf_image_decode_deferred): an ordinary field with the full decode's pixels. */
  sf_tensor_clear(&whole);
  f = jpeg_field(&s, JH, JW, &whole);
  assert_int_equal(sf_image_decode_deferred(f, &e), 0);
  assert_false(sf_image_is_deferred_jpeg(f));
  assert_int_equal(f->tensor.shape[0], JH);
  assert_memory_equal(sf_tensor_data(&f->tensor), sf_tensor_data(&whole), JH * JW * C);
  sf_sample_destroy(&s);
  sf_tensor_clear(&whole);
  free(got);
  free(want);
  sf_buffer_unref(&norm);
}

static void test_npy_read(void **state) {
  (void)state;
  /* A .npy 1.0 file laid out by hand (numpy.lib.format): magic, version, header length, dict padded to 128. */
  char header[128 - 10];
  int len = snprintf(header, sizeof header, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }");
  memset(header + len, ' ', sizeof header - (size_t)len - 1);
  header[sizeof header - 1] = '\n';
  sf_buffer *b = sf_buffer_new(128 + 6 * 4);
  uint8_t *p = sf_buffer_data(b);
  memcpy(p, "\x93NUMPY\x01\x00", 8);
  p[8] = (uint8_t)sizeof header, p[9] = 0;
  memcpy(p + 10, header, sizeof header);
  const int32_t values[6] = {1, -2, 3, 40000, -5, 6};
  memcpy(p + 128, values, sizeof values);
  sf_tensor t;
  sf_error e = {.code = 0};
  assert_int_equal(sf_npy_read(b, 0, 128 + sizeof values, &t, &e), 0);
  assert_true(t.dtype == SF_DTYPE_INT32 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3);
  assert_memory_equal(sf_tensor_data(&t), values, sizeof values);
  sf_tensor_clear(&t);
  assert_int_equal(sf_npy_read(b, 0, 128 + sizeof values - 1, &t, &e), SF_EFORMAT); /* truncated */
  /* sf_npy_write writes what was read, byte for byte (the same header, padded as numpy pads it). */
  assert_int_equal(sf_npy_read(b, 0, 128 + sizeof values, &t, &e), 0);
  char path[512];
  snprintf(path, sizeof path, "%s/sf-codec-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(sf_npy_write(path, &t, &e), 0);
  uint8_t back[256];
  FILE *f = fdopen(fd, "rb");
  assert_int_equal(fread(back, 1, sizeof back, f), 128 + sizeof values);
  fclose(f);
  unlink(path);
  assert_memory_equal(back, p, 128 + sizeof values);
  sf_tensor_clear(&t);
  sf_buffer_unref(&b);
}

/* What a plugin could get wrong is refused with SF_EINVAL, nothing read or written out of bounds. */
static void test_plans_refused(void **state) {
  (void)state;
  sf_tensor src;
  assert_int_equal(sf_tensor_alloc(&src, SF_DTYPE_UINT8, 3, (int64_t[]){H, W, C}), 0);
  fill(sf_tensor_data(&src), H, W, C, W * C, false);
  sf_buffer *norm = NULL, *gray = NULL;
  assert_int_equal(sf_image_tables_new(mean, stdev, C, &norm), 0);
  assert_int_equal(sf_image_tables_new(mean, stdev, SF_IMAGE_MAX_NORM_CHANNELS + 1, &gray), SF_EINVAL);
  assert_null(gray);
  assert_int_equal(sf_image_tables_new(mean, (double[]){1, 0, 1}, C, &gray), SF_EINVAL);
  assert_int_equal(sf_image_tables_new(mean, stdev, 1, &gray), 0);
  const sf_image_transform good = {.y = {0, H, H, 0, H}, .x = {0, W, W, 0, W}, .tables = norm,
                                   .dtype = SF_DTYPE_FLOAT32, .layout = SF_IMAGE_HWC, .channels = C};
  uint8_t canary[H * W * C * 4];
  sf_error e = {.code = 0};
  sf_image_transform bad[6];
  for (int i = 0; i < 6; i++) bad[i] = good;
  bad[0].y.span = H + 1;                  /* reads a row past the image */
  bad[1].x.origin = -1;                   /* and a column before it */
  bad[2].channels = 1;                    /* not the source's channels */
  bad[3].tables = gray;                   /* a mean/std for 1 channel, 3 channels */
  bad[4].dtype = SF_DTYPE_INT64;          /* not an output dtype */
  bad[5].x.n = 0;                         /* an empty output */
  for (int i = 0; i < 6; i++) {
    memset(canary, 0x5a, sizeof canary);
    assert_int_equal(sf_image_transform_write(&bad[i], &src, canary, &e), SF_EINVAL);
    assert_true(strstr(e.message, "image transform") != NULL);
    assert_true(canary[0] == 0x5a && canary[sizeof canary - 1] == 0x5a);
  }
  assert_int_equal(sf_image_resize(&src, 0, 4, &(sf_tensor){0}), SF_EINVAL);

  /* A JPEG plan whose rect does not hold what the axes read, or with another DCT scale: refused, field unchanged. */
  sf_sample *s;
  sf_tensor whole;
  sf_field *f = jpeg_field(&s, 40, 56, &whole);
  sf_image_transform t = {.y = {0, 40, 40, 8, 24}, .x = {0, 56, 56, 8, 24}, .tables = norm,
                          .dtype = SF_DTYPE_FLOAT32, .layout = SF_IMAGE_CHW, .channels = C, .m = 8,
                          .rect = {8, 8, 31, 32}};
  assert_int_equal(sf_image_transform_apply(f, &t, NULL, &e), SF_EINVAL); /* row 31 is read, not decoded */
  assert_true(sf_image_is_deferred_jpeg(f));
  t.rect[2] = 32;
  t.m = 3;
  assert_int_equal(sf_image_transform_apply(f, &t, NULL, &e), SF_EINVAL);
  assert_true(sf_image_is_deferred_jpeg(f));
  t.m = 8;
  assert_int_equal(sf_image_transform_apply(f, &t, NULL, &e), 0);
  assert_int_equal(sf_field_materialize(f), 0);
  sf_sample_destroy(&s);
  sf_tensor_clear(&whole);
  sf_buffer_unref(&norm);
  sf_buffer_unref(&gray);
  sf_tensor_clear(&src);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_round_trip),
      cmocka_unit_test(test_write_matches_definition),
      cmocka_unit_test(test_jpeg_region_matches_whole_decode),
      cmocka_unit_test(test_npy_read),
      cmocka_unit_test(test_plans_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
