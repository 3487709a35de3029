"""Whole pipelines: every key once per epoch, determinism by seed, rank splits, equal epochs, replicas."""
import collections
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-epochs-")
urls, truth = make_dataset(tmp, shards=13, per_shard=25)
all_keys = set(truth)


def pipeline(name, seed=1, epochs=2, batch_size=7, partial=True, shuffle_buffer=50, replicas=1, extra=(), **source):
    out = os.path.join(tmp, name)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, shuffle=True, **source)),
        ("tar_split", {}),
        ("decode", dict(replicas=replicas)),
        ("augment", dict(crop="random", size=8, padding=2, flip=0.5, dtype="uint8", layout="hwc", replicas=replicas)),
        ("shuffle", dict(buffer_size=shuffle_buffer)),
        ("batch", dict(batch_size=batch_size, partial=partial)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=seed, epochs=epochs)
    p = run(["run", graph, "--quiet", "--no-summary"] + list(extra))
    return read_batches(out), p


def keys_by_epoch(batches):
    per = collections.defaultdict(list)
    for e, _, keys, fields in batches:
        per[e].extend(keys)
        check(fields["cls"].shape == (len(keys),), "labels are [B]")
        check(fields["ppm"].shape == (len(keys), 8, 8, 3), f"images are [B,8,8,3], got {fields['ppm'].shape}")
        for k, label in zip(keys, fields["cls"]):
            check(truth[k][1] == label, f"label of {k} travels with its image")
    return per


# Every key exactly once per epoch, with shuffling on; epochs differ in order.
batches, _ = pipeline("base")
per = keys_by_epoch(batches)
check(sorted(per) == [0, 1], "two epochs")
for e, keys in per.items():
    check(len(keys) == len(all_keys) and set(keys) == all_keys, f"epoch {e}: every key exactly once")
check(per[0] != per[1], "a different order every epoch")
check(per[0][:25] != sorted(per[0][:25]), "samples are shuffled, not in shard order")

# Augmented pixels are a crop of the zero-padded original, maybe flipped.
for _, _, keys, fields in batches[:3]:
    for k, img in zip(keys, fields["ppm"]):
        padded = np.pad(truth[k][0], ((2, 2), (2, 2), (0, 0)))
        crops = [padded[y:y + 8, x:x + 8] for y in range(5) for x in range(5)]
        check(any((img == c).all() or (img == c[:, ::-1]).all() for c in crops), f"{k} is a padded crop")

# Same seed: identical batches, byte for byte; another seed: different ones.
again, _ = pipeline("again")
check(len(again) == len(batches), "same number of batches")
for (e, b, k1, f1), (_, _, k2, f2) in zip(batches, again):
    check(k1 == k2 and all(np.array_equal(f1[n], f2[n]) for n in f1), f"epoch {e} batch {b} repeats exactly")
other, _ = pipeline("other", seed=2)
check(keys_by_epoch(other)[0] != per[0], "another seed gives another order")

# Replicated map stages give exactly the same batches.
replicated, _ = pipeline("replicated", replicas=3)
for (e, b, k1, f1), (_, _, k2, f2) in zip(batches, replicated):
    check(k1 == k2 and all(np.array_equal(f1[n], f2[n]) for n in f1), f"replicas: epoch {e} batch {b} identical")
check(len(replicated) == len(batches), "replicas: same batch count")

# Batch sizes: 325 samples / 7 = 46 full + 1 partial of 3; partial: false drops it (and says so).
sizes = [len(k) for e, _, k, _ in batches if e == 0]
check(sizes == [7] * 46 + [3], f"partial batch at the end of the epoch: {sizes[-3:]}")
dropped, p = pipeline("nopartial", partial=False, epochs=1)
check([len(k) for _, _, k, _ in dropped] == [7] * 46, "partial: false drops the short batch")

# Ranks: disjoint, covering shares; with samples_per_epoch every rank yields exactly that many.
world = 3
shares = []
for rank in range(world):
    b, _ = pipeline(f"rank{rank}", epochs=1, extra=["--rank", str(rank), "--world-size", str(world)])
    keys = keys_by_epoch(b)[0]
    check(len(keys) == len(set(keys)), f"rank {rank}: no duplicates")
    shares.append(set(keys))
check(set().union(*shares) == all_keys, "the ranks' shares cover every key")
check(all(not (shares[i] & shares[j]) for i in range(world) for j in range(i + 1, world)), "shares are disjoint")
check(sorted(len(s) for s in shares) == [100, 100, 125], "13 shards over 3 ranks: 5, 4, 4 shards")
for spe in (90, 160):
    counts = []
    for rank in range(world):
        b, _ = pipeline(f"spe{spe}-{rank}", epochs=2, samples_per_epoch=spe,
                        extra=["--rank", str(rank), "--world-size", str(world)])
        per_rank = keys_by_epoch(b)
        counts.append([len(per_rank[e]) for e in (0, 1)])
        if spe <= 100:
            check(all(len(set(per_rank[e])) == spe for e in (0, 1)), "no repeats while the share lasts")
    check(all(c == [spe, spe] for c in counts), f"samples_per_epoch={spe}: every rank, every epoch: {counts}")

# The environment (torchrun's RANK / WORLD_SIZE) chooses the rank as well.
out = os.path.join(tmp, "envrank")
graph = os.path.join(tmp, "base.yaml")
p = run(["run", graph, "--quiet", "--no-summary", "--epochs", "1", "--set", f"device_sink.npy_dir={out}"],
        env=dict(os.environ, RANK="1", WORLD_SIZE="3"))
env_keys = set(keys_by_epoch(read_batches(out))[0])
check(env_keys == shares[1], "RANK=1 WORLD_SIZE=3 gives rank 1's share")

check.done("pipeline_epochs")
