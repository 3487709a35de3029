"""Bad input through whole pipelines: corrupt and truncated shards, bad members, dead URLs.
Each gets a message naming the shard URL and byte offset (or key), is counted, and follows the
error policy: skip goes on with every good sample, fail stops with the record. No crash, no hang."""
import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np  # noqa: E402
from sfutil import (Checks, make_dataset, nginx, ppm_bytes, read_batches, run, tar_whole_samples,  # noqa: E402
                    write_graph, write_shard)

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-bad-")
_, truth = make_dataset(tmp, shards=4, per_shard=10)
good = [os.path.join(tmp, f"shard-{i:06d}.tar") for i in range(4)]

# shard 0: a member in the middle whose header is garbage (corrupt tar)
corrupt = os.path.join(tmp, "corrupt.tar")
data = bytearray(open(good[0], "rb").read())
hdr = data.find(b"0000005.ppm")
data[hdr:hdr + 512] = b"\xde\xad\xbe\xef" * 128
open(corrupt, "wb").write(bytes(data))
# shard 1: truncated in the middle of a member
truncated = os.path.join(tmp, "truncated.tar")
raw = open(good[1], "rb").read()
open(truncated, "wb").write(raw[: len(raw) // 2 + 100])
# shard 2: one sample's .ppm is not an image, one has a duplicate field, one a bad label
members = []
with tarfile.open(good[2]) as tf:
    for m in tf.getmembers():
        members.append((m.name, tf.extractfile(m).read()))
members[2 * 3] = (members[2 * 3][0], b"this is not a ppm")
badcls = members[2 * 4 + 1][0]
members[2 * 4 + 1] = (badcls, b"seven")
bad_members = os.path.join(tmp, "members.tar")
with tarfile.open(bad_members, "w") as tf:
    for i, (name, blob) in enumerate(members):
        info = tarfile.TarInfo(name)
        info.size = len(blob)
        tf.addfile(info, io.BytesIO(blob))
        if name == "0000027.cls":
            info = tarfile.TarInfo("0000027.cls")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))


def graph(name, urls, policy):
    out = os.path.join(tmp, "out-" + name)
    shutil.rmtree(out, ignore_errors=True)
    path = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, shuffle=False)),
        ("tar_split", dict(connect_timeout="2s", stall_timeout="5s")),
        ("decode", {}),
        ("batch", dict(batch_size=4)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=0, epochs=1, error_policy=policy)
    return path, out


def delivered(out):
    if not os.path.isdir(out):
        return []
    return [k for _, _, keys, _ in read_batches(out) for k in keys]


def expect(name, urls, kept, needles, errors_at_least=1, errors_exactly=None):
    path, out = graph(name, urls, "skip")
    p = run(["run", path, "--quiet"], check=False)
    check(p.returncode == 0, f"{name}: skip policy finishes the epoch: {p.stderr}")
    keys = delivered(out)
    check(len(keys) == len(set(keys)), f"{name}: no duplicates")
    check(set(keys) == set(kept), f"{name}: exactly the good samples arrive: missing {sorted(set(kept) - set(keys))}"
          f" extra {sorted(set(keys) - set(kept))}")
    for n in needles:
        check(re.search(n, p.stderr), f"{name}: the message matches {n!r}: {p.stderr}")
    m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
    check(m and int(m.group(1)) >= errors_at_least, f"{name}: errors counted and reported: {p.stderr}")
    check(errors_exactly is None or (m and int(m.group(1)) == errors_exactly and "is missing" not in p.stderr),
          f"{name}: exactly {errors_exactly} error record(s), none a consequence (batch's missing field): {p.stderr}")
    path, out = graph(name + "-fail", urls, "fail")
    p = run(["run", path, "--quiet"], check=False)
    check(p.returncode == 1, f"{name}: fail policy stops with status 1, got {p.returncode}")
    check("stopped" in p.stderr and any(re.search(n, p.stderr) for n in needles), f"{name}: fail names the record: {p.stderr}")


keys_of = lambda lo, hi: [f"{i:07d}" for i in range(lo, hi)]  # noqa: E731
good3 = keys_of(30, 40)
# A damaged shard gives the samples Python's tarfile reads whole, the last one before the damage too when
# it has the fields of the samples before it; one that lost its .cls to a cut header is dropped by tar_split
# with the damage's one record (before, it went on and batch refused it: a second record).
whole = lambda path: [k for k, f in tar_whole_samples(path)[0] if f == ["ppm", "cls"]]  # noqa: E731
check(whole(corrupt) == keys_of(0, 5), f"tarfile reads 0000004 whole before the damaged header: {whole(corrupt)}")
expect("corrupt", f"{corrupt}::{good[3]}", whole(corrupt) + good3,
       [re.escape(corrupt) + r" @ byte \d+"])
expect("truncated", f"{truncated}::{good[3]}", whole(truncated) + good3, [re.escape(truncated) + r" @ byte \d+"],
       errors_exactly=1)
expect("members", f"{bad_members}::{good[3]}", [k for k in keys_of(20, 30) if k not in ("0000023", "0000024", "0000027")] + good3,
       [r"key 0000023", r"key 0000024", r"key 0000027"], errors_at_least=3)
expect("missing", f"{tmp}/nonexistent.tar::{good[3]}", good3, [re.escape(f"{tmp}/nonexistent.tar")])

# One image of another size among 300 (two shards of 150, read in order): the batch's shape comes from the
# stream, so that sample is the one skipped, counted once an epoch and named with its key and both shapes,
# wherever it falls (the first of a later batch, the stream's first or second sample, the first of an epoch
# that follows whole batches); decode runs in 2 replicas, and a resumption gives the same batches. Before, an
# odd sample that opened a batch set its shape and every later sample was skipped (101 of 300 delivered).
def odd_one(odd, batch_size, epochs, extra=(), name=None):
    name = name or f"odd-{odd}-{batch_size}-{epochs}"
    root = os.path.join(tmp, name)
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(odd)
    images = {f"{i:07d}": rng.integers(0, 256, (16, 16, 3) if i == odd else (32, 32, 3), dtype=np.uint8)
              for i in range(300)}
    keys = sorted(images)
    for s in range(2):
        write_shard(os.path.join(root, f"s{s}.tar"),
                    [(k, {"ppm": ppm_bytes(images[k]), "cls": b"1"}) for k in keys[150 * s:150 * (s + 1)]])
    out = os.path.join(root, "out")
    shutil.rmtree(out, ignore_errors=True)
    path = write_graph(os.path.join(root, "graph.yaml"), [
        ("shard_source", dict(urls=os.path.join(root, "s{0..1}.tar"), shuffle=False)),
        ("tar_split", {}),
        ("decode", dict(replicas=2)),
        ("batch", dict(batch_size=batch_size)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=0, epochs=epochs)
    p = run(["run", path, "--quiet"] + list(extra), check=False)
    return p, read_batches(out), images, keys[odd]


for odd, batch_size, epochs in ((100, 25, 1), (0, 16, 1), (1, 16, 1), (0, 23, 2)):
    tag = f"odd sample {odd}, batch_size {batch_size}"
    p, got, images, odd_key = odd_one(odd, batch_size, epochs)
    check(p.returncode == 0, f"{tag}: the run finishes: {p.stderr}")
    want = [k for k in sorted(images) if k != odd_key]
    for e in range(epochs):
        mine = [(keys, f) for ee, _, keys, f in got if ee == e]
        keys = [k for ks, _ in mine for k in ks]
        check(keys == want, f"{tag}, epoch {e}: the 299 others, in order ({len(keys)} delivered)")
        check(all(len(ks) == batch_size for ks, _ in mine[:-1]), f"{tag}, epoch {e}: whole batches")
        check(all(np.array_equal(f["ppm"][j], images[k]) for ks, f in mine for j, k in enumerate(ks)),
              f"{tag}, epoch {e}: the images are the ones written")
    m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
    check(m and int(m.group(1)) == epochs and int(m.group(2)) == epochs, f"{tag}: skipped once an epoch: {p.stderr}")
    check(re.search(f"key {odd_key}\\).*'ppm' is \\[16,16,3\\] uint8.*\\[32,32,3\\] uint8", p.stderr),
          f"{tag}: the message names the key and both shapes: {p.stderr}")
    if epochs == 2:  # resumed in epoch 1, which the odd sample opens: the batches of the whole run
        p, resumed, _, _ = odd_one(odd, batch_size, epochs, ["--start-epoch", "1", "--start-step", "3"],
                                   name="odd-resumed")
        check(p.returncode == 0 and [(e, b, k) for e, b, k, _ in resumed] ==
              [(e, b, k) for e, b, k, _ in got if (e, b) >= (1, 3)], f"{tag}: a resumption: the same batches")

# .tar.gz damage that only gzip's CRC-32 and length show (`gzip -t` is the reference): changed
# deflate data that still inflates (the audit's wrong pixels), a changed CRC or length, a cut trailer.
plain = open(good[2], "rb").read()
gz = gzip.compress(plain, mtime=0)
HEADER = 10  # gzip.compress writes no file name


def silent_corruption(data):
    """The first 4-byte change from the middle on that inflates to the same length, changing only .ppm data."""
    with tarfile.open(good[2]) as tf:
        ppm = [(m.offset_data, m.offset_data + m.size) for m in tf.getmembers() if m.name.endswith(".ppm")]
    for at in range(len(data) // 2, len(data) - 8):
        bad = bytearray(data)
        bad[at:at + 4] = bytes(b ^ 0x5a for b in bad[at:at + 4])
        try:
            out = zlib.decompressobj(-15).decompress(bytes(bad[HEADER:-8]))
        except zlib.error:
            continue
        diff = [i for i in range(len(plain)) if len(out) == len(plain) and out[i] != plain[i]]
        if diff and all(any(lo <= i < hi for lo, hi in ppm) for i in diff):
            return bytes(bad)
    raise AssertionError("no silent corruption found")


# Likewise zstd's content checksum (written by the zstd CLI) and a cut frame, with `zstd -t`, on a
# shard larger than one read, so that the tar's end comes before the frame's.
big_dir = os.path.join(tmp, "big")
os.makedirs(big_dir)
_, big_truth = make_dataset(big_dir, shards=1, per_shard=50, size=32)
zst = subprocess.run(["zstd", "-q", "-c", os.path.join(big_dir, "shard-000000.tar")], capture_output=True,
                     check=True).stdout
variants = {
    "gz-pixels": silent_corruption(gz),
    "gz-crc": gz[:-8] + bytes(b ^ 1 for b in gz[-8:-4]) + gz[-4:],
    "gz-length": gz[:-4] + bytes(b ^ 1 for b in gz[-4:]),
    "gz-cut": gz[:-6],
    "zst-checksum": zst[:-1] + bytes([zst[-1] ^ 1]),
    "zst-cut": zst[:-4],
}
for name, data in variants.items():
    kind = "gzip" if name.startswith("gz") else "zstd"
    path = os.path.join(tmp, name + (".tar.gz" if kind == "gzip" else ".tar.zst"))
    with open(path, "wb") as f:
        f.write(data)
    check(subprocess.run([kind, "-t", path], capture_output=True).returncode != 0, f"{name}: {kind} -t rejects it")
    p = run(["ls", path], check=False)
    check(p.returncode == 1 and path in p.stderr and kind in p.stderr, f"{name}: ls reports it: {p.returncode} {p.stderr}")
    # The tar inside is whole, so its samples arrive; the record follows, and the next shard is read.
    inside = keys_of(20, 30) if kind == "gzip" else list(big_truth)
    expect(name, f"{path}::{good[3]}", inside + good3, [re.escape(path) + ".*" + kind])

with nginx(tmp) as base:
    expect("http404", f"{base}/nope.tar::{base}/{os.path.basename(good[3])}", good3,
           [re.escape(f"{base}/nope.tar") + r".*404"])
expect("unreachable", f"http://127.0.0.1:9/x.tar::{good[3]}", good3, [r"http://127\.0\.0\.1:9/x\.tar"])
check.done("bad_input")
