/* engine/core/cpu_budget.c: the CPU budget from the affinity mask and a cgroup's quota (v2 cpu.max, v1 cfs files). */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_budget.h"

static char root[64];

static void put(const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", root, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof root, "%s/sf-cpu-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(root)) return -1;
  char v1[128];
  snprintf(v1, sizeof v1, "%s/cpu", root);
  return mkdir(v1, 0700);
}

static int teardown(void **state) {
  (void)state;
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

/* The affinity mask's CPUs, as the kernel reports them: what the budget is without a quota. */
static int affinity(void) {
  cpu_set_t set;
  assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

static void test_no_cgroup_files(void **state) {
  (void)state;
  sf_cpu_budget b = sf_cpu_budget_at("/nonexistent");
  assert_int_equal(b.quota, 0);
  assert_int_equal(b.affinity, affinity());
  assert_int_equal(b.cpus, affinity());
}

static void test_v2_quota_rounds_up(void **state) {
  (void)state;
  put("cpu.max", "max 100000\n");
  assert_int_equal(sf_cpu_budget_at(root).cpus, affinity()); /* no limit */
  put("cpu.max", "50000 100000\n");                          /* half a CPU: one */
  sf_cpu_budget b = sf_cpu_budget_at(root);
  assert_true(b.quota > 0.49 && b.quota < 0.51);
  assert_int_equal(b.cpus, 1);
  put("cpu.max", "100000000 100000\n"); /* 1000 CPUs: the mask is the smaller */
  assert_int_equal(sf_cpu_budget_at(root).cpus, affinity());
  put("cpu.max", "garbage\n");
  assert_int_equal(sf_cpu_budget_at(root).cpus, affinity());
  char path[256];
  snprintf(path, sizeof path, "%s/cpu.max", root);
  unlink(path);
}

static void test_v1_quota(void **state) {
  (void)state;
  put("cpu/cpu.cfs_quota_us", "-1\n");
  put("cpu/cpu.cfs_period_us", "100000\n");
  assert_int_equal(sf_cpu_budget_at(root).cpus, affinity());
  put("cpu/cpu.cfs_quota_us", "100001\n"); /* just over one CPU: two, if the mask has them */
  assert_int_equal(sf_cpu_budget_at(root).cpus, affinity() < 2 ? affinity() : 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_cgroup_files),
      cmocka_unit_test(test_v2_quota_rounds_up),
      cmocka_unit_test(test_v1_quota),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
