#!/usr/bin/python3
"""Lent rows: augment writes its output straight into the rows batch lends it, and the batches are the same
as when batch stacks every row itself. The reference is the same graph with a `rename` between augment and
batch (batch then lends to rename, which borrows nothing, so every row is copied). Checked over three
epochs with two corrupt JPEGs in each (dropped samples: the rows realign) and a short last batch per epoch,
with one and two replicas; batch's `rows_in_place` counter says how many rows needed no copy: all of them
when no sample is dropped and the epochs are whole batches."""
import io
import os
import sys
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, stage_table, write_graph, write_shard  # noqa: E402

TMP = tempfile.mkdtemp(prefix="sf_lent_rows_")
check = Checks()


def picture(rng, h, w):
    """Blocks of colour, smoothed: a JPEG whose crops differ from sample to sample."""
    blocks = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.float64)
    img = np.kron(blocks, np.ones((16, 16, 1)))[:h, :w]
    return np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)


def jpeg(img):
    b = io.BytesIO()
    Image.fromarray(img).save(b, "JPEG", quality=90)
    return b.getvalue()


rng = np.random.default_rng(23)
samples = [(f"{i:04d}", {"jpg": jpeg(picture(rng, int(rng.integers(120, 300)), int(rng.integers(120, 300)))),
                         "cls": b"%d" % (i % 10)}) for i in range(64)]
for s in range(2):
    write_shard(os.path.join(TMP, f"s{s}.tar"), samples[s::2])
    # the same with two JPEGs cut short (dropped samples leave holes) and 62 samples: a short last batch
    holed = [(k, {"jpg": f["jpg"][:200] + b"\xff\xd9", "cls": f["cls"]} if k in ("0013", "0040") else f)
             for k, f in samples[s:62:2]]
    write_shard(os.path.join(TMP, f"h{s}.tar"), holed)


def batches(name, urls, replicas, between):
    out = os.path.join(TMP, name)
    rep = {"replicas": replicas}
    stages = [("shard_source", dict(urls=os.path.join(TMP, urls))), ("tar_split", {}), ("decode", rep),
              ("augment", dict(crop="random_resized", size=48, flip=0.5, mean=[0.5, 0.4, 0.3], std=[0.2, 0.2, 0.2],
                               layout="chw", dtype="float32", **rep))]
    if between:
        stages.append(("rename", dict(names="jpg,cls")))
    stages += [("batch", dict(batch_size=8, partial=True)), ("device_sink", dict(npy_dir=out))]
    path = write_graph(os.path.join(TMP, name + ".yaml"), stages, seed=5, epochs=3, error_policy="skip")
    plan = run(["run", path, "--explain"]).stdout
    says = "-> batch: written into the rows batch lends" in plan
    check(says != between, f"{name}: --explain {'says' if says else 'does not say'} that augment writes into lent rows")
    p = run(["run", path])
    rows = stage_table(p.stderr)
    in_place = rows.get("batch", {}).get("counters", {}).get("rows_in_place", 0)
    return read_batches(out), in_place


def same(a, b):
    return len(a) == len(b) and all(x[2] == y[2] and x[3].keys() == y[3].keys() and
                                    all(np.array_equal(x[3][k], y[3][k]) for k in x[3]) for x, y in zip(a, b))


for replicas in (1, 2):
    # 64 samples an epoch, 8 batches of 8: the rows are written in place (all of them unless a replica ran
    # more than 8 batches ahead of the other). Without lending a batch is a view only of rows that happen to
    # lie one after another in memory.
    copied, none = batches(f"copied{replicas}", "s{0..1}.tar", replicas, True)
    lent, in_place = batches(f"lent{replicas}", "s{0..1}.tar", replicas, False)
    n = sum(len(b[2]) for b in lent)
    check(n == 3 * 64, f"replicas {replicas}: 64 samples an epoch for 3 epochs ({n})")
    check(same(copied, lent), f"replicas {replicas}: the same batches with lent rows")
    check(n * 3 // 4 <= in_place <= n and none < n // 4, f"replicas {replicas}: {in_place} of {n} rows written in place "
          f"({none} without lending)")
    # Holes and short batches: the rows realign, and those a producer had already written ahead are copied.
    copied, _ = batches(f"holed_copied{replicas}", "h{0..1}.tar", replicas, True)
    lent, in_place = batches(f"holed_lent{replicas}", "h{0..1}.tar", replicas, False)
    n = sum(len(b[2]) for b in lent)
    check(n == 3 * 60, f"replicas {replicas}: 60 samples an epoch for 3 epochs ({n})")
    check(same(copied, lent), f"replicas {replicas}, holes: the same batches with lent rows")
    print(f"replicas {replicas}, holes and short batches: {in_place} of {n} rows written in place")
check.done("lent_rows")
