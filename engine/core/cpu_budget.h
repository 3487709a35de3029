/* How many CPUs this process may use: the budget the plan spreads replicas and pool threads over. */
#ifndef SF_ENGINE_CPU_BUDGET_H
#define SF_ENGINE_CPU_BUDGET_H

/* Where a budget came from, for `run --explain` and the bottleneck report. */
typedef struct sf_cpu_budget {
  int cpus;          /* the budget: the smallest of the three below that is set, at least 1 */
  int online;        /* sysconf(_SC_NPROCESSORS_ONLN) */
  int affinity;      /* CPUs in sched_getaffinity(0), 0 when it failed */
  double quota;      /* the cgroup's CPU quota in CPUs (cpu.max, or cfs_quota_us / cfs_period_us), 0 = none */
} sf_cpu_budget;

/*
 * The CPUs this process may use: the CPUs of its affinity mask (taskset, Slurm's and Kubernetes' cpusets),
 * capped by the cgroup's CPU quota rounded up (cgroup v2 /sys/fs/cgroup/cpu.max, v1 cpu.cfs_quota_us over
 * cpu.cfs_period_us, as the container runtimes set for `--cpus` / CPU limits). Never fails: what cannot be
 * read counts as no limit. Reads /sys each call; call it once per plan.
 */
sf_cpu_budget sf_cpu_budget_get(void);

/* sf_cpu_budget_get() with the cgroup filesystem at cgroup_root instead of /sys/fs/cgroup (tests). */
sf_cpu_budget sf_cpu_budget_at(const char *cgroup_root);

#endif
