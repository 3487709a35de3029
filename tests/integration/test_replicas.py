"""Replicated map stages with skipped samples: the hole a dropped sample leaves travels through every
replicated stage, so batches are identical whatever the replica count (docs/graph-files.md, "Order and determinism") and no
sample moves to another batch or epoch. Reference: Python's tarfile order minus the samples made bad."""
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, ppm_bytes, read_batches, run, tar_keys, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-replicas-")
rng = np.random.default_rng(3)

# Two shards of 10 and 13 samples. Bad samples are dropped at decode (a label that is not a number,
# bytes that are not an image) or at augment (no image field), in both lanes of two replicas.
bad_cls = {"0000003", "0000004", "0000015"}
bad_img = {"0000008", "0000021"}
no_img = {"0000006", "0000011", "0000012"}
shards, truth = [], {}
for s, count in enumerate((10, 13)):
    samples = []
    for i in range(count):
        key = f"{len(truth):07d}"
        img = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        truth[key] = img
        fields = {}
        if key not in no_img:
            fields["ppm"] = b"P6 not an image" if key in bad_img else ppm_bytes(img)
        fields["cls"] = b"x" if key in bad_cls else str(i % 10).encode()
        samples.append((key, fields))
    shards.append(write_shard(os.path.join(tmp, f"s{s:06d}.tar"), samples))
bad = bad_cls | bad_img | no_img
expected = [k for k in tar_keys(*shards) if k not in bad]
EPOCHS = 3


def pipeline(name, replicas, shuffle_buffer=0, batch_size=4):
    out = os.path.join(tmp, "out-" + name)
    shutil.rmtree(out, ignore_errors=True)
    stages = [
        ("shard_source", dict(urls=os.path.join(tmp, "s{000000..000001}.tar"), shuffle=False)),
        ("tar_split", {}),
        ("decode", dict(replicas=replicas)),
        ("augment", dict(fields="ppm", crop="random", size=8, padding=2, flip=0.5, dtype="uint8", replicas=replicas)),
    ]
    if shuffle_buffer:
        stages.append(("shuffle", dict(buffer_size=shuffle_buffer)))
    stages += [("batch", dict(batch_size=batch_size, partial=True)), ("device_sink", dict(npy_dir=out))]
    graph = write_graph(os.path.join(tmp, name + ".yaml"), stages, seed=5, epochs=EPOCHS)
    p = run(["run", graph, "--quiet", "--no-summary"], timeout=60)
    return read_batches(out), p


def keys_by_epoch(batches):
    per = {}
    for e, _, keys, _ in batches:
        per.setdefault(e, []).extend(keys)
    return per


for shuffle_buffer in (0, 7):
    base, p1 = pipeline(f"r1-{shuffle_buffer}", 1, shuffle_buffer)
    per = keys_by_epoch(base)
    check(sorted(per) == list(range(EPOCHS)), f"1 replica: {EPOCHS} epochs, got {sorted(per)}")
    for e, keys in per.items():
        if shuffle_buffer:
            check(sorted(keys) == sorted(expected), f"1 replica, shuffled: epoch {e} has every good sample once")
        else:
            check(keys == expected, f"1 replica: epoch {e} is the shards' order minus the bad samples: {keys}")
    for replicas in (2, 3):
        got, p = pipeline(f"r{replicas}-{shuffle_buffer}", replicas, shuffle_buffer)
        lines = [line for line in p.stdout.splitlines() if "Replica Train Samples=" in line]
        check(len(lines) == EPOCHS and all(f"Samples={len(expected)} " in line for line in lines),
              f"{replicas} replicas: every epoch's line with {len(expected)} samples:\n{p.stdout}")
        check(f"{EPOCHS * len(bad)} sample(s) skipped" in p.stderr, f"{replicas} replicas: skips counted: {p.stderr}")
        check(len(got) == len(base), f"{replicas} replicas: {len(got)} batches, 1 replica gave {len(base)}")
        for (e, b, k1, f1), (e2, b2, k2, f2) in zip(base, got):
            check((e, b) == (e2, b2) and k1 == k2,
                  f"{replicas} replicas, shuffle {shuffle_buffer}: epoch {e} batch {b} keys {k2}, 1 replica {k1}")
            check(all(np.array_equal(f1[n], f2[n]) for n in f1),
                  f"{replicas} replicas: epoch {e} batch {b} identical tensors")

check.done("replicas")
