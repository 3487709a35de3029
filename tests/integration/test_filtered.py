"""A filter stage (a map stage that sets *sample = NULL) drops samples on purpose: they are counted as
"filtered" in the stage table, are not errors and stay outside the error budget, so a filter keeping one
sample in ten runs to the end under max_error_rate 0.5 and keeps exactly the samples Python's rule keeps."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run, stage_table  # noqa: E402

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


def run_tenth(name, tenth_options, groups=""):
    """Runs shard_source, tar_split, the plugin's `tenth` filter (with tenth_options), decode, batch under
    max_error_rate 0.5; returns (stderr, the kept keys in order, the head's stage table)."""
    out, graph = os.path.join(tmp, f"out-{name}"), os.path.join(tmp, f"{name}.yaml")
    with open(graph, "w") as f:
        f.write(f"plugins: [{so}]\nseed: 1\nmax_error_rate: 0.5\n{groups}stages:\n"
                f"  - type: shard_source\n    urls: {urls}\n  - type: tar_split\n"
                f"  - type: tenth\n{tenth_options}  - type: decode\n"
                f"  - type: batch\n    batch_size: 5\n  - type: device_sink\n    npy_dir: {out}\n")
    p = run(["run", graph, "--quiet"], check=False, env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=""))
    check(p.returncode == 0, f"{name}: 90% filtered is not over max_error_rate 0.5:\n{p.stderr}")
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks] if os.path.isdir(out) else []
    check(keys == want, f"{name}: the samples kept are Python's, in order ({len(keys)} of {len(want)})")
    return p.stderr, stage_table(p.stderr)


for replicas in (1, 2):
    stderr, table = run_tenth(f"replicas{replicas}", f"    replicas: {replicas}\n")
    row = table.get("tenth", {})
    got = tuple(row.get(k) for k in ("reps", "items", "errors", "skipped", "filtered"))
    check(got == (replicas, len(want), 0, 0, len(truth) - len(want)),
          f"replicas {replicas}: the table's tenth row (reps, items, errors, skipped, filtered) = {got}:\n{stderr}")
    check("skipped" not in stderr.splitlines()[-1], f"no error summary line: {stderr.splitlines()[-1]}")

# In a group's worker process: the worker's results say filtered, not skipped, so the head's budget holds too.
stderr, table = run_tenth("group", "    group: g\n", groups="groups:\n  g: {processes: 1}\n")
head = [row for row in table.values() if row["stage"] == "_group"]
check(len(head) == 1 and (head[0]["skipped"], head[0]["filtered"]) == (0, len(truth) - len(want)),
      f"group: the head's table counts 0 skipped, {len(truth) - len(want)} filtered:\n{stderr}")
shutil.rmtree(tmp, ignore_errors=True)
check.done("filtered")
