"""Shards larger than the HTTP reader's ring (4 x 512 KiB) arrive whole over nginx: the fetcher
wraps around its blocks and pauses when the consumer falls behind, and nothing is lost or repeated."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, nginx, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-http-stream-")
# 3 shards of 1,500 samples of 24x24 RGB (~1,728 + header bytes each): about 5.5 MB a shard
urls, truth = make_dataset(tmp, shards=3, per_shard=1500, size=24)
local = [os.path.join(tmp, f"shard-{i:06d}.tar") for i in range(3)]
check(all(os.path.getsize(p) > 4 * 512 * 1024 for p in local), "shards are larger than the reader's ring")


def listing(args):
    p = run(["ls", "--json"] + args)
    return [{k: v for k, v in json.loads(line).items() if k != "__url__"} for line in p.stdout.splitlines()]


with nginx(tmp) as base:
    remote = [f"{base}/shard-{i:06d}.tar" for i in range(3)]
    check(listing(remote) == listing(local), "ls over http equals ls of the files (keys, fields, sizes, offsets)")
    # Through a pipeline whose consumer is slower than loopback, so the fetcher has to pause.
    out = os.path.join(tmp, "out")
    graph = write_graph(os.path.join(tmp, "g.yaml"), [
        ("shard_source", dict(urls="::".join(remote), shuffle=False)),
        ("tar_split", {}),
        ("decode", {}),
        ("augment", dict(crop="random", size=24, padding=4, flip=0.5, mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2])),
        ("batch", dict(batch_size=50)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=3, epochs=1, error_policy="fail")
    p = run(["run", graph, "--quiet", "--no-summary"])
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    check(keys == sorted(truth), f"every sample once, in shard order ({len(keys)} of {len(truth)})")
    labels = [int(v) for _, _, _, f in read_batches(out) for v in f["cls"]]
    check(labels == [truth[k][1] for k in keys], "labels travel with their samples")
check.done("http_stream")
