/* Unit tests for engine/codec/lazy.c: a transform description written now, deferred and written later, gives
 * the values computed here pixel by pixel from the definition (crop window with padding, flip, (x/255 - mean)/std,
 * layout); the executor's clock is charged by a deferred write; a plugin's recipe is not one of the module's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lazy.h"

enum { H = 13, W = 17, C = 3 };
static const double mean[C] = {0.485, 0.456, 0.406}, stdev[C] = {0.229, 0.224, 0.225};

/* A pseudo-random uint8 [H,W,C] image in a new tensor. */
static void image(sf_tensor *t) {
  assert_int_equal(sf_tensor_alloc(t, SF_DTYPE_UINT8, 3, (int64_t[]){H, W, C}), 0);
  uint8_t *p = sf_tensor_data(t);
  uint32_t x = 12345;
  for (int i = 0; i < H * W * C; i++) p[i] = (uint8_t)((x = x * 1103515245u + 12345u) >> 16);
}

/*
 * The definition: output (row i, column k, channel c) reads window position (pos + i, pos + k) of the image,
 * mirrored on x when flipped (k -> n-1-k); outside the image it reads 0. float32: (x/255 - mean)/std rounded
 * once; uint8: x. Written CHW or HWC.
 */
static void reference(const sf_tensor *src, const sf_lazy_axis *y, const sf_lazy_axis *x, bool flip, sf_dtype dtype,
                      bool chw, void *out) {
  const uint8_t *p = sf_tensor_data(src);
  for (int64_t i = 0; i < y->n; i++)
    for (int64_t k = 0; k < x->n; k++)
      for (int c = 0; c < C; c++) {
        int64_t row = y->pos + i, col = x->pos + (flip ? x->n - 1 - k : k);
        int v = row >= 0 && row < H && col >= 0 && col < W ? p[(row * W + col) * C + c] : 0;
        size_t at = chw ? (size_t)((c * y->n + i) * x->n + k) : (size_t)((i * x->n + k) * C + c);
        if (dtype == SF_DTYPE_FLOAT32) ((float *)out)[at] = (float)((v / 255.0 - mean[c]) / stdev[c]);
        else ((uint8_t *)out)[at] = (uint8_t)v;
      }
}

static void test_write_matches_definition(void **state) {
  (void)state;
  sf_tensor src;
  image(&src);
  sf_buffer *norm = sf_lazy_tables_new(mean, stdev, C), *plain = sf_lazy_tables_new(NULL, NULL, 0);
  assert_non_null(norm);
  assert_non_null(plain);
  /*
   * A window past the top and the right edge (zero padding), then one past the bottom and the left edge, and
   * one inside the image (no padding): flipped and not, both layouts and dtypes.
   */
  const sf_lazy_axis ys[] = {{0, H, H, -2, 10}, {0, H, H, 6, 10}, {0, H, H, 1, 10}};
  const sf_lazy_axis xs[] = {{0, W, W, 5, 16}, {0, W, W, -3, 16}, {0, W, W, 1, 16}};
  for (int window = 0; window < 3; window++)
  for (int flip = 0; flip < 2; flip++)
    for (int chw = 0; chw < 2; chw++)
      for (int d = 0; d < 2; d++) {
        sf_dtype dtype = d ? SF_DTYPE_FLOAT32 : SF_DTYPE_UINT8;
        const sf_lazy_axis y = ys[window], x = xs[window];
        sf_lazy_transform t = {.src = src, .y = y, .x = x, .flip = flip, .tables = d ? norm : plain, .dtype = dtype,
                               .layout = chw ? SF_LAZY_CHW : SF_LAZY_HWC, .channels = C};
        int64_t shape[3];
        sf_lazy_shape(&t, shape);
        assert_int_equal(shape[chw ? 0 : 2], C);
        assert_int_equal(shape[chw ? 1 : 0], 10);
        assert_int_equal(shape[chw ? 2 : 1], 16);
        size_t bytes = (size_t)(10 * 16 * C) * sf_dtype_size(dtype);
        uint8_t *want = malloc(bytes), *got = malloc(bytes);
        reference(&src, &y, &x, flip, dtype, chw, want);
        assert_int_equal(sf_lazy_write(&t, got, NULL), 0);
        assert_memory_equal(got, want, bytes);

        /* The same description applied to a field: deferred (the source is small), written later. */
        sf_sample *s = sf_sample_new();
        assert_non_null(s);
        sf_tensor ref;
        sf_tensor_ref(&ref, &src);
        sf_field *f = sf_sample_add_field(s, "jpg", false, &ref);
        assert_non_null(f);
        t.src = f->tensor;
        sf_error error = {0};
        assert_int_equal(sf_lazy_apply(f, &t, NULL, &error), 0);
        assert_non_null(f->recipe);
        assert_null(f->tensor.buffer);
        assert_non_null(sf_lazy_transform_of(f));
        assert_null(sf_lazy_jpeg_of(f));
        assert_int_equal(sf_tensor_nbytes(&f->tensor), bytes);
        size_t size;
        const uint8_t *from = sf_lazy_source(f, &size), *base = sf_tensor_data(&src);
        assert_true(from >= base && from + size <= base + H * W * C && size > 0);

        /* The executor's clock: adopted once, charged by the write, on this thread too. */
        sf_lazy_clock *clock = sf_lazy_clock_new();
        assert_non_null(clock);
        assert_true(sf_lazy_adopt(f, clock));
        uint64_t before = sf_lazy_thread_ns();
        memset(got, 0xAB, bytes);
        sf_lazy_write_field(f, got);
        assert_memory_equal(got, want, bytes);
        assert_true(sf_lazy_clock_ns(clock) > 0);
        assert_int_equal(sf_lazy_thread_ns() - before, sf_lazy_clock_ns(clock));
        sf_lazy_clock_unref(clock); /* the field keeps its own reference */

        /* Materialised, it is a plain field written by a copy. */
        assert_int_equal(sf_field_materialize(f), 0);
        assert_null(f->recipe);
        memset(got, 0xAB, bytes);
        sf_lazy_write_field(f, got);
        assert_memory_equal(got, want, bytes);
        sf_sample_destroy(&s);
        free(want);
        free(got);
      }
  sf_buffer_unref(&norm);
  sf_buffer_unref(&plain);
  sf_tensor_clear(&src);
}

/* A plugin's recipe: the module leaves it alone. */
static void plugin_write(const sf_field_recipe *r, void *dst) {
  (void)r;
  memset(dst, 7, 4);
}
static void plugin_destroy(sf_field_recipe *r) { free(r); }

static void test_plugin_recipe_is_opaque(void **state) {
  (void)state;
  sf_sample *s = sf_sample_new();
  assert_non_null(s);
  sf_field *f = sf_sample_add_field(s, "x", false, &(sf_tensor){0});
  assert_non_null(f);
  sf_field_recipe *r = malloc(sizeof *r);
  *r = (sf_field_recipe){plugin_write, plugin_destroy};
  assert_int_equal(sf_field_defer(f, SF_DTYPE_UINT8, 1, (int64_t[]){4}, r), 0);
  sf_lazy_clock *clock = sf_lazy_clock_new();
  assert_false(sf_lazy_adopt(f, clock));
  assert_null(sf_lazy_transform_of(f));
  assert_null(sf_lazy_jpeg_of(f));
  size_t size = 1;
  assert_null(sf_lazy_source(f, &size));
  assert_int_equal(size, 0);
  uint8_t out[4] = {0};
  sf_lazy_write_field(f, out);
  assert_memory_equal(out, ((uint8_t[]){7, 7, 7, 7}), 4);
  assert_int_equal(sf_lazy_clock_ns(clock), 0);
  sf_lazy_clock_unref(clock);
  sf_sample_destroy(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_write_matches_definition),
      cmocka_unit_test(test_plugin_recipe_is_opaque),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
