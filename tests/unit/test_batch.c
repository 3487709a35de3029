/* Unit tests of the batch stage alone (harness): shapes, contents, partial batches, epoch ends, shape errors,
 * deferred fields written straight into the batch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

enum { H = 4, W = 5, C = 3 };

/* The pixel every image of sample `id` holds at (y, x, c): distinct per sample and position. */
static uint8_t pixel(int id, int y, int x, int c) { return (uint8_t)(id * 7 + y * 31 + x * 3 + c); }

/* Adds a uint8 [h, w, C] image named `name` filled with pixel(id, ...). */
static void add_image(sf_sample *s, const char *name, int id, int h, int w) {
  sf_tensor t;
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, 3, (int64_t[]){h, w, C}), 0);
  uint8_t *p = sf_tensor_data(&t);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < C; c++) *p++ = pixel(id, y, x, c);
  assert_non_null(sf_sample_add_field(s, name, false, &t));
}

/* A sample with an image `png` [H,W,C], a label `cls` int64 scalar = id and encoded bytes `bin` (not text). */
static sf_sample *make_sample(int id, uint64_t epoch, int h, int w) {
  sf_sample *s = sf_sample_new();
  assert_non_null(s);
  char key[32];
  snprintf(key, sizeof key, "sample%04d", id);
  assert_int_equal(sf_sample_set_key(s, key, strlen(key)), 0);
  const char url[] = "/data/shard-000.tar";
  s->url = sf_buffer_new(sizeof url);
  memcpy(sf_buffer_data(s->url), url, sizeof url);
  s->epoch = epoch;
  s->index = (uint64_t)id;
  s->offset = 512 * id;
  add_image(s, "png", id, h, w);
  sf_tensor t;
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_INT64, 0, NULL), 0);
  *(int64_t *)sf_tensor_data(&t) = id;
  assert_non_null(sf_sample_add_field(s, "cls", false, &t));
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, 1, (int64_t[]){3}), 0);
  memcpy(sf_tensor_data(&t), "abc", 3);
  assert_non_null(sf_sample_add_field(s, "bin", true, &t));
  return s;
}

static void push_sample(sf_harness *h, sf_sample *s) {
  sf_item item = {.kind = SF_ITEM_SAMPLE, .epoch = s->epoch, .u.sample = s};
  sf_harness_push(h, &item);
}

static void push_epoch_end(sf_harness *h, uint64_t epoch) {
  sf_item item = {.kind = SF_ITEM_EPOCH_END, .epoch = epoch};
  sf_harness_push(h, &item);
}

static sf_harness *new_batch(const char *batch_size, const char *partial) {
  char a[64], b[64];
  snprintf(a, sizeof a, "batch_size=%s", batch_size);
  snprintf(b, sizeof b, "partial=%s", partial);
  const char *options[] = {a, b, NULL};
  sf_harness *h;
  sf_error error;
  memset(&error, 0, sizeof error);
  int r = sf_harness_new(&h, "batch", options, 1, 0, 0, 1, &error);
  if (r) fail_msg("harness: %s", error.message);
  return h;
}

/* Where the last batch expect_batch() checked kept its png values (compared, never read after). */
static const uint8_t *last_png;

/* The image height expect_batch_ids() checks (make_sample's H unless a test says otherwise). */
static int expect_height = H;

/* Pops the next item, which must be a batch of `size` samples with ids ids[0..size) in order. */
static void expect_batch_ids(sf_harness *h, uint64_t epoch, uint64_t index, const int *ids, int size) {
  sf_item item;
  assert_int_equal(sf_harness_pop(h, &item), 0);
  assert_int_equal(item.kind, SF_ITEM_BATCH);
  sf_batch *b = item.u.batch;
  assert_int_equal(item.epoch, epoch);
  assert_int_equal(b->epoch, epoch);
  assert_int_equal(b->index, index);
  assert_int_equal(b->size, size);
  assert_int_equal(b->n_fields, 2); /* the encoded field (not text) stays out */
  assert_null(sf_batch_field(b, "bin"));

  const sf_field *img = sf_batch_field(b, "png");
  assert_non_null(img);
  assert_int_equal(img->tensor.dtype, SF_DTYPE_UINT8);
  assert_int_equal(img->tensor.ndim, 4);
  assert_int_equal(img->tensor.shape[0], size);
  assert_int_equal(img->tensor.shape[1], expect_height);
  assert_int_equal(img->tensor.shape[2], W);
  assert_int_equal(img->tensor.shape[3], C);
  assert_true(sf_tensor_is_contiguous(&img->tensor));
  const uint8_t *p = sf_tensor_data(&img->tensor);
  last_png = p;
  for (int i = 0; i < size; i++)
    for (int y = 0; y < expect_height; y++)
      for (int x = 0; x < W; x++)
        for (int c = 0; c < C; c++) assert_int_equal(*p++, pixel(ids[i], y, x, c));

  const sf_field *cls = sf_batch_field(b, "cls");
  assert_non_null(cls);
  assert_int_equal(cls->tensor.dtype, SF_DTYPE_INT64);
  assert_int_equal(cls->tensor.ndim, 1);
  assert_int_equal(cls->tensor.shape[0], size);
  const int64_t *labels = sf_tensor_data(&cls->tensor);
  for (int i = 0; i < size; i++) {
    assert_int_equal(labels[i], ids[i]);
    char key[32];
    snprintf(key, sizeof key, "sample%04d", ids[i]);
    assert_string_equal(b->keys[i], key);
  }
  sf_item_clear(&item);
}

/* Pops the next item, which must be a batch of `size` samples with ids first.. in order. */
static void expect_batch(sf_harness *h, uint64_t epoch, uint64_t index, int first, int size) {
  int ids[64];
  assert_true(size <= 64);
  for (int i = 0; i < size; i++) ids[i] = first + i;
  expect_batch_ids(h, epoch, index, ids, size);
}

static void expect_epoch_end(sf_harness *h, uint64_t epoch) {
  sf_item item;
  assert_int_equal(sf_harness_pop(h, &item), 0);
  assert_int_equal(item.kind, SF_ITEM_EPOCH_END);
  assert_int_equal(item.epoch, epoch);
}

static void expect_empty(sf_harness *h) {
  sf_item item;
  assert_int_equal(sf_harness_pop(h, &item), SF_EAGAIN);
}

static void test_full_and_partial(void **state) {
  sf_harness *h = new_batch("4", "true");
  for (int i = 0; i < 10; i++) push_sample(h, make_sample(i, 0, H, W));
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  expect_batch(h, 0, 0, 0, 4);
  expect_batch(h, 0, 1, 4, 4);
  expect_empty(h); /* two samples wait for more */
  push_epoch_end(h, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch(h, 0, 2, 8, 2);
  expect_epoch_end(h, 0);
  expect_empty(h);
  assert_int_equal(sf_harness_error_count(h), 0);
  assert_int_equal(sf_harness_skipped(h), 0);
  sf_harness_destroy(&h);
}

static void test_partial_false_drops(void **state) {
  sf_harness *h = new_batch("4", "false");
  for (int i = 0; i < 10; i++) push_sample(h, make_sample(i, 0, H, W));
  push_epoch_end(h, 0);
  for (int i = 10; i < 13; i++) push_sample(h, make_sample(i, 1, H, W)); /* EOF cuts these */
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch(h, 0, 0, 0, 4);
  expect_batch(h, 0, 1, 4, 4);
  expect_epoch_end(h, 0);
  expect_empty(h);
  assert_int_equal(sf_harness_skipped(h), 2 + 3);
  assert_int_equal(sf_harness_error_count(h), 0);
  sf_harness_destroy(&h);
}

/* Each epoch's short batch leaves before its marker, and batch indices restart at 0. */
static void test_epoch_end_flush(void **state) {
  sf_harness *h = new_batch("3", "true");
  for (int i = 0; i < 4; i++) push_sample(h, make_sample(i, 0, H, W));
  push_epoch_end(h, 0);
  for (int i = 4; i < 10; i++) push_sample(h, make_sample(i, 1, H, W));
  push_epoch_end(h, 1);
  for (int i = 10; i < 12; i++) push_sample(h, make_sample(i, 2, H, W));
  sf_harness_close_input(h); /* EOF flushes like an epoch end, without a marker */
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch(h, 0, 0, 0, 3);
  expect_batch(h, 0, 1, 3, 1);
  expect_epoch_end(h, 0);
  expect_batch(h, 1, 0, 4, 3);
  expect_batch(h, 1, 1, 7, 3);
  expect_epoch_end(h, 1); /* an exact multiple: no empty batch */
  expect_batch(h, 2, 0, 10, 2);
  expect_empty(h);
  sf_harness_destroy(&h);
}

static void test_batch_size_one(void **state) {
  sf_harness *h = new_batch("1", "false");
  for (int i = 0; i < 3; i++) push_sample(h, make_sample(i, 0, H, W));
  push_epoch_end(h, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  for (int i = 0; i < 3; i++) expect_batch(h, 0, (uint64_t)i, i, 1);
  expect_epoch_end(h, 0);
  assert_int_equal(sf_harness_skipped(h), 0);
  sf_harness_destroy(&h);
}

static void test_shape_mismatch_skip(void **state) {
  sf_harness *h = new_batch("2", "true");
  push_sample(h, make_sample(0, 0, H, W));
  push_sample(h, make_sample(99, 0, H + 1, W)); /* taller image */
  push_sample(h, make_sample(1, 0, H, W));
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch(h, 0, 0, 0, 2);
  expect_empty(h);
  assert_int_equal(sf_harness_error_count(h), 1);
  assert_int_equal(sf_harness_skipped(h), 1);
  const sf_error *e = sf_harness_last_error(h);
  assert_non_null(e);
  assert_int_equal(e->code, SF_ESHAPE);
  assert_string_equal(e->stage, "batch");
  assert_string_equal(e->url, "/data/shard-000.tar");
  assert_string_equal(e->key, "sample0099");
  assert_int_equal(e->offset, 512 * 99);
  if (!strstr(e->message, "'png'") || !strstr(e->message, "[5,5,3]") || !strstr(e->message, "[4,5,3]"))
    fail_msg("message does not name the field and both shapes: %s", e->message);
  sf_harness_destroy(&h);
}

static void test_dtype_and_missing_field(void **state) {
  sf_harness *h = new_batch("3", "true");
  push_sample(h, make_sample(0, 0, H, W));
  sf_sample *s = make_sample(50, 0, H, W);
  sf_tensor t;
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_INT32, 0, NULL), 0); /* cls as int32, not int64 */
  sf_sample_remove_field(s, 1);
  assert_non_null(sf_sample_add_field(s, "cls", false, &t));
  push_sample(h, s);
  s = make_sample(51, 0, H, W);
  sf_sample_remove_field(s, 0); /* no image */
  push_sample(h, s);
  push_sample(h, make_sample(1, 0, H, W));
  push_sample(h, make_sample(2, 0, H, W));
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch(h, 0, 0, 0, 3);
  assert_int_equal(sf_harness_error_count(h), 2);
  assert_int_equal(sf_harness_skipped(h), 2);
  const sf_error *e = sf_harness_last_error(h);
  assert_string_equal(e->key, "sample0051");
  if (!strstr(e->message, "'png'") || !strstr(e->message, "missing"))
    fail_msg("message does not name the missing field: %s", e->message);
  sf_harness_destroy(&h);
}

static void test_shape_mismatch_fail(void **state) {
  sf_harness *h = new_batch("2", "true");
  sf_harness_set_error_policy(h, 1);
  push_sample(h, make_sample(0, 0, H, W));
  push_sample(h, make_sample(1, 0, H, W + 2));
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN); /* two samples that differ: either may be the odd one */
  assert_int_equal(sf_harness_error_count(h), 0);
  push_sample(h, make_sample(2, 0, H, W)); /* agrees with sample 0: sample 1 is the odd one */
  assert_int_equal(sf_harness_run(h, 0), SF_ESHAPE);
  assert_int_equal(sf_harness_error_count(h), 1);
  sf_harness_destroy(&h); /* the open batch and queued items are freed (ASan checks) */
}

/*
 * n samples an epoch, ids e*n + i; sample `odd` of every epoch has a taller image. The batches must be
 * exactly the others, in order, batch_size at a time: the odd sample is the one skipped (counted once an
 * epoch, with its key and both shapes), whether it is the stream's first sample, its second, the first
 * of a later batch or the middle of one.
 */
static void run_odd_one(int n, int odd, int batch_size, int epochs) {
  char size[16];
  snprintf(size, sizeof size, "%d", batch_size);
  sf_harness *h = new_batch(size, "true");
  for (int e = 0; e < epochs; e++) {
    for (int i = 0; i < n; i++) push_sample(h, make_sample(e * n + i, (uint64_t)e, i == odd ? H + 1 : H, W));
    push_epoch_end(h, (uint64_t)e);
  }
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  for (int e = 0; e < epochs; e++) {
    int ids[64], k = 0;
    for (int i = 0; i < n; i++)
      if (i != odd) ids[k++] = e * n + i;
    for (int j = 0, b = 0; j < k; j += batch_size, b++)
      expect_batch_ids(h, (uint64_t)e, (uint64_t)b, ids + j, k - j < batch_size ? k - j : batch_size);
    expect_epoch_end(h, (uint64_t)e);
  }
  expect_empty(h);
  assert_int_equal(sf_harness_error_count(h), epochs);
  assert_int_equal(sf_harness_skipped(h), epochs);
  const sf_error *e = sf_harness_last_error(h);
  char key[32];
  snprintf(key, sizeof key, "sample%04d", (epochs - 1) * n + odd);
  assert_int_equal(e->code, SF_ESHAPE);
  assert_string_equal(e->key, key);
  if (!strstr(e->message, "'png'") || !strstr(e->message, "[5,5,3]") || !strstr(e->message, "[4,5,3]"))
    fail_msg("message does not name the field and both shapes: %s", e->message);
  sf_harness_destroy(&h);
}

static void test_odd_sample_skipped(void **state) {
  run_odd_one(30, 10, 5, 1); /* the first of a later batch (before: it set every later batch's shape) */
  run_odd_one(30, 0, 5, 1);  /* the stream's first sample */
  run_odd_one(30, 1, 5, 1);  /* its second */
  run_odd_one(30, 12, 5, 1); /* the middle of a batch */
  run_odd_one(30, 29, 5, 1); /* the last, opening a batch of its own */
  run_odd_one(31, 0, 5, 2);  /* the first of each epoch, after an epoch of whole batches */
  run_odd_one(9, 0, 2, 1);   /* batches of two */
  run_odd_one(9, 1, 2, 1);
  run_odd_one(9, 2, 2, 1);
}

/*
 * Before two samples agree nothing is judged: samples of other shapes wait (four at most, the oldest is
 * dropped for a fifth); the first sample with the same fields and shapes as a waiting one settles the
 * shape, and the waiting samples that do not fit it are skipped (one with an extra field fits and joins,
 * as in any batch). At an epoch's end, samples that never agreed each make their own short batch.
 */
static void test_shape_settles(void **state) {
  sf_harness *h = new_batch("3", "true");
  push_sample(h, make_sample(0, 0, H + 1, W));
  push_sample(h, make_sample(1, 0, H + 2, W));
  sf_sample *extra = make_sample(2, 0, H, W);
  sf_tensor t;
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_INT32, 1, (int64_t[]){2}), 0);
  memset(sf_tensor_data(&t), 0, 8);
  assert_non_null(sf_sample_add_field(extra, "more", false, &t));
  push_sample(h, extra);
  push_sample(h, make_sample(3, 0, H + 3, W));
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  expect_empty(h); /* four shapes wait */
  assert_int_equal(sf_harness_error_count(h), 0);
  push_sample(h, make_sample(4, 0, H + 4, W)); /* a fifth: the oldest (0) goes */
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  const char *m = sf_harness_last_error(h)->message;
  if (!strstr(m, "no two of 5 samples") || !strstr(m, "[5,5,3]") || !strstr(m, "[6,5,3]"))
    fail_msg("message does not say why 0 goes, with its shape and the next one's: %s", m);
  push_sample(h, make_sample(5, 0, H, W)); /* 2's shape, but not its fields: waits too, 1 goes */
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  expect_empty(h);
  assert_int_equal(sf_harness_skipped(h), 2);
  assert_int_equal(sf_harness_error_count(h), 2);
  assert_string_equal(sf_harness_last_error(h)->key, "sample0001");
  push_sample(h, make_sample(6, 0, H, W)); /* agrees with 5: 2 fits and joins, 3 and 4 are skipped */
  push_sample(h, make_sample(7, 0, H + 1, W));
  push_sample(h, make_sample(8, 0, H, W));
  push_epoch_end(h, 0);
  push_sample(h, make_sample(10, 1, H + 1, W)); /* a new epoch settles its own shape */
  push_sample(h, make_sample(11, 1, H, W));
  push_epoch_end(h, 1);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch_ids(h, 0, 0, (int[]){2, 5, 6}, 3);
  expect_batch(h, 0, 1, 8, 1);
  expect_epoch_end(h, 0);
  expect_height = H + 1;
  expect_batch(h, 1, 0, 10, 1);
  expect_height = H;
  expect_batch(h, 1, 1, 11, 1);
  expect_epoch_end(h, 1);
  expect_empty(h);
  assert_int_equal(sf_harness_skipped(h), 5); /* 0, 1, 3, 4, 7 */
  assert_int_equal(sf_harness_error_count(h), 5);
  assert_string_equal(sf_harness_last_error(h)->key, "sample0007");
  sf_harness_destroy(&h);
}

/* A non-contiguous image (a transposed view) is copied in logical C order. */
static void test_strided_input(void **state) {
  sf_harness *h = new_batch("2", "true");
  for (int i = 0; i < 2; i++) {
    sf_sample *s = make_sample(i, 0, H, W);
    /* Replace png with a [H,W,C] view of a [W,H,C] buffer: strides (C, H*C, 1). */
    sf_tensor t;
    assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, 3, (int64_t[]){W, H, C}), 0);
    uint8_t *p = sf_tensor_data(&t);
    for (int x = 0; x < W; x++)
      for (int y = 0; y < H; y++)
        for (int c = 0; c < C; c++) *p++ = pixel(i, y, x, c);
    t.shape[0] = H;
    t.shape[1] = W;
    t.strides[0] = C;
    t.strides[1] = H * C;
    assert_false(sf_tensor_is_contiguous(&t));
    sf_sample_remove_field(s, 0);
    assert_non_null(sf_sample_add_field(s, "png", false, &t));
    push_sample(h, s);
  }
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch(h, 0, 0, 0, 2);
  sf_harness_destroy(&h);
}

/*
 * Rows that lie one after another in one buffer (a group process's results in its shared-memory ring)
 * become the batch tensor itself, no copy; a row elsewhere breaks the run and the batch is copied; a
 * short last batch of adjacent rows is a view too. Every reference goes when the batches do.
 */
static void test_adjacent_rows_become_a_view(void **state) {
  enum { ROWS = 10, SLOT = H * W * C };
  sf_buffer *whole = sf_buffer_new(ROWS * SLOT);
  assert_non_null(whole);
  for (int i = 0; i < ROWS; i++) {
    uint8_t *p = sf_buffer_data(whole) + i * SLOT;
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++)
        for (int c = 0; c < C; c++) *p++ = pixel(i, y, x, c);
  }
  sf_harness *h = new_batch("4", "true");
  for (int i = 0; i < ROWS; i++) {
    sf_sample *s = make_sample(i, 0, H, W);
    if (i != 6) { /* sample 6 keeps an image of its own: batch 1 is not adjacent */
      sf_tensor t;
      assert_int_equal(sf_tensor_view(&t, SF_DTYPE_UINT8, 3, (int64_t[]){H, W, C}, sf_buffer_ref(whole),
                                       (size_t)i * SLOT), 0);
      sf_sample_remove_field(s, 0);
      assert_non_null(sf_sample_add_field(s, "png", false, &t));
    }
    push_sample(h, s);
  }
  push_epoch_end(h, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  const uint8_t *base = sf_buffer_data(whole);
  expect_batch(h, 0, 0, 0, 4);
  assert_ptr_equal(last_png, base); /* a view: rows 0..3 where they were */
  expect_batch(h, 0, 1, 4, 4);
  assert_true(last_png < base || last_png >= base + ROWS * SLOT); /* copied into a batch buffer */
  expect_batch(h, 0, 2, 8, 2);
  assert_ptr_equal(last_png, base + 8 * SLOT);
  expect_epoch_end(h, 0);
  sf_harness_destroy(&h);
  assert_true(sf_buffer_is_writable(whole)); /* only this test's reference is left */
  sf_buffer_unref(&whole);
}

/* ---- deferred fields ------------------------------------------------------------------------ */

/* What the counting recipes saw: writes, destroys and where each sample was written. */
static int writes, destroys;
static uint8_t *written_at[128];

typedef struct counting_recipe {
  sf_field_recipe base;
  int id, h, w;
} counting_recipe;

static void counting_write(const sf_field_recipe *base, void *dst) {
  const counting_recipe *r = (const counting_recipe *)base;
  uint8_t *p = dst;
  if (r->id >= 0 && r->id < 128) written_at[r->id] = p;
  for (int y = 0; y < r->h; y++)
    for (int x = 0; x < r->w; x++)
      for (int c = 0; c < C; c++) *p++ = pixel(r->id, y, x, c);
  writes++;
}

static void counting_destroy(sf_field_recipe *base) {
  destroys++;
  free(base);
}

static sf_field_recipe *counting_recipe_new(int id, int h, int w) {
  counting_recipe *r = calloc(1, sizeof *r);
  assert_non_null(r);
  *r = (counting_recipe){{counting_write, counting_destroy}, id, h, w};
  return &r->base;
}

static void reset_counts(void) {
  writes = destroys = 0;
  memset(written_at, 0, sizeof written_at);
}

/* make_sample() with its png replaced by a deferred [h,w,C] field that writes the same pixels. */
static sf_sample *make_deferred_sample(int id, uint64_t epoch, int h, int w) {
  sf_sample *s = make_sample(id, epoch, H, W);
  sf_field *f = sf_sample_field(s, "png");
  assert_int_equal(sf_field_defer(f, SF_DTYPE_UINT8, 3, (int64_t[]){h, w, C}, counting_recipe_new(id, h, w)), 0);
  assert_null(f->tensor.buffer);
  assert_non_null(f->recipe);
  assert_true(sf_tensor_is_contiguous(&f->tensor));
  assert_int_equal(sf_tensor_nbytes(&f->tensor), (size_t)(h * w * C));
  return s;
}

/* Deferred samples are written once, into their own slot of the batch's buffer; recipes are freed once. */
static void test_deferred_written_into_slot(void **state) {
  reset_counts();
  sf_harness *h = new_batch("4", "true");
  for (int i = 0; i < 6; i++) push_sample(h, i == 2 ? make_sample(i, 0, H, W) : make_deferred_sample(i, 0, H, W));
  push_sample(h, make_deferred_sample(99, 0, H + 1, W)); /* wrong shape: dropped, not written */
  push_epoch_end(h, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);

  sf_item item;
  assert_int_equal(sf_harness_pop(h, &item), 0);
  assert_int_equal(item.kind, SF_ITEM_BATCH);
  uint8_t *base = sf_tensor_data(&sf_batch_field(item.u.batch, "png")->tensor);
  for (int i = 0; i < 4; i++)
    if (i != 2) assert_ptr_equal(written_at[i], base + (size_t)i * H * W * C);
  assert_null(written_at[2]); /* an ordinary field is copied */
  sf_item_clear(&item);
  assert_int_equal(sf_harness_pop(h, &item), 0);
  base = sf_tensor_data(&sf_batch_field(item.u.batch, "png")->tensor);
  assert_ptr_equal(written_at[4], base);
  assert_ptr_equal(written_at[5], base + (size_t)H * W * C);
  sf_item_clear(&item);
  assert_null(written_at[99]);
  assert_int_equal(writes, 5);
  assert_int_equal(destroys, 6);
  assert_int_equal(sf_harness_skipped(h), 1);
  sf_harness_destroy(&h);
  assert_int_equal(destroys, 6);
}

/* The pixels of deferred and ordinary samples mixed in one batch, and the drop paths. */
static void test_deferred_contents_and_drops(void **state) {
  reset_counts();
  sf_harness *h = new_batch("4", "false");
  for (int i = 0; i < 10; i++) push_sample(h, i % 3 ? make_deferred_sample(i, 0, H, W) : make_sample(i, 0, H, W));
  push_epoch_end(h, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  expect_batch(h, 0, 0, 0, 4);
  expect_batch(h, 0, 1, 4, 4);
  expect_epoch_end(h, 0);
  expect_empty(h);
  assert_int_equal(sf_harness_skipped(h), 2); /* the short batch (8, 9) is dropped */
  assert_int_equal(destroys, 6);              /* 1 2 4 5 7 8 */
  sf_harness_destroy(&h);

  /* Samples still queued or held when the node goes are freed with their recipes. */
  reset_counts();
  h = new_batch("4", "true");
  sf_harness_set_error_policy(h, 1);
  push_sample(h, make_deferred_sample(0, 0, H, W));
  push_sample(h, make_deferred_sample(1, 0, H, W + 1));
  push_sample(h, make_deferred_sample(2, 0, H, W));
  push_sample(h, make_deferred_sample(3, 0, H, W));
  assert_int_equal(sf_harness_run(h, 0), SF_ESHAPE);
  sf_harness_destroy(&h);
  assert_int_equal(writes, 1);
  assert_int_equal(destroys, 4);
}

/* sf_field_materialize runs the recipe once into a fresh tensor; sf_field_defer checks its shape. */
static void test_materialize_and_defer(void **state) {
  reset_counts();
  sf_sample *s = make_deferred_sample(7, 0, H, W);
  sf_field *f = sf_sample_field(s, "png");
  assert_int_equal(sf_field_materialize(f), 0);
  assert_null(f->recipe);
  assert_non_null(f->tensor.buffer);
  assert_int_equal(sf_buffer_size(f->tensor.buffer), (size_t)(H * W * C));
  assert_false(f->encoded);
  const uint8_t *p = sf_tensor_data(&f->tensor);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++)
      for (int c = 0; c < C; c++) assert_int_equal(*p++, pixel(7, y, x, c));
  assert_int_equal(writes, 1);
  assert_int_equal(destroys, 1);
  assert_int_equal(sf_field_materialize(f), 0); /* no longer deferred: nothing happens */
  assert_int_equal(sf_field_materialize(sf_sample_field(s, "cls")), 0);
  assert_int_equal(*(int64_t *)sf_tensor_data(&sf_sample_field(s, "cls")->tensor), 7);
  assert_int_equal(writes, 1);

  /* A bad shape: the recipe is destroyed and the field stays as it was. */
  sf_field *cls = sf_sample_field(s, "cls");
  assert_int_equal(sf_field_defer(cls, SF_DTYPE_UINT8, 3, (int64_t[]){2, -1, 3}, counting_recipe_new(8, 1, 1)),
                   SF_EINVAL);
  assert_int_equal(sf_field_defer(cls, SF_DTYPE_COUNT_, 0, NULL, counting_recipe_new(8, 1, 1)), SF_EINVAL);
  assert_int_equal(destroys, 3);
  assert_null(cls->recipe);
  assert_int_equal(*(int64_t *)sf_tensor_data(&cls->tensor), 7);

  /* Removing or destroying deferred fields destroys their recipes once; a deferred field can be appended. */
  sf_tensor empty = {0};
  sf_field *g = sf_sample_add_field(s, "seg", false, &empty);
  assert_non_null(g);
  assert_int_equal(sf_field_defer(g, SF_DTYPE_UINT8, 3, (int64_t[]){1, 1, C}, counting_recipe_new(9, 1, 1)), 0);
  assert_int_equal(sf_field_defer(g, SF_DTYPE_UINT8, 3, (int64_t[]){1, 1, C}, counting_recipe_new(9, 1, 1)), 0);
  assert_int_equal(destroys, 4); /* deferring again replaced the first recipe */
  assert_int_equal(sf_field_defer(sf_sample_field(s, "png"), SF_DTYPE_UINT8, 3, (int64_t[]){H, W, C},
                                  counting_recipe_new(7, H, W)),
                   0);
  sf_sample_remove_field(s, 0); /* png */
  assert_int_equal(destroys, 5);
  sf_sample_destroy(&s);
  assert_int_equal(destroys, 6);
  assert_int_equal(writes, 1);
}

static void test_bad_options(void **state) {
  sf_harness *h;
  sf_error error;
  memset(&error, 0, sizeof error);
  assert_int_equal(sf_harness_new(&h, "batch", (const char *[]){"batch_size=0", NULL}, 1, 0, 0, 1, &error),
                   SF_EOPTION);
  assert_null(h);
  assert_int_equal(sf_harness_new(&h, "batch", (const char *[]){"partial=maybe", NULL}, 1, 0, 0, 1, &error),
                   SF_EOPTION);
  assert_int_equal(sf_harness_new(&h, "batch", (const char *[]){"pad=ids", NULL}, 1, 0, 0, 1, &error), SF_EOPTION);
  assert_non_null(strstr(error.message, "pad: 'ids' is not NAME=VALUE"));
}

/* Sample id with txt (encoded) of id bytes 'a'+k and ids int32 [id] of id*10+k. */
static sf_sample *make_varlen_sample(int id) {
  sf_sample *s = make_sample(id, 0, H, W);
  sf_sample_remove_field(s, 2); /* make_sample's bin */
  sf_tensor t;
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, 1, (int64_t[]){id}), 0);
  for (int k = 0; k < id; k++) ((uint8_t *)sf_tensor_data(&t))[k] = (uint8_t)('a' + k);
  assert_non_null(sf_sample_add_field(s, "txt", true, &t));
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_INT32, 1, (int64_t[]){id}), 0);
  for (int k = 0; k < id; k++) ((int32_t *)sf_tensor_data(&t))[k] = id * 10 + k;
  assert_non_null(sf_sample_add_field(s, "ids", false, &t));
  return s;
}

/* ragged txt, padded ids: the values, offsets, lengths and pad, and sf_batch_sample_view() on all three kinds. */
static void test_ragged_and_padded(void **state) {
  sf_harness *h;
  sf_error error;
  memset(&error, 0, sizeof error);
  const char *options[] = {"batch_size=3", "ragged=txt", "pad=ids=-1", NULL};
  if (sf_harness_new(&h, "batch", options, 1, 0, 0, 1, &error)) fail_msg("harness: %s", error.message);
  for (int i = 0; i < 3; i++) push_sample(h, make_varlen_sample(i));
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  assert_int_equal(sf_harness_error_count(h), 0);
  sf_item item;
  assert_int_equal(sf_harness_pop(h, &item), 0);
  sf_batch *b = item.u.batch;
  assert_int_equal(b->n_fields, 6); /* png, cls, txt, txt.offsets, ids, ids.length */
  const sf_field *txt = sf_batch_field(b, "txt"), *offsets = sf_batch_field(b, "txt.offsets");
  assert_true(txt && offsets && txt->tensor.ndim == 1 && txt->tensor.shape[0] == 3);
  assert_memory_equal(sf_tensor_data(&txt->tensor), "aab", 3);
  assert_int_equal(offsets->tensor.dtype, SF_DTYPE_INT64);
  assert_memory_equal(sf_tensor_data(&offsets->tensor), ((int64_t[]){0, 0, 1, 3}), 4 * sizeof(int64_t));
  const sf_field *ids = sf_batch_field(b, "ids"), *length = sf_batch_field(b, "ids.length");
  assert_true(ids && length && ids->tensor.ndim == 2 && ids->tensor.shape[0] == 3 && ids->tensor.shape[1] == 2);
  assert_memory_equal(sf_tensor_data(&ids->tensor), ((int32_t[]){-1, -1, 10, -1, 20, 21}), 6 * sizeof(int32_t));
  assert_int_equal(length->tensor.dtype, SF_DTYPE_INT32);
  assert_memory_equal(sf_tensor_data(&length->tensor), ((int32_t[]){0, 1, 2}), 3 * sizeof(int32_t));

  sf_tensor v;
  assert_int_equal(sf_batch_sample_view(b, "txt", 3, &v), SF_EINVAL);
  assert_int_equal(sf_batch_sample_view(b, "nope", 0, &v), SF_EINVAL);
  assert_int_equal(sf_batch_sample_view(b, "txt", 2, &v), 0);
  assert_true(v.ndim == 1 && v.shape[0] == 2);
  assert_memory_equal(sf_tensor_data(&v), "ab", 2);
  sf_tensor_clear(&v);
  assert_int_equal(sf_batch_sample_view(b, "ids", 1, &v), 0);
  assert_true(v.ndim == 1 && v.shape[0] == 1 && *(int32_t *)sf_tensor_data(&v) == 10);
  sf_tensor_clear(&v);
  assert_int_equal(sf_batch_sample_view(b, "png", 1, &v), 0);
  assert_true(v.ndim == 3 && v.shape[0] == H && v.shape[2] == C);
  assert_int_equal(*(uint8_t *)sf_tensor_data(&v), pixel(1, 0, 0, 0));
  sf_item_clear(&item); /* the view keeps the buffer */
  assert_int_equal(((uint8_t *)sf_tensor_data(&v))[1], pixel(1, 0, 0, 1));
  sf_tensor_clear(&v);
  sf_harness_destroy(&h);
}

/*
 * A plain batch (no ragged or pad): text fields are lists as in WebDataset's default collation. Sample id
 * has an encoded txt of id bytes, a checked (decoded, 1-D uint8) meta.json of id + 1 bytes, a tok.txt
 * that some stage made int32 [2] (stays fixed) and make_sample's png, cls and undecoded bin (left out).
 */
static void test_text_ragged_by_default(void **state) {
  (void)state;
  sf_harness *h = new_batch("4", "true");
  for (int i = 0; i < 4; i++) {
    sf_sample *s = make_varlen_sample(i);
    sf_sample_remove_field(s, 3); /* ids */
    sf_tensor t;
    assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, 1, (int64_t[]){i + 1}), 0);
    memset(sf_tensor_data(&t), '0' + i, (size_t)i + 1);
    assert_non_null(sf_sample_add_field(s, "meta.json", false, &t));
    assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_INT32, 1, (int64_t[]){2}), 0);
    ((int32_t *)sf_tensor_data(&t))[0] = i;
    ((int32_t *)sf_tensor_data(&t))[1] = -i;
    assert_non_null(sf_sample_add_field(s, "tok.txt", false, &t));
    push_sample(h, s);
  }
  assert_int_equal(sf_harness_run(h, 0), SF_EAGAIN);
  assert_int_equal(sf_harness_error_count(h), 0);
  sf_item item;
  assert_int_equal(sf_harness_pop(h, &item), 0);
  sf_batch *b = item.u.batch;
  assert_int_equal(b->size, 4);
  assert_int_equal(b->n_fields, 7); /* png, cls, txt, txt.offsets, meta.json, meta.json.offsets, tok.txt */
  assert_null(sf_batch_field(b, "bin"));
  const sf_field *txt = sf_batch_field(b, "txt"), *off = sf_batch_field(b, "txt.offsets");
  assert_true(txt && off && txt->tensor.dtype == SF_DTYPE_UINT8 && txt->tensor.ndim == 1);
  assert_int_equal(txt->tensor.shape[0], 0 + 1 + 2 + 3);
  assert_memory_equal(sf_tensor_data(&txt->tensor), "aababc", 6);
  assert_memory_equal(sf_tensor_data(&off->tensor), ((int64_t[]){0, 0, 1, 3, 6}), 5 * sizeof(int64_t));
  const sf_field *meta = sf_batch_field(b, "meta.json"), *moff = sf_batch_field(b, "meta.json.offsets");
  assert_true(meta && moff && meta->tensor.ndim == 1 && meta->tensor.shape[0] == 10);
  assert_memory_equal(sf_tensor_data(&meta->tensor), "0112223333", 10);
  assert_memory_equal(sf_tensor_data(&moff->tensor), ((int64_t[]){0, 1, 3, 6, 10}), 5 * sizeof(int64_t));
  const sf_field *tok = sf_batch_field(b, "tok.txt");
  assert_true(tok && tok->tensor.dtype == SF_DTYPE_INT32 && tok->tensor.ndim == 2 && tok->tensor.shape[1] == 2);
  assert_memory_equal(sf_tensor_data(&tok->tensor), ((int32_t[]){0, 0, 1, -1, 2, -2, 3, -3}), 8 * sizeof(int32_t));
  sf_item_clear(&item);
  sf_harness_destroy(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_and_partial),   cmocka_unit_test(test_partial_false_drops),
      cmocka_unit_test(test_epoch_end_flush),    cmocka_unit_test(test_batch_size_one),
      cmocka_unit_test(test_shape_mismatch_skip), cmocka_unit_test(test_dtype_and_missing_field),
      cmocka_unit_test(test_shape_mismatch_fail), cmocka_unit_test(test_strided_input),
      cmocka_unit_test(test_bad_options),       cmocka_unit_test(test_deferred_written_into_slot),
      cmocka_unit_test(test_deferred_contents_and_drops), cmocka_unit_test(test_materialize_and_defer),
      cmocka_unit_test(test_ragged_and_padded), cmocka_unit_test(test_adjacent_rows_become_a_view),
      cmocka_unit_test(test_odd_sample_skipped), cmocka_unit_test(test_shape_settles),
      cmocka_unit_test(test_text_ragged_by_default),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
