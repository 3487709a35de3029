"""The per-stage table `shardflow run` prints: every stage counts what it hands on (shuffle too), and
augment's deferred work, which runs when batch collates, is charged to augment, not to batch, so
the table points at the real bottleneck. Sample counts come from Python's tarfile."""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, ppm_bytes, run, stage_table, tar_keys, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-table-")
rng = np.random.default_rng(2)
img = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)
shard = write_shard(os.path.join(tmp, "s.tar"), [(f"{i:05d}", {"ppm": ppm_bytes(img), "cls": b"1"}) for i in range(600)])
n = len(tar_keys(shard))

graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=shard)),
    ("tar_split", {}),
    ("decode", {}),
    # an expensive transform: resampled to 256x256, normalised, float32 CHW, written when batch collates
    ("augment", dict(crop="random_resized", size=256, flip=0.5, mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2],
                     dtype="float32", layout="chw")),
    ("shuffle", dict(buffer_size=50)),
    ("batch", dict(batch_size=16, partial=True)),
    ("device_sink", {}),
], epochs=1, threads=2)
p = run(["run", graph, "--quiet"])
rows = stage_table(p.stderr)
check(len(rows) == 7, f"a row per stage: {p.stderr}")
for stage in ("tar_split", "decode", "augment", "shuffle"):
    check(rows[stage]["items"] == n, f"{stage} hands on {n} samples, the table says {rows[stage]['items']}")
check(rows["batch"]["items"] == (n + 15) // 16, f"batch: {(n + 15) // 16} batches, got {rows['batch']['items']}")
a, b = rows["augment"]["busy"], rows["batch"]["busy"]
print(f"augment busy {a:.2f} s, batch busy {b:.2f} s")
check(a > 2 * b, f"augment's deferred resampling is charged to augment ({a:.2f} s), not to batch ({b:.2f} s)")

check.done("stage_table")
