"""Stopping a head in the middle of a run with a group: no crash, whatever the window holds.

A head's window holds units in every state (sent, done and passed on in part, waiting); closing the
pipeline frees them all.  Two ways to stop mid-run: a run with `error_policy: fail` whose worker
meets a bad `.cls` (the CLI must report the error and exit 1, not die of a signal), and a Python
trainer that closes its pipeline after one batch, or restarts it through set_epoch / load_state_dict.
The Python half runs only without sanitizers (Debian's python cannot host their runtimes).
"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, group_graph, make_dataset, read_batches, run, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-groups-close-")
urls, truth = make_dataset(tmp, shards=6, per_shard=200, size=16)


def graph(name, group, source_urls=urls, **settings):
    return group_graph(tmp, name, source_urls, group, seed=3, **settings)


# The CLI: error_policy fail and one bad .cls on a worker, many units in the window when it fails.
bad_dir = os.path.join(tmp, "bad")
os.makedirs(bad_dir)
img = np.zeros((16, 16, 3), np.uint8)
ppm = b"P6\n16 16\n255\n" + img.tobytes()
bad_url = write_shard(os.path.join(bad_dir, "bad-000000.tar"), [
    (f"{i:07d}", {"ppm": ppm, "cls": b"x" if i == 300 else b"1"}) for i in range(600)])
one_path, _ = graph("bad-one", None, source_urls=bad_url, error_policy="fail", epochs=1)
one = run(["run", one_path, "--no-summary", "--log-steps", "0"], check=False)
check(one.returncode == 1 and "0000300" in one.stderr, f"one process fails on the bad .cls: {one.returncode} {one.stderr}")
for attempt in range(3):
    path, _ = graph(f"bad-group-{attempt}", {"processes": 2, "unit_samples": 4}, source_urls=bad_url,
                    error_policy="fail", epochs=1)
    p = run(["run", path, "--no-summary", "--log-steps", "0"], check=False)
    check(p.returncode == 1, f"attempt {attempt}: the group's run exits 1 like one process's, not {p.returncode}:\n"
          f"{p.stderr[-3000:]}")
    check("0000300" in p.stderr and "bad-000000.tar" in p.stderr, f"...naming the key and the shard: {p.stderr}")

if os.environ.get("SF_SANITIZE", "none") != "none":
    check.done("groups_close (CLI only: sanitizers)")
    sys.exit(0)

# Python: close after one batch, set_epoch and load_state_dict in the middle of an epoch.
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
import shardflow   # noqa: E402

ref_path, ref_out = graph("reference", None, epochs=2)
run(["run", ref_path, "--quiet", "--no-summary"])
reference = read_batches(ref_out)
path, _ = graph("python", {"processes": 2, "unit_samples": 8}, epochs=2)
for attempt in range(3):
    p = shardflow.Pipeline(path, output="dict", device_sink__npy_dir="")
    first = p.next_batch()
    check(first["__key__"] == reference[0][2], "the first batch is one process's")
    p.close()
with shardflow.Pipeline(path, output="dict", device_sink__npy_dir="") as p:
    for _ in range(3):
        p.next_batch()
    p.set_epoch(1)  # restarts the pipeline in the middle of epoch 0
    got = [b["__key__"] for b in p]
check(got == [k for e, _, k, _ in reference if e == 1], "set_epoch(1) in the middle of epoch 0: epoch 1's batches")
with shardflow.Pipeline(path, output="dict", device_sink__npy_dir="") as p:
    for _ in range(4):
        p.next_batch()
    state = p.state_dict()
    p.next_batch()
    p.load_state_dict(state)  # back two batches: a restart with units in flight
    got = [b["__key__"] for b in p]
check(got == [k for e, b, k, _ in reference if e == 0 and b >= 4], "load_state_dict mid-epoch resumes at batch 4")
check.done("groups_close")
