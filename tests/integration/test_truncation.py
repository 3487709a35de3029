"""A shard cut at every byte offset, against Python's tarfile: the samples tarfile reads whole are
delivered (the last one before the cut too), the one whose member the cut falls in is counted as
skipped and named, and nothing else is lost or invented. Through `shardflow ls` and a pipeline."""
import collections
import json
import os
import re
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, ppm_bytes, read_batches, run, tar_whole_samples, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-trunc-")
rng = np.random.default_rng(5)
# 16x16 images: each .ppm spans two 512-byte blocks, so cuts land in first and last data blocks.
samples = [(f"{i:07d}", {"ppm": ppm_bytes(rng.integers(0, 256, (16, 16, 3))), "cls": str(i).encode()})
           for i in range(3)]
whole_path = write_shard(os.path.join(tmp, "whole.tar"), samples)
whole = open(whole_path, "rb").read()
all_keys = [k for k, _ in samples]


# Every cut from the first byte to the end of the file.
cuts = list(range(1, len(whole)))
paths = []
for cut in cuts:
    p = os.path.join(tmp, f"cut-{cut:06d}.tar")
    with open(p, "wb") as f:
        f.write(whole[:cut])
    paths.append(p)
listing = os.path.join(tmp, "cuts.txt")
with open(listing, "w") as f:
    f.write("\n".join(paths) + "\n")

# ---- shardflow ls over every cut, in one process ----
p = run(["ls", "--json", "@" + listing], check=False)
check(p.returncode == 1, f"ls: a damaged shard is exit status 1, got {p.returncode}: {p.stderr[-2000:]}")
got = collections.defaultdict(list)
for line in p.stdout.splitlines():
    s = json.loads(line)
    got[s["__url__"]].append((s["__key__"], s["fields"]))
errors = collections.defaultdict(list)
for line in p.stderr.splitlines():
    m = re.match(r"shardflow ls: (\S+)", line)
    if m:
        errors[m.group(1)].append(line)

wrong = []
total_half = 0
for cut, path in zip(cuts, paths):
    want, half = tar_whole_samples(path)
    total_half += half is not None
    g = got.get(path, [])
    if g != want:
        wrong.append(f"cut {cut}: delivered {[k for k, _ in g]} (fields {g[-1:]}), tarfile reads {want}")
        continue
    errs = errors.get(path, [])
    if half is not None:
        if not any(f"(key {half})" in e and "truncated" in e for e in errs):
            wrong.append(f"cut {cut}: the half-read sample {half} is not named: {errs}")
    elif any("(key " in e for e in errs):
        wrong.append(f"cut {cut}: an error names a key though no sample was cut: {errs}")
    if len(want) < len(all_keys) and not errs:
        wrong.append(f"cut {cut}: samples are missing but no error is reported")
check(not wrong, f"ls: {len(wrong)} of {len(cuts)} cuts differ from tarfile; first: " + "\n  ".join(wrong[:6]))
check(total_half > 2000, f"the cuts cover half-read samples ({total_half})")

# The audit's case: a cut inside the next sample's first header after a whole sample.
hdr = whole.find(b"0000002.ppm")
want, half = tar_whole_samples(paths[hdr + 100 - 1])
check(half is None and [k for k, _ in want] == all_keys[:2], "tarfile reads 0000001 whole when the cut is in a header")
check([k for k, _ in got[paths[hdr + 100 - 1]]] == all_keys[:2], "ls delivers the whole sample before a cut header")

# ---- a pipeline over every 5th cut (each cut file is one shard): delivered + skipped, by count ----
run_paths = paths[::5]
run_listing = os.path.join(tmp, "run-cuts.txt")
with open(run_listing, "w") as f:
    f.write("\n".join(run_paths) + "\n")
out = os.path.join(tmp, "out")
graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=f"\"@{run_listing}\"", shuffle=False)),
    ("tar_split", {}),
    ("decode", {}),
    ("batch", dict(batch_size=1)),
    ("device_sink", dict(npy_dir=out)),
], seed=0, epochs=1, error_policy="skip", max_error_rate=1)  # most cuts damage a sample: no budget
p = run(["run", graph, "--quiet", "--no-summary"], check=False)
check(p.returncode == 0, f"run: skip policy finishes: {p.stderr[-2000:]}")
delivered = collections.Counter(k for _, _, keys, _ in read_batches(out) for k in keys)
want = collections.Counter()
run_half = 0
for path in run_paths:
    done, half = tar_whole_samples(path)
    want.update(k for k, _ in done)
    run_half += half is not None
check(delivered == want, f"run: the delivered keys are what tarfile reads whole: "
      f"missing {want - delivered}, extra {delivered - want}")
m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
check(m is not None and int(m.group(2)) == run_half,
      f"run: every half-read sample is counted as skipped ({run_half}): {m and m.group(0)}")
check(m is not None and int(m.group(1)) >= run_half, "run: each cut shard has its error record")
check.done("truncation")
