"""tar_split maps local uncompressed shards (option `mmap`, on by default) and hands members out as views of the
page cache instead of copies.

The batches must be what Python's tarfile wrote (decode to uint8, no augment) and equal, byte for byte, those of
read() (`mmap: false`), also through augment and a shuffle (augment's deferred output then keeps its view in the
shuffle buffer); a .tar.gz is decompressed, not mapped. A shard cut short on disk while it is mapped (os.truncate
during a slow run) ends the run with SIGBUS and a message naming the shard and what to do; with `mmap: false` the
same cut is a truncated member that error_policy skip counts, and the run ends normally.
"""
import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, group_graph, make_dataset, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-mmap-")
urls, truth = make_dataset(tmp, shards=4, per_shard=50, size=16, seed=5)


def plain_graph(name, shard_urls):
    """shard_source (in order), tar_split, decode, batch of 16, device sink: the members' own pixels."""
    out = os.path.join(tmp, name)
    stages = [("shard_source", dict(urls=shard_urls)), ("tar_split", {}), ("decode", {}),
              ("batch", dict(batch_size=16, partial=True)), ("device_sink", dict(npy_dir=out))]
    return write_graph(os.path.join(tmp, name + ".yaml"), stages), out


def as_truth(batches, what):
    """Every row equals the image and label tarfile wrote for its key; every key once."""
    seen = []
    for _, _, keys, fields in batches:
        for j, key in enumerate(keys):
            img, label = truth[key]
            check(np.array_equal(fields["ppm"][j], img), f"{what}: {key}'s pixels are not the shard's")
            check(int(fields["cls"][j]) == label, f"{what}: {key}'s label is not the shard's")
            seen.append(key)
    check(sorted(seen) == sorted(truth), f"{what}: {len(seen)} samples, {len(truth)} keys in the shards")


def same(a, b, what):
    check(len(a) == len(b), f"{what}: {len(a)} batches against {len(b)}")
    for (ea, ba, ka, fa), (eb, bb, kb, fb) in zip(a, b):
        check((ea, ba, ka) == (eb, bb, kb), f"{what}: batch {ba} has other keys or order")
        for name in fb:
            check(fa[name].tobytes() == fb[name].tobytes(), f"{what}: batch {ba} field {name} differs")


# Decoded members, mapped and read: what tarfile wrote.
for mapped in (True, False):
    path, out = plain_graph(f"plain-{mapped}", urls)
    run(["run", path, "--quiet", "--no-summary", "--set", f"tar_split.mmap={'true' if mapped else 'false'}"])
    as_truth(read_batches(out), f"mmap {mapped}")

# Through augment (random crop, flip, float32 CHW), with and without a shuffle after it: the same batches.
for shuffle in (0, 64):
    got = []
    for mapped in ("true", "false"):
        path, out = group_graph(tmp, f"aug-{shuffle}-{mapped}", urls, shuffle_buffer=shuffle, seed=3)
        run(["run", path, "--quiet", "--no-summary", "--set", f"tar_split.mmap={mapped}"])
        got.append(read_batches(out))
    check(sum(len(k) for _, _, k, _ in got[0]) == len(truth), f"shuffle {shuffle}: every sample once")
    same(got[0], got[1], f"augment, shuffle {shuffle}: mapped against read()")

# A gzip-compressed shard is decompressed (never mapped): the same samples.
gz = os.path.join(tmp, "gz")
os.makedirs(gz)
for s in range(4):
    with open(os.path.join(tmp, f"shard-{s:06d}.tar"), "rb") as src, gzip.open(
            os.path.join(gz, f"shard-{s:06d}.tar.gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
path, out = plain_graph("gzip", os.path.join(gz, "shard-{000000..000003}.tar.gz"))
run(["run", path, "--quiet", "--no-summary"])
as_truth(read_batches(out), ".tar.gz")

# A shard cut short while a slow run reads it.
big = os.path.join(tmp, "big")
os.makedirs(big)
make_dataset(big, shards=1, per_shard=3000, size=16, seed=9)
shard = os.path.join(big, "shard-000000.tar")
pristine = open(shard, "rb").read()


def cut_while_read(mapped):
    with open(shard, "wb") as f:
        f.write(pristine)
    out = os.path.join(tmp, f"cut-{mapped}")
    stages = [("shard_source", dict(urls=shard)), ("tar_split", dict(mmap=mapped)), ("decode", {}),
              ("batch", dict(batch_size=4, partial=True)), ("device_sink", dict(npy_dir=out))]
    path = write_graph(os.path.join(tmp, f"cut-{mapped}.yaml"), stages, error_policy="skip")
    head = subprocess.Popen([SHARDFLOW, "run", path, "--no-summary", "--step-time", "0.02"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not (os.path.isdir(out) and os.listdir(out)) and time.time() < deadline:
        time.sleep(0.01)
    check(os.path.isdir(out), f"mmap {mapped}: the first batch arrived")
    os.truncate(shard, len(pristine) * 2 // 5)
    try:
        _, err = head.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        head.kill()
        _, err = head.communicate()
    return head.returncode, err


rc, err = cut_while_read(True)
# Under a sanitizer its own SIGBUS handler, which ours hands the signal on to, reports it and aborts.
sanitized = os.environ.get("SF_SANITIZE", "none") not in ("", "none")
died = rc == -signal.SIGBUS or (sanitized and rc in (-signal.SIGABRT, 1, 66) and "BUS" in err)
check(died, f"mapped: the run ends with SIGBUS, not {rc}:\n{err}")
check(f"shard {shard} became shorter while it was read" in err and "mmap: false" in err,
      f"mapped: the message names the shard and the way out:\n{err}")
rc, err = cut_while_read(False)
check(rc == 0 and "truncated" in err, f"read(): the cut is a truncated member and the run goes on ({rc}):\n{err}")

shutil.rmtree(tmp)
check.done("mmap")
