/* Lent rows: positions to slab rows, a row lent once, realigning after a dropped sample, slabs back to the pool
 * and known as its own (sf_pool_owns). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lent_rows.h"

enum { ROWS = 4 };
static const int64_t SHAPE[2] = {3, 5}; /* a row: float32 [3, 5], 60 bytes */
static const size_t ROW_BYTES = 60;

/* The row of position p (1 when lent), with its first byte in *at. */
static int borrow(sf_lent_rows *l, uint64_t p, sf_tensor *row, uint8_t **at) {
  memset(row, 0, sizeof *row);
  int r = sf_lent_rows_borrow(l, p, SF_DTYPE_FLOAT32, 2, SHAPE, row);
  *at = r == 1 ? (uint8_t *)sf_tensor_data(row) : NULL;
  return r;
}

static void test_positions_to_rows(void **state) {
  (void)state;
  sf_pool *pool = sf_pool_new(8);
  sf_lent_rows *l = sf_lent_rows_new(pool, ROWS);
  sf_tensor row[2 * ROWS];
  uint8_t *at[2 * ROWS];
  /* producers run out of order: positions 5, 0, 4, 1, ... still land at their rows */
  static const uint64_t order[2 * ROWS] = {5, 0, 4, 1, 7, 2, 6, 3};
  for (int i = 0; i < 2 * ROWS; i++) assert_int_equal(borrow(l, order[i], &row[order[i]], &at[order[i]]), 1);
  for (int p = 0; p < 2 * ROWS; p++) {
    assert_true(sf_tensor_is_contiguous(&row[p]));
    assert_int_equal(sf_tensor_nbytes(&row[p]), ROW_BYTES);
    if (p % ROWS) assert_ptr_equal(at[p], at[p - 1] + ROW_BYTES); /* the rows of a batch follow each other */
  }
  assert_ptr_not_equal(row[0].buffer, row[ROWS].buffer); /* two batches, two slabs */
  /* the slabs are the pool's (so pinned memory when the pool pins): batch tells them from other rows so */
  sf_pool *another = sf_pool_new(1);
  sf_buffer *plain = sf_buffer_new(ROW_BYTES);
  assert_true(sf_pool_owns(pool, row[0].buffer) && sf_pool_owns(pool, row[ROWS].buffer));
  assert_false(sf_pool_owns(another, row[0].buffer));
  assert_false(sf_pool_owns(pool, plain) || sf_pool_owns(pool, NULL));
  sf_buffer_unref(&plain);
  sf_pool_unref(&another);
  sf_tensor again;
  uint8_t *unused;
  assert_int_equal(borrow(l, 2, &again, &unused), 0); /* lent once only */
  int64_t other[2] = {3, 6};
  assert_int_equal(sf_lent_rows_borrow(l, 8, SF_DTYPE_FLOAT32, 2, other, &again), 0); /* another shape */
  assert_int_equal(sf_lent_rows_borrow(l, 8, SF_DTYPE_UINT8, 2, SHAPE, &again), 0);   /* another dtype */
  uint64_t lent, realigned;
  sf_lent_rows_counts(l, &lent, &realigned);
  assert_int_equal(lent, 2 * ROWS);
  assert_int_equal(realigned, 0);
  for (int p = 0; p < 2 * ROWS; p++) sf_tensor_clear(&row[p]);
  sf_lent_rows_free(l);
  sf_pool_unref(&pool);
}

static void test_realign_after_a_drop(void **state) {
  (void)state;
  sf_pool *pool = sf_pool_new(8);
  sf_lent_rows *l = sf_lent_rows_new(pool, ROWS);
  sf_tensor row;
  uint8_t *at, *first = NULL;
  /* positions 0..2 reach rows 0..2; position 1's sample was dropped, so position 2 is put at row 1 */
  sf_lent_rows_placed(l, 0, 0);
  sf_lent_rows_placed(l, 2, 1);
  uint64_t lent, realigned;
  sf_lent_rows_counts(l, &lent, &realigned);
  assert_int_equal(realigned, 1);
  /* that batch's rows 2 and 3 are positions 3 and 4; the next batch starts at position 5 in a slab of its own */
  assert_int_equal(borrow(l, 3, &row, &at), 0);
  assert_int_equal(borrow(l, 4, &row, &at), 0);
  for (uint64_t p = 5; p < 5 + ROWS; p++) {
    assert_int_equal(borrow(l, p, &row, &at), 1);
    if (p == 5) first = at;
    assert_ptr_equal(at, first + (p - 5) * ROW_BYTES);
    sf_tensor_clear(&row);
    sf_lent_rows_placed(l, p, (int64_t)(p - 5));
  }
  sf_lent_rows_counts(l, &lent, &realigned);
  assert_int_equal(realigned, 1); /* placed where lent: nothing to realign */
  /* a short batch at an epoch's end (2 rows), then the next epoch's first sample at row 0 */
  sf_lent_rows_placed(l, 9, 0);
  sf_lent_rows_placed(l, 10, 1);
  sf_lent_rows_placed(l, 11, 0);
  sf_lent_rows_counts(l, &lent, &realigned);
  assert_int_equal(realigned, 2);
  assert_int_equal(borrow(l, 11 + ROWS, &row, &at), 1);
  assert_int_equal(sf_tensor_nbytes(&row), ROW_BYTES);
  assert_int_equal(row.offset, 0); /* row 0 of a new slab */
  sf_tensor_clear(&row);
  sf_lent_rows_free(l);
  sf_pool_unref(&pool);
}

/* After a realignment the rows start past what producers have borrowed; passed slabs do not pile up. */
static void test_realign_past_the_producers(void **state) {
  (void)state;
  sf_pool *pool = sf_pool_new(8);
  sf_lent_rows *l = sf_lent_rows_new(pool, ROWS);
  sf_tensor row;
  uint8_t *at;
  for (uint64_t p = 0; p < 7; p++) { /* producers ran ahead to position 6 */
    assert_int_equal(borrow(l, p, &row, &at), 1);
    sf_tensor_clear(&row);
  }
  sf_lent_rows_placed(l, 0, 0);
  sf_lent_rows_placed(l, 2, 1); /* position 1 was dropped */
  /* the next batch would start at 5, but 5 and 6 were lent under the old rows: it starts at 9 */
  assert_int_equal(borrow(l, 7, &row, &at), 0);
  assert_int_equal(borrow(l, 8, &row, &at), 0);
  assert_int_equal(borrow(l, 9, &row, &at), 1);
  assert_int_equal(row.offset, 0);
  sf_tensor_clear(&row);
  sf_lent_rows_free(l);
  /* every slab has a row nobody borrows (its sample went elsewhere): once the consumer is past a slab, it
     goes back to the pool, so slabs do not pile up */
  l = sf_lent_rows_new(pool, ROWS);
  for (uint64_t p = 0; p < 40 * ROWS; p++) {
    if (p % ROWS != ROWS - 1) {
      assert_int_equal(borrow(l, p, &row, &at), 1);
      sf_tensor_clear(&row);
    }
    sf_lent_rows_placed(l, p, (int64_t)(p % ROWS));
  }
  assert_true(sf_pool_allocated(pool) <= 3);
  sf_lent_rows_free(l);
  sf_pool_unref(&pool);
}

static void test_slabs_go_back_to_the_pool(void **state) {
  (void)state;
  sf_pool *pool = sf_pool_new(8);
  sf_lent_rows *l = sf_lent_rows_new(pool, ROWS);
  for (uint64_t p = 0; p < 100 * ROWS; p++) { /* every row written and let go, as batches are consumed */
    sf_tensor row;
    uint8_t *at;
    assert_int_equal(borrow(l, p, &row, &at), 1);
    memset(at, (int)p, ROW_BYTES);
    sf_tensor_clear(&row);
  }
  assert_true(sf_pool_allocated(pool) <= 2); /* a full slab leaves the table: reused, not kept */
  /* a producer far behind the eight slabs kept (each with rows still to lend) gets no row: its own memory */
  sf_tensor held[8];
  uint8_t *at;
  for (int k = 0; k < 8; k++) assert_int_equal(borrow(l, (uint64_t)(200 + k) * ROWS, &held[k], &at), 1);
  sf_tensor row;
  assert_int_equal(borrow(l, 150 * ROWS, &row, &at), 0);
  assert_int_equal(borrow(l, 208 * ROWS, &row, &at), 1); /* a newer one takes the oldest's place */
  sf_tensor_clear(&row);
  assert_int_equal(borrow(l, 200 * ROWS + 1, &row, &at), 0);
  for (int k = 0; k < 8; k++) sf_tensor_clear(&held[k]);
  sf_lent_rows_free(l);
  sf_pool_unref(&pool);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_positions_to_rows),
      cmocka_unit_test(test_realign_after_a_drop),
      cmocka_unit_test(test_realign_past_the_producers),
      cmocka_unit_test(test_slabs_go_back_to_the_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
