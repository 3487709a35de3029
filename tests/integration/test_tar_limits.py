"""Members too large to hold: a GNU sparse tar of huge members and a small .tar.gz of a huge member
are refused with an error record each (counted as skipped), without their bytes being held, and the
rest of the shard goes on: in `shardflow ls` and through tar_split, whose limits are options."""
import collections
import gzip
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, make_dataset, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-limits-")
_, truth = make_dataset(tmp, shards=1, per_shard=6)
good = os.path.join(tmp, "shard-000000.tar")
HUGE = 300 << 20  # over the 256 MiB default of max_member_size
# ASan's shadow memory and allocator add to every process; the members themselves would add 300 MiB.
RSS_MAX = (250 if os.environ.get("SF_SANITIZE", "none") != "none" else 120) << 20


def good_members():
    with tarfile.open(good) as tf:
        return [(m, tf.extractfile(m).read()) for m in tf.getmembers()]


def run_measured(args):
    """Runs the CLI alone in a child; returns (CompletedProcess, its peak RSS in bytes)."""
    code = ("import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)\n"
            "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(p.returncode)\n")
    p = subprocess.run([sys.executable, "-c", code, SHARDFLOW] + args, capture_output=True, text=True, timeout=300)
    lines = p.stderr.rstrip("\n").split("\n")
    p.stderr = "\n".join(lines[:-1])
    return p, int(lines[-1]) * 1024


# ---- a GNU sparse tar: sample 0000000's .ppm replaced by four sparse 300 MiB members ----
sparse_dir = os.path.join(tmp, "sparse")
os.makedirs(sparse_dir)
members = good_members()
names = []
for i in range(4):
    name = f"hole{i}.bin"
    with open(os.path.join(sparse_dir, name), "wb") as f:
        f.truncate(HUGE)
        f.seek(HUGE - 5)
        f.write(b"tail\n")
    names.append(name)
for m, data in members:
    with open(os.path.join(sparse_dir, m.name), "wb") as f:
        f.write(data)
sparse = os.path.join(tmp, "sparse.tar")
subprocess.run(["tar", "--sparse", "--format=gnu", "-cf", sparse, "-C", sparse_dir] + names
               + [m.name for m, _ in members], check=True)
check(os.path.getsize(sparse) < 1 << 20, f"the sparse tar is small ({os.path.getsize(sparse)} bytes)")
with tarfile.open(sparse) as tf:
    check(sum(m.issparse() for m in tf.getmembers()) == 4, "tarfile sees four sparse members")

p, rss = run_measured(["ls", "--json", sparse])
listed = [line for line in p.stdout.splitlines()]
check(p.returncode == 1, f"sparse: ls exits 1: {p.returncode} {p.stderr}")
check(len(re.findall(r"is a sparse file", p.stderr)) == 4 and all(f"hole{i}.bin" in p.stderr for i in range(4)),
      f"sparse: one error names each sparse member: {p.stderr}")
check(len(listed) == 4 + len(truth), f"sparse: the four refused samples (shown without fields) and every other: {p.stdout}")
check(all('"fields": []' in line for line in listed[:4]), f"sparse: a refused member is not read: {listed[:4]}")
check(rss < RSS_MAX, f"sparse: ls peak RSS {rss >> 20} MiB, under {RSS_MAX >> 20} MiB")

# ---- a small .tar.gz holding one 300 MiB member of zeros, then the good samples ----
targz = os.path.join(tmp, "huge.tar.gz")
with gzip.open(targz, "wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w|") as tf:
    info = tarfile.TarInfo("0000100.ppm")
    info.size = HUGE

    class Zeros:
        left = HUGE

        def read(self, n=-1):
            n = self.left if n < 0 else min(n, self.left)
            self.left -= n
            return bytes(n)
    tf.addfile(info, Zeros())
    cls = tarfile.TarInfo("0000100.cls")
    cls.size = 1
    tf.addfile(cls, io.BytesIO(b"3"))
    for m, data in members:
        tf.addfile(m, io.BytesIO(data))
check(os.path.getsize(targz) < 2 << 20, f"the .tar.gz is small ({os.path.getsize(targz)} bytes)")

p, rss = run_measured(["ls", "--json", targz])
check(p.returncode == 1, f"gz: ls exits 1: {p.returncode} {p.stderr}")
check("0000100.ppm" in p.stderr and "max_member_size" in p.stderr and "(key 0000100)" in p.stderr,
      f"gz: the error names the member, its key and the option: {p.stderr}")
check(len(p.stdout.splitlines()) == 1 + len(truth), f"gz: every sample after it is listed: {p.stdout}")
check(rss < RSS_MAX, f"gz: ls peak RSS {rss >> 20} MiB, under {RSS_MAX >> 20} MiB")

# ---- through a pipeline: the limits are tar_split options; refused samples are counted ----


def pipeline(urls, name, **tar_split):
    out = os.path.join(tmp, "out-" + name)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, shuffle=False)),
        ("tar_split", tar_split),
        ("decode", {}),
        ("batch", dict(batch_size=2)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=0, epochs=1, error_policy="skip")
    p = run(["run", graph, "--quiet", "--no-summary"], check=False)
    keys = collections.Counter(k for _, _, ks, _ in read_batches(out) for k in ks)
    m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
    return p, keys, (int(m.group(1)), int(m.group(2))) if m else None


p, keys, counts = pipeline(f"{sparse}::{targz}", "defaults")
check(p.returncode == 0, f"run: skip policy finishes: {p.stderr}")
check(keys == collections.Counter(list(truth) * 2), f"run: every good sample of both shards arrives once: {keys}")
check(counts == (5, 5), f"run: 4 sparse + 1 oversized sample: 5 records, 5 skipped: {counts}")

# A smaller limit: samples over max_sample_size (ppm + cls) or max_member_size are refused too.
ppm_size = next(len(d) for m, d in members if m.name.endswith(".ppm"))
p, keys, counts = pipeline(good, "member", max_member_size=f"{ppm_size - 1}")
check(not keys and counts == (len(truth), len(truth)) and "max_member_size" in p.stderr,
      f"run: max_member_size below the .ppm size refuses every sample: {keys} {counts} {p.stderr[-500:]}")
p, keys, counts = pipeline(good, "sample", max_member_size=f"{ppm_size}", max_sample_size=f"{ppm_size}")
check(not keys and counts == (len(truth), len(truth)) and "max_sample_size" in p.stderr,
      f"run: max_sample_size below ppm + cls refuses every sample: {keys} {counts} {p.stderr[-500:]}")
p, keys, counts = pipeline(good, "fits", max_member_size=f"{ppm_size}", max_sample_size=f"{ppm_size + 1}")
check(keys == collections.Counter(list(truth)) and counts is None, f"run: limits that fit refuse nothing: {keys} {counts}")
check.done("tar_limits")
