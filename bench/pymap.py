#!/usr/bin/python3
"""The cost of a Python map function per sample: one graph (shards on local disk, tar_split, decode, batch)
run with and without an identity `type: python` node, alternately, from the same process; prints the
median epoch time of each, their ratio and the overhead in microseconds per sample.

    bench/pymap.py [--runs N] [--shards N] [--per-shard N] [--size PX]

SF_BUILD names the build directory (default build-test; a release build gives lower numbers).
Needs NumPy (Debian's python3-numpy).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = os.path.join(top, os.environ.get("SF_BUILD", "build-test"))
sys.path.insert(0, os.path.join(top, "python"))
sys.path.insert(0, os.path.join(top, "tests", "integration"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(build, "libshardflow.so"))
from sfutil import make_dataset, write_graph  # noqa: E402

import shardflow  # noqa: E402


def epoch_seconds(graph, **kw):
    """Wall-clock and CPU seconds (all threads of this process) of one epoch, and its samples."""
    t, c = time.perf_counter(), time.process_time()
    with shardflow.Pipeline(graph, output="numpy", **kw) as p:
        n = sum(len(labels) for _, labels in p)
    return time.perf_counter() - t, time.process_time() - c, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=2500)
    ap.add_argument("--size", type=int, default=32)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sf-bench-pymap-")
    urls, _ = make_dataset(tmp, a.shards, a.per_shard, size=a.size)
    graphs = {}
    for name, extra in (("plain", []), ("python", [("python", {})])):
        stages = [("shard_source", dict(urls=urls)), ("tar_split", {}), ("decode", {})] + extra + [
            ("batch", dict(batch_size=256, partial=True)), ("device_sink", {})]
        graphs[name] = write_graph(os.path.join(tmp, name + ".yaml"), stages, seed=0, epochs=1)
    runs = {"plain": [], "python": []}
    for _ in range(a.runs):  # alternate, so drift in the machine's load hits both
        runs["plain"].append(epoch_seconds(graphs["plain"]))
        runs["python"].append(epoch_seconds(graphs["python"], map={"python": lambda s: s}))
    shutil.rmtree(tmp)
    n = a.shards * a.per_shard
    assert all(r[2] == n for rs in runs.values() for r in rs), runs
    print(f"{n} samples ({a.size}x{a.size} PPM + cls), medians of {a.runs} runs:")
    for k, what in ((0, "wall-clock"), (1, "CPU (all threads)")):
        plain = statistics.median(r[k] for r in runs["plain"])
        python = statistics.median(r[k] for r in runs["python"])
        print(f"  {what}: without {plain * 1e3:.0f} ms, with an identity Python map {python * 1e3:.0f} ms; "
              f"ratio {python / plain:.2f}; overhead {(python - plain) / n * 1e6:.1f} us/sample")


if __name__ == "__main__":
    main()
