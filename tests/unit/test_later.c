/* engine/core/later.c: jobs run soon, in the order asked, on the chores thread; a range handed over is unmapped;
   a forked child's requests are served too. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "later.h"

enum { BYTES = 64 << 10, JOBS = 100 };

static void nap(void) { nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL); }

/* Whether [p, p + BYTES) is still mapped: mincore fails with ENOMEM on a range with unmapped pages. */
static bool mapped(void *p) {
  unsigned char pages[BYTES / 4096];
  return mincore(p, BYTES, pages) == 0 || errno != ENOMEM;
}

/* Waits up to 10 s for p to be unmapped; returns whether it was. */
static bool unmapped_soon(void *p) {
  for (int i = 0; i < 1000 && mapped(p); i++) nap();
  return !mapped(p);
}

static void *new_mapping(void) {
  void *p = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  memset(p, 1, BYTES);
  assert_true(mapped(p));
  return p;
}

static atomic_int done;
static int order[JOBS];
static pthread_t ran_on;

static void job(void *arg) {
  int k = atomic_load(&done);
  order[k] = (int)(intptr_t)arg;
  ran_on = pthread_self();
  atomic_store(&done, k + 1);
}

static void test_jobs_in_order(void **state) {
  (void)state;
  for (int i = 0; i < JOBS; i++) assert_true(sf_later(job, (void *)(intptr_t)i));
  for (int i = 0; i < 1000 && atomic_load(&done) < JOBS; i++) nap();
  assert_int_equal(atomic_load(&done), JOBS);
  for (int i = 0; i < JOBS; i++) assert_int_equal(order[i], i);
  assert_false(pthread_equal(ran_on, pthread_self()));
}

static void test_unmaps(void **state) {
  (void)state;
  void *a = new_mapping(), *b = new_mapping();
  sf_unmap_later(a, BYTES);
  sf_unmap_later(b, BYTES);
  assert_true(unmapped_soon(a));
  assert_true(unmapped_soon(b));
  /* a request after the thread has gone idle wakes it */
  void *c = new_mapping();
  sf_unmap_later(c, BYTES);
  assert_true(unmapped_soon(c));
}

/* The child of a fork has no chores thread of the parent's: its requests are still served. */
static void test_after_fork(void **state) {
  (void)state;
#if defined(__SANITIZE_THREAD__)
  skip(); /* ThreadSanitizer cannot start threads in the child of a multi-threaded process */
#endif
  sf_unmap_later(new_mapping(), BYTES); /* the parent's thread runs */
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    void *p = new_mapping();
    sf_unmap_later(p, BYTES);
    _exit(unmapped_soon(p) ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_jobs_in_order), cmocka_unit_test(test_unmaps),
                                     cmocka_unit_test(test_after_fork)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
