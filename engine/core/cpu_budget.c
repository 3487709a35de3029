/* The CPU budget: affinity mask and cgroup quota, the limits schedulers and container runtimes set. */
#include "cpu_budget.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The quota in CPUs from cgroup v2's cpu.max ("max 100000" or "QUOTA PERIOD"), else v1's two files; 0 = none. */
static FILE *open_at(const char *root, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", root, name);
  return fopen(path, "re");
}

static double cgroup_quota(const char *root) {
  char max[64] = "";
  FILE *f = open_at(root, "cpu.max");
  if (f) {
    long long quota = 0, period = 0;
    int got = fscanf(f, "%63s %lld", max, &period);
    fclose(f);
    if (got == 2 && strcmp(max, "max") != 0 && sscanf(max, "%lld", &quota) == 1 && quota > 0 && period > 0)
      return (double)quota / (double)period;
    return 0;
  }
  long long quota = -1, period = 0;
  if ((f = open_at(root, "cpu/cpu.cfs_quota_us"))) {
    if (fscanf(f, "%lld", &quota) != 1) quota = -1;
    fclose(f);
  }
  if ((f = open_at(root, "cpu/cpu.cfs_period_us"))) {
    if (fscanf(f, "%lld", &period) != 1) period = 0;
    fclose(f);
  }
  return quota > 0 && period > 0 ? (double)quota / (double)period : 0;
}

sf_cpu_budget sf_cpu_budget_get(void) { return sf_cpu_budget_at("/sys/fs/cgroup"); }

sf_cpu_budget sf_cpu_budget_at(const char *cgroup_root) {
  sf_cpu_budget b = {0};
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  b.online = online > 0 ? (int)online : 1;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) b.affinity = CPU_COUNT(&set);
  b.quota = cgroup_quota(cgroup_root);
  b.cpus = b.affinity > 0 && b.affinity < b.online ? b.affinity : b.online;
  if (b.quota > 0 && (int)ceil(b.quota) < b.cpus) b.cpus = (int)ceil(b.quota);
  if (b.cpus < 1) b.cpus = 1;
  return b;
}
