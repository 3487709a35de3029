"""Mutation test: seeded mutants of a seed-format shard (bit flips, truncations, tar header fields with
and without a valid checksum) run with replicas 1 and 2. Every run ends without a crash, the
batches are identical across replica counts, and nothing is lost silently: delivered + skipped =
the samples in the shard, counted with Python's tarfile and WebDataset's grouping where tarfile reads
the whole mutant cleanly; where it does not, delivered + skipped stays within what tarfile saw.
Mutants: SF_MUTANTS or the first argument (default 300; the ASan run uses fewer)."""
import io
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, make_dataset, read_batches, write_graph  # noqa: E402

check = Checks()
MUTANTS = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("SF_MUTANTS", "300"))
tmp = tempfile.mkdtemp(prefix="sf-mutants-")
make_dataset(tmp, shards=1, per_shard=12, size=6, seed=4)
seed = open(os.path.join(tmp, "shard-000000.tar"), "rb").read()
SAMPLES = 12
headers = [off for off in range(0, len(seed), 512) if seed[off + 257:off + 262] == b"ustar"]
NAME = re.compile(r"^[0-9A-Za-z_-]+\.[0-9A-Za-z.]+$")


def checksum(block):
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)


def mutate(rng):
    data = bytearray(seed)
    kind = rng.choice(["data", "flip", "flips", "truncate", "header", "header-valid"])
    if kind == "data":  # bytes of a member's contents: pixels or a label
        h = rng.choice(headers)
        size = int(seed[h + 124:h + 135], 8)
        for _ in range(rng.randint(1, 3)):
            data[h + 512 + rng.randrange(size)] ^= 1 << rng.randrange(8)
    elif kind == "flip":
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    elif kind == "flips":
        for _ in range(rng.randint(2, 16)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[rng.randrange(len(data)):]
    else:
        h = rng.choice(headers)
        field = rng.choice([(0, 100), (100, 108), (124, 136), (136, 148), (156, 157), (257, 263), (345, 500)])
        a, b = field
        if field == (124, 136) and rng.random() < 0.6:  # a plausible size: octal digits
            data[a:b] = b"%011o\0" % rng.choice([0, 1, 100, 511, 512, 513, 4096, 1 << 33, rng.randrange(1 << 20)])
        else:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(a, b)] = rng.randrange(256)
        if kind == "header-valid":
            block = data[h:h + 512]
            checksum(block)
            data[h:h + 512] = block
    return kind, bytes(data)


def reference(blob):
    """(samples, clean): WebDataset's grouping over what tarfile reads; clean when it read it all, normally."""
    keys, clean = [], True
    try:
        with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
            for m in tf:
                if not m.isfile():
                    clean = False
                    continue
                base = m.name.rsplit("/", 1)[-1]
                if not NAME.match(base) or "/" in m.name:
                    clean = False
                key = m.name[:len(m.name) - len(base)] + base.split(".", 1)[0]
                if not keys or keys[-1] != key:
                    keys.append(key)
                if len(tf.extractfile(m).read()) != m.size:
                    clean = False
            end = tf.offset
        if any(blob[end:]):
            clean = False  # tarfile stops quietly at a bad header that follows good ones
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError):
        clean = False
    return len(keys), clean


def run(name, path, replicas):
    out = os.path.join(tmp, f"out-{name}-{replicas}")
    shutil.rmtree(out, ignore_errors=True)
    graph = write_graph(os.path.join(tmp, f"{name}-{replicas}.yaml"), [
        ("shard_source", dict(urls=path, shuffle=False)),
        ("tar_split", {}),
        ("decode", dict(replicas=replicas)),
        ("augment", dict(crop="random", size=6, padding=1, flip=0.5, dtype="uint8", replicas=replicas)),
        ("batch", dict(batch_size=4, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=1, max_error_rate=1)
    p = subprocess.run([SHARDFLOW, "run", graph, "--no-summary", "--log-steps", "0"], capture_output=True, text=True,
                       timeout=60)
    m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
    batches = read_batches(out)
    delivered = sum(len(k) for _, _, k, _ in batches)
    return p, delivered, int(m[2]) if m else 0, batches


rng = random.Random(20261123)
kinds, strict = {}, 0
for i in range(MUTANTS):
    kind, blob = mutate(rng)
    kinds[kind] = kinds.get(kind, 0) + 1
    path = os.path.join(tmp, f"m{i:04d}.tar")
    with open(path, "wb") as f:
        f.write(blob)
    samples, clean = reference(blob)
    p1, d1, s1, b1 = run(f"m{i:04d}", path, 1)
    p2, d2, s2, b2 = run(f"m{i:04d}", path, 2)
    what = f"mutant {i} ({kind}, kept as {path})"
    for p in (p1, p2):
        check(p.returncode in (0, 1) and "Sanitizer" not in p.stderr and "runtime error" not in p.stderr,
              f"{what}: ends without a crash, exit {p.returncode}\n{p.stderr[-2000:]}")
    check((d1, s1) == (d2, s2), f"{what}: delivered/skipped {d1}/{s1} with 1 replica, {d2}/{s2} with 2")
    check(len(b1) == len(b2) and all(k1 == k2 and all(np.array_equal(f1[n], f2[n]) for n in f1)
                                     for (_, _, k1, f1), (_, _, k2, f2) in zip(b1, b2)),
          f"{what}: identical batches with 1 and 2 replicas")
    if clean:
        strict += 1
        check(d1 + s1 == samples, f"{what}: delivered {d1} + skipped {s1} = {samples} samples (tarfile)\n{p1.stderr}")
    else:
        check(d1 + s1 <= max(samples, SAMPLES) + 1, f"{what}: delivered {d1} + skipped {s1} within {samples} (tarfile)")
    if i % 50 == 49:
        print(f"{i + 1} mutants", flush=True)
    shutil.rmtree(os.path.join(tmp, f"out-m{i:04d}-1"), ignore_errors=True)
    shutil.rmtree(os.path.join(tmp, f"out-m{i:04d}-2"), ignore_errors=True)
    os.unlink(path) if (d1 + s1 == samples or not clean) else None

print(f"{MUTANTS} mutants {kinds}; {strict} read cleanly by tarfile and counted exactly")
check(strict > MUTANTS // 8, f"enough mutants have an exact reference: {strict}")
check.done("mutants")
