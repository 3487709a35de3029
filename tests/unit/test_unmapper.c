/* engine/io/unmapper.c: a range handed over is unmapped soon by the unmapper's thread, in a forked child too. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "unmapper.h"

enum { BYTES = 64 << 10 };

/* Whether [p, p + BYTES) is still mapped: mincore fails with ENOMEM on a range with unmapped pages. */
static bool mapped(void *p) {
  unsigned char pages[BYTES / 4096];
  return mincore(p, BYTES, pages) == 0 || errno != ENOMEM;
}

/* Waits up to 10 s for p to be unmapped; returns whether it was. */
static bool unmapped_soon(void *p) {
  for (int i = 0; i < 1000 && mapped(p); i++) nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
  return !mapped(p);
}

static void *new_mapping(void) {
  void *p = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  memset(p, 1, BYTES);
  assert_true(mapped(p));
  return p;
}

static void test_unmaps(void **state) {
  (void)state;
  void *a = new_mapping(), *b = new_mapping();
  sf_unmap_later(a, BYTES);
  sf_unmap_later(b, BYTES);
  assert_true(unmapped_soon(a));
  assert_true(unmapped_soon(b));
  /* a third request after the thread has gone idle wakes it */
  void *c = new_mapping();
  sf_unmap_later(c, BYTES);
  assert_true(unmapped_soon(c));
}

/* The child of a fork has no unmapper thread of the parent's: its requests are still served. */
static void test_after_fork(void **state) {
  (void)state;
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
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_unmaps), cmocka_unit_test(test_after_fork)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
