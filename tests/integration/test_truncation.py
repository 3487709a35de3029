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
# What tarfile reads whole, except the sample right before the damage (ls reported the shard) when tarfile
# reads no member of another key after it: the reader cannot tell that sample whole, so tar_split delivers it
# only when it has every field of the last sample delivered before (none: dropped). Each dropped or
# half-read sample is skipped. (A cut in the zero blocks after the last sample is no damage.)
want = collections.Counter()
run_skipped, reference = 0, None
damaged = [path for path in run_paths if errors.get(path)]
for path in run_paths:
    done, half = tar_whole_samples(path)
    for i, (key, fields) in enumerate(done):
        unsure = half is None and i == len(done) - 1 and path in damaged
        if unsure and (reference is None or not set(reference) <= set(fields)):
            run_skipped += 1
            continue
        want[key] += 1
        reference = fields
    run_skipped += half is not None
check(delivered == want, f"run: the delivered keys are what tarfile reads whole: "
      f"missing {want - delivered}, extra {delivered - want}")
m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
check(m is not None and int(m.group(2)) == run_skipped,
      f"run: every half-read or dropped sample is counted as skipped ({run_skipped}): {m and m.group(0)}")
# Exactly one record per damaged shard (before: a sample cut in its .cls header went on to batch, which
# set the batch's fields from it and left .cls out of every later batch, silently).
check(m is not None and int(m.group(1)) == len(damaged), f"run: one record per damaged shard ({len(damaged)}): "
      f"{m and m.group(0)}")
check(all(set(f) == {"ppm", "cls"} for _, _, _, f in read_batches(out)), "run: every batch has ppm and cls")

# ---- a cut in the header of a sample's second member: that sample is cut, not whole ----
# tarfile reads its .ppm, so a reader lists it (ls above); but it lacks the .cls every earlier sample has,
# so the pipeline drops it once, with the truncation's record from tar_split naming it, instead of passing
# it on for batch to refuse as a second error ("field 'cls' is missing in this sample"). Before: 2 records.
cls_header = whole.find(b"0000001.cls")
half_path = os.path.join(tmp, "cut-in-cls-header.tar")
with open(half_path, "wb") as f:
    f.write(whole[:cls_header + 50])
done, half = tar_whole_samples(half_path)
check(half is None and done == [("0000000", ["ppm", "cls"]), ("0000001", ["ppm"])],
      f"tarfile reads 0000001's .ppm and no .cls: {done} {half}")
out_half = os.path.join(tmp, "out-half")
graph = write_graph(os.path.join(tmp, "half.yaml"), [
    ("shard_source", dict(urls=f"{whole_path}::{half_path}", shuffle=False)),
    ("tar_split", {}),
    ("decode", {}),
    ("batch", dict(batch_size=1)),
    ("device_sink", dict(npy_dir=out_half)),
], seed=0, epochs=1, error_policy="skip", max_error_rate=1)
p = run(["run", graph, "--quiet", "--no-summary"], check=False)
keys = [k for _, _, ks, _ in read_batches(out_half) for k in ks]
check(p.returncode == 0 and keys == all_keys + ["0000000"], f"the whole samples arrive: {keys} {p.stderr}")
records = [line for line in p.stderr.splitlines() if line.startswith("shardflow: error:")]
check(len(records) == 1 and "tar_split:" in records[0] and "(key 0000001)" in records[0] and half_path in records[0],
      f"one error, from tar_split, naming the cut sample: {records}")
check("is missing" not in p.stderr, f"no second error from batch: {p.stderr}")
m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
check(m is not None and (int(m.group(1)), int(m.group(2))) == (1, 1), f"1 record, 1 skipped: {p.stderr}")
check.done("truncation")
