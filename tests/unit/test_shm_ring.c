/* Shared-memory rings: reservations, out-of-order releases, the head's checks of extents, lifetimes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "shm_ring.h"

/* A head's ring of 64 KiB and the worker's mapping of the same memfd. */
static void pair(size_t size, sf_shm_ring **head, sf_shm_ring **worker) {
  int fd;
  sf_error e;
  assert_int_equal(sf_shm_ring_new(size, head, &fd, &e), 0);
  assert_int_equal(sf_shm_ring_attach(fd, worker, &e), 0);
}

static void test_reserve_release(void **state) {
  sf_shm_ring *head, *worker;
  pair(65536, &head, &worker);
  uint64_t p[4];
  uint8_t *w0 = sf_shm_ring_reserve(worker, 20000, &p[0]);
  uint8_t *w1 = sf_shm_ring_reserve(worker, 20000, &p[1]);
  uint8_t *w2 = sf_shm_ring_reserve(worker, 20000, &p[2]);
  assert_non_null(w0);
  assert_non_null(w1);
  assert_non_null(w2);
  assert_int_equal(p[0], 0);
  assert_int_equal(p[1], 20032); /* 64-byte aligned */
  assert_int_equal(p[2], 40064);
  assert_null(sf_shm_ring_reserve(worker, 20000, &p[3])); /* would wrap: skipped to 65536, over the unreleased */
  memset(w0, 0xa0, 20000);
  memset(w1, 0xa1, 20000);
  memset(w2, 0xa2, 20000);
  sf_buffer *v[3];
  sf_error e;
  for (int i = 0; i < 3; i++) assert_int_equal(sf_shm_ring_view(head, p[i], 20000, &v[i], &e), 0);
  /* the head's mapping holds what the worker wrote */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(sf_buffer_size(v[i]), 20000);
    assert_int_equal(sf_buffer_data(v[i])[0], 0xa0 + i);
    assert_int_equal(sf_buffer_data(v[i])[19999], 0xa0 + i);
  }
  /* released out of order: nothing is free until the oldest goes */
  sf_buffer_unref(&v[1]);
  assert_int_equal(sf_shm_ring_freed(head), 0);
  sf_buffer_unref(&v[0]);
  assert_int_equal(sf_shm_ring_freed(head), 40032);
  sf_shm_ring_set_freed(worker, sf_shm_ring_freed(head));
  uint8_t *w3 = sf_shm_ring_reserve(worker, 20000, &p[3]);
  assert_non_null(w3);
  assert_int_equal(p[3], 65536); /* the tail was skipped: offset 0 again */
  assert_ptr_equal(w3, w0);
  sf_buffer *v3;
  assert_int_equal(sf_shm_ring_view(head, p[3], 20000, &v3, &e), 0);
  /* a worker's reservations whose message was never sent are taken back */
  uint64_t mark = sf_shm_ring_mark(worker), q;
  assert_non_null(sf_shm_ring_reserve(worker, 1000, &q));
  sf_shm_ring_rollback(worker, mark);
  assert_int_equal(sf_shm_ring_mark(worker), mark);
  /* views keep the head's mapping after its own reference goes */
  sf_shm_ring_unref(&head);
  assert_int_equal(sf_buffer_data(v[2])[123], 0xa2);
  sf_buffer_unref(&v[2]);
  sf_buffer_unref(&v3);
  sf_shm_ring_unref(&worker);
}

/* Extents a worker could send by mistake or malice are refused, never mapped outside the ring. */
static void test_view_checks(void **state) {
  sf_shm_ring *head, *worker;
  pair(65536, &head, &worker);
  sf_buffer *v, *keep;
  sf_error e;
  assert_int_equal(sf_shm_ring_view(head, 0, 0, &v, &e), SF_EFORMAT);                 /* empty */
  assert_int_equal(sf_shm_ring_view(head, 0, 65537, &v, &e), SF_EFORMAT);             /* larger than the ring */
  assert_int_equal(sf_shm_ring_view(head, 60000, 10000, &v, &e), SF_EFORMAT);         /* wraps */
  assert_non_null(strstr(e.message, "wraps"));
  assert_int_equal(sf_shm_ring_view(head, UINT64_MAX - 10, 100, &v, &e), SF_EFORMAT); /* overflows */
  assert_int_equal(sf_shm_ring_view(head, 1000, 1000, &keep, &e), 0);
  assert_int_equal(sf_shm_ring_view(head, 1500, 100, &v, &e), SF_EFORMAT);            /* overlaps */
  assert_int_equal(sf_shm_ring_view(head, 0, 100, &v, &e), SF_EFORMAT);               /* goes back */
  assert_int_equal(sf_shm_ring_view(head, 65536 + 1500, 100, &v, &e), SF_EFORMAT);    /* over one in use */
  assert_non_null(strstr(e.message, "still in use"));
  sf_buffer_unref(&keep);
  assert_int_equal(sf_shm_ring_view(head, 65536 + 1500, 100, &v, &e), 0);             /* now free */
  sf_buffer_unref(&v);
  sf_shm_ring_unref(&head);
  sf_shm_ring_unref(&worker);
  /* only a sealed memfd is a ring */
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  assert_int_equal(sf_shm_ring_attach(fds[0], &worker, &e), SF_EINVAL);
  assert_null(worker);
  close(fds[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reserve_release),
      cmocka_unit_test(test_view_checks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
