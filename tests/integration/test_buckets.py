"""batch's buckets, pad and ragged options through the CLI's .npy dumps (runs under ASan too).

A reference model in plain Python (the documented rule: a sample joins the bucket its key falls in, a full
bucket is emitted, the hold bound emits the fullest bucket, partial ones at the epoch's end) is run on the
sample order of an unbucketed run of the same graph, and must give exactly the bucketed run's batches: so a
batch never mixes buckets and never more than bucket_hold samples wait. Ragged `txt` and padded `ids` are
compared with the bytes tarfile reads; a second run and resumption at (epoch, step) give the same batches.
"""
import bisect
import os
import shutil
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, ppm_bytes, read_batches, run, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-buckets-")
IDS = os.environ["SF_IDS_PLUGIN"]
rng = np.random.default_rng(5)
truth = {}  # key -> {field: bytes}, by tarfile


def dataset(name, shapes):
    """Three shards of 40 samples: a ppm of one of shapes, a txt of 0..40 letters. Returns the URL pattern."""
    for s in range(3):
        samples = []
        for i in range(40):
            h, w = shapes[int(rng.integers(0, len(shapes)))]
            text = bytes(rng.integers(97, 123, int(rng.integers(0, 41)), dtype=np.uint8))
            samples.append((f"{name}{s}_{i:03d}", {"ppm": ppm_bytes(rng.integers(0, 256, (h, w, 3))), "txt": text}))
        write_shard(os.path.join(tmp, f"{name}-{s}.tar"), samples)
        with tarfile.open(os.path.join(tmp, f"{name}-{s}.tar")) as tf:
            for m in tf:
                key, field = m.name.split(".", 1)
                truth.setdefault(key, {})[field] = tf.extractfile(m).read()
    return os.path.join(tmp, name + "-{0..2}.tar")


urls = dataset("same", [(8, 8)])
mixed_urls = dataset("mixed", [(8, 8), (8, 16), (16, 8)])  # aspect 1, 2, 0.5


def image_shape(key):
    data = truth[key]["ppm"].split(b"\n")
    w, h = map(int, data[1].split())
    return h, w


def batches(name, extra=(), urls=urls, **batch_opts):
    out = os.path.join(tmp, name)
    shutil.rmtree(out, ignore_errors=True)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, shuffle=True)),
        ("tar_split", {}),
        ("decode", dict(replicas=2)),
        ("ids", {}),
        ("shuffle", dict(buffer_size=20)),
        ("batch", batch_opts),
        ("device_sink", dict(npy_dir=out)),
    ], plugins=[IDS], seed=3, epochs=2)
    run(["run", graph, "--quiet", "--no-summary"] + list(extra))
    return read_batches(out)


def model(order, key_of, bounds, size, hold, partial=True):
    """The documented bucketing rule on one epoch's sample order: a list of key lists."""
    fills, out = [[] for _ in range(len(bounds) + 1)], []
    for k in order:
        b = bisect.bisect_right(bounds, key_of(k))
        fills[b].append(k)
        if len(fills[b]) == size:
            out.append(fills[b])
            fills[b] = []
        elif sum(map(len, fills)) >= hold:
            i = max(range(len(fills)), key=lambda j: (len(fills[j]), -j))
            out.append(fills[i])
            fills[i] = []
    return out + [f for f in fills if f and partial]


# The graph's sample order per epoch, from an unbucketed run (ragged txt, padded ids, images of several sizes).
plain = batches("plain", batch_size=1, ragged="txt", pad="ids=-7")


def sample_order(plain, prefix):
    order = {e: [keys[0] for ee, _, keys, _ in plain if ee == e] for e in (0, 1)}
    check(all(sorted(order[e]) == sorted(k for k in truth if k.startswith(prefix)) for e in (0, 1)),
          "every sample once per epoch")
    return order


order = sample_order(plain, "same")


def check_fields(tag, keys, f):
    """ragged txt against tarfile; padded ids (byte + 1000, -7 after the end) against numpy."""
    offs, lens = f["txt.offsets"], f["ids.length"]
    check(offs.dtype == np.int64 and offs.shape == (len(keys) + 1,) and lens.dtype == np.int32, f"{tag}: companions")
    longest = max(len(truth[k]["txt"]) for k in keys)
    check(f["ids"].dtype == np.int32 and f["ids"].shape == (len(keys), longest), f"{tag}: ids padded to the longest")
    for j, k in enumerate(keys):
        text = truth[k]["txt"]
        check(f["txt"][offs[j]:offs[j + 1]].tobytes() == text, f"{tag} {k}: ragged txt is the member's bytes")
        want = np.full(longest, -7, np.int32)
        want[:len(text)] = np.frombuffer(text, np.uint8).astype(np.int32) + 1000
        check(lens[j] == len(text) and np.array_equal(f["ids"][j], want), f"{tag} {k}: padded ids and length")


def compare(tag, got, bounds, size, hold, key_of, partial=True, order=order):
    for e in (0, 1):
        want = model(order[e], key_of, bounds, size, hold, partial)
        have = [keys for ee, _, keys, _ in got if ee == e]
        check(have == want, f"{tag} epoch {e}: the batches are the model's\n{have}\n{want}")
        for keys in have:
            check(len({bisect.bisect_right(bounds, key_of(k)) for k in keys}) == 1, f"{tag}: one bucket a batch")


def txt_length(k):
    return len(truth[k]["txt"])


# Length buckets with a small hold bound (short batches forced), pad and ragged.
opts = dict(batch_size=4, ragged="txt", pad="ids=-7", bucket_field="txt", bucket_bounds=[10, 20, 30], bucket_hold=6)
first = batches("length", **opts)
compare("length", first, [10, 20, 30], 4, 6, txt_length)
check(any(len(k) < 4 for _, _, k, _ in first[:-4]), "the hold bound forced short batches mid-epoch")
for e, b, keys, f in first:
    check_fields(f"length e{e}b{b}", keys, f)
again = batches("length-again", **opts)
check([(e, b, k) for e, b, k, _ in again] == [(e, b, k) for e, b, k, _ in first], "a second run: the same batches")
# The default hold never forces a short batch; partial=false drops each bucket's rest at the epoch's end.
full = batches("default-hold", batch_size=4, ragged="txt", pad="ids=0", bucket_field="txt", bucket_bounds=[10, 20, 30],
               partial=False)
compare("default-hold", full, [10, 20, 30], 4, 4 * 3 + 1, txt_length, partial=False)
check(all(len(k) == 4 for _, _, k, _ in full), "default hold, partial=false: only full batches")

# Resumption at (epoch, step): the batches that follow are the uninterrupted run's.
whole = {(e, b): (k, f) for e, b, k, f in first}
for epoch, step in ((0, 5), (1, 2)):
    resumed = batches(f"resume-{epoch}-{step}", ["--start-epoch", str(epoch), "--start-step", str(step)], **opts)
    want = {eb: v for eb, v in whole.items() if eb >= (epoch, step)}
    check(sorted((e, b) for e, b, _, _ in resumed) == sorted(want), f"resume ({epoch},{step}): the same batch indices")
    for e, b, k, f in resumed:
        k0, f0 = want[(e, b)]
        check(k == k0 and all(np.array_equal(f[n], f0[n]) for n in f0), f"resume ({epoch},{step}) e{e}b{b}: identical")

# Aspect buckets: every batch's images share one shape (without buckets the sizes would mix: an error).
aspect_order = sample_order(batches("plain-mixed", urls=mixed_urls, batch_size=1, ragged="txt,ids"), "mixed")
aspect = batches("aspect", urls=mixed_urls, batch_size=3, bucket_field="ppm", bucket_key="aspect",
                 bucket_bounds=[0.75, 1.5], ragged="txt,ids")
compare("aspect", aspect, [0.75, 1.5], 3, 3 * 2 + 1, lambda k: image_shape(k)[1] / image_shape(k)[0],
        order=aspect_order)
for e, b, keys, f in aspect:
    check(f["ppm"].shape[1:3] == image_shape(keys[0]), f"aspect e{e}b{b}: the bucket's image size")
    for j, k in enumerate(keys):
        check(f["ppm"][j].tobytes() == truth[k]["ppm"][-f["ppm"][j].size:], f"aspect {k}: image bytes")
        ids = f["ids"][f["ids.offsets"][j]:f["ids.offsets"][j + 1]]
        check(np.array_equal(ids, np.frombuffer(truth[k]["txt"], np.uint8).astype(np.int32) + 1000),
              f"aspect {k}: ragged int32 ids")

# Images of different sizes without buckets stay an error, with today's message.
bad = write_graph(os.path.join(tmp, "mixed.yaml"), [
    ("shard_source", dict(urls=mixed_urls)), ("tar_split", {}), ("decode", {}), ("batch", dict(batch_size=8)),
    ("device_sink", {})], error_policy="fail")
p = run(["run", bad, "--quiet", "--no-summary"], check=False)
check(p.returncode != 0 and "resize or crop to one size (augment) before batching" in p.stderr
      and "pad or ragged" not in p.stderr, f"mixed image sizes: today's message\n{p.stderr}")
p = run(["run", write_graph(os.path.join(tmp, "badpad.yaml"), [
    ("shard_source", dict(urls=urls)), ("tar_split", {}), ("batch", dict(pad="ids")), ("device_sink", {})]),
    "--quiet"], check=False)
check(p.returncode != 0 and "pad: 'ids' is not NAME=VALUE" in p.stderr, f"a bad pad option is named\n{p.stderr}")
check.done("buckets")
