"""A soak through a group: thousands of short epochs, every epoch's sample count checked.

A worker marks the end of each work unit with an epoch-end marker that follows the unit's samples
through the group's stages; the unit's result is whatever reached the worker's sink before it.  Every
unit boundary is a chance to attribute a sample to the wrong unit (or to none): tiny shards and
units make thousands of boundaries a second.  Units larger than the worker's queues (the source
stops in the middle of one) and worker pools with many more threads than cores (a thread pre-empted
between two steps) are where the order of events varies most.

Expected: every epoch delivers every sample of the dataset (checked by count for every epoch, by key
against Python's tarfile in a short run), no error record, no sample skipped.
"""
import glob
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run, tar_keys, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-groups-soak-")
slow = os.environ.get("SF_SANITIZE", "none") != "none"


def dataset(name, shards, per_shard):
    """Shards of 4x4 images; returns (url pattern, the keys Python's tarfile reads, sorted)."""
    root = os.path.join(tmp, name)
    os.makedirs(root)
    urls, _ = make_dataset(root, shards=shards, per_shard=per_shard, size=4)
    keys = sorted(tar_keys(*sorted(glob.glob(os.path.join(root, "shard-*.tar")))))
    check(len(keys) == shards * per_shard, f"tarfile reads {len(keys)} samples")
    return urls, keys


def soak(name, data, epochs, **group):
    urls, keys = data
    out = os.path.join(tmp, name)
    path = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, shuffle=True)),
        ("tar_split", {}),
        ("decode", dict(group="decoders")),
        ("augment", dict(crop="center", size=4, layout="chw", dtype="float32", group="decoders")),
        ("batch", dict(batch_size=16, partial=True)),
        ("device_sink", dict(npy_dir=out if epochs <= 2 else "")),
    ], groups={"decoders": group}, seed=11, epochs=epochs)
    t0 = time.monotonic()
    p = run(["run", path, "--log-steps", "0"], check=False)
    took = time.monotonic() - t0
    what = f"{name} ({group})"
    check(p.returncode == 0, f"{what}: the run succeeds:\n{p.stderr[-3000:]}")
    counts = [int(line.split("Samples=")[1].split()[0]) for line in p.stdout.splitlines() if "Samples=" in line]
    check(len(counts) == epochs, f"{what}: {len(counts)} epoch lines, want {epochs}")
    short = [(e, c) for e, c in enumerate(counts) if c != len(keys)]
    check(not short, f"{what}: {len(short)} of {epochs} epochs lost samples (epoch, count): {short[:10]}\n"
          f"{p.stderr[-2000:]}")
    check("error record(s)" not in p.stderr, f"{what}: no error record, nothing skipped:\n{p.stderr[-2000:]}")
    for e in range(epochs if epochs <= 2 else 0):
        got = sorted(k for ee, _, ks, _ in read_batches(out) if ee == e for k in ks)
        check(got == keys, f"{what}: epoch {e} holds each key of the shards once ({len(got)} keys)")
    print(f"{what}: {epochs} epochs of {len(keys)} samples in {took:.1f} s")


# Units larger than what the worker's queues hold: a unit's first samples reach the sink before its last
# ones leave the source.
big = dataset("big", 2, 300)
soak("big-units-keys", big, 2, processes=2, unit_samples=300)
soak("big-units", big, 30 if slow else 300, processes=2, unit_samples=300)
# Many small units and boundaries, on oversubscribed worker pools (threads pre-empted between steps).
small = dataset("small", 4, 100)
soak("small-units", small, 100 if slow else 600, processes=2, unit_samples=7, worker_threads=16)
soak("default-units", small, 200 if slow else 1500, processes=2, unit_samples=32, worker_threads=32)
check.done("groups_soak")
