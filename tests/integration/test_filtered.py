"""A filter stage (a map stage that sets *sample = NULL) drops samples on purpose: they are counted as
"filtered" in the stage table, are not errors and stay outside the error budget, so a filter keeping one
sample in ten runs to the end under max_error_rate 0.5 and keeps exactly the samples Python's rule keeps."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-filtered-")
source = os.environ["SF_SOURCE_ROOT"]
urls, truth = make_dataset(tmp, shards=2, per_shard=100, size=6, seed=5)

TENTH = """#include <stdlib.h>
#include <shardflow/plugin.h>
static int map(sf_node *node, sf_sample **sample) {
  (void)node;
  if (atoi((*sample)->key) % 10 != 7) sf_sample_destroy(sample); /* keeps keys ending in 7 */
  return 0;
}
static const sf_stage_def s = {.abi_version = SF_STAGE_ABI_VERSION, .name = "tenth", .summary = "test",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}), .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP, .map = map};
static const sf_stage_def *const stages[] = {&s, 0};
static const sf_plugin p = {.abi_version = SF_STAGE_ABI_VERSION, .name = "tenth", .build_id = "1", .stages = stages};
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &p; }
"""
with open(os.path.join(tmp, "tenth.c"), "w") as f:
    f.write(TENTH)
so = os.path.join(tmp, "tenth.so")
subprocess.run(["cc", "-shared", "-fPIC", "-I" + os.path.join(source, "include"), os.path.join(tmp, "tenth.c"),
                "-o", so], check=True)

want = [k for k in sorted(truth) if int(k) % 10 == 7]
for replicas in (1, 2):
    out = os.path.join(tmp, f"out{replicas}")
    graph = os.path.join(tmp, f"g{replicas}.yaml")
    with open(graph, "w") as f:
        f.write(f"plugins: [{so}]\nseed: 1\nmax_error_rate: 0.5\nstages:\n"
                f"  - type: shard_source\n    urls: {urls}\n  - type: tar_split\n"
                f"  - type: tenth\n    replicas: {replicas}\n  - type: decode\n"
                f"  - type: batch\n    batch_size: 5\n  - type: device_sink\n    npy_dir: {out}\n")
    p = run(["run", graph, "--quiet"], check=False, env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=""))
    check(p.returncode == 0, f"replicas {replicas}: 90% filtered is not over max_error_rate 0.5:\n{p.stderr}")
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks] if os.path.isdir(out) else []
    check(keys == want, f"replicas {replicas}: the samples kept are Python's, in order ({len(keys)} of {len(want)})")
    row = re.search(r"^tenth\s+tenth\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)\s+(\d+)\s+(\d+)\s*$",
                    p.stderr, re.M)
    check(row is not None, f"replicas {replicas}: the stage table has a row for tenth with a filtered column:\n"
          f"{p.stderr}")
    if row:
        reps, items, errors, skipped, filtered = map(int, row.groups())
        check((reps, items, errors, skipped, filtered) == (replicas, len(want), 0, 0, len(truth) - len(want)),
              f"replicas {replicas}: items, errors, skipped, filtered = {items}, {errors}, {skipped}, {filtered}")
    check("skipped" not in p.stderr.splitlines()[-1], f"no error summary line: {p.stderr.splitlines()[-1]}")

# In a group's worker process: the worker's results say filtered, not skipped, so the head's budget holds too.
out = os.path.join(tmp, "out-group")
graph = os.path.join(tmp, "group.yaml")
with open(graph, "w") as f:
    f.write(f"plugins: [{so}]\nseed: 1\nmax_error_rate: 0.5\ngroups:\n  g: {{processes: 1}}\nstages:\n"
            f"  - type: shard_source\n    urls: {urls}\n  - type: tar_split\n"
            f"  - type: tenth\n    group: g\n  - type: decode\n"
            f"  - type: batch\n    batch_size: 5\n  - type: device_sink\n    npy_dir: {out}\n")
p = run(["run", graph, "--quiet"], check=False, env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=""))
check(p.returncode == 0, f"group: 90% filtered in a worker is not over max_error_rate 0.5:\n{p.stderr}")
keys = [k for _, _, ks, _ in read_batches(out) for k in ks] if os.path.isdir(out) else []
check(keys == want, f"group: the samples kept are Python's ({len(keys)} of {len(want)})")
row = re.search(r"^\S+\s+_remote\s+.*\s(\d+)\s+(\d+)\s*$", p.stderr, re.M)
check(row is not None and row.groups() == ("0", str(len(truth) - len(want))),
      f"group: the head's table counts 0 skipped, {len(truth) - len(want)} filtered:\n{p.stderr}")
shutil.rmtree(tmp, ignore_errors=True)
check.done("filtered")
