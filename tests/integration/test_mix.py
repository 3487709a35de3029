"""Mixing datasets (stage mix) and resampled shards (shard_source sampling: resample): proportions of a
0.75/0.25 mix within binomial bounds, determinism by seed, exact resumption, equal samples_per_epoch per
rank, the stop policies, resampled shard order by seed, rank and epoch, bad `inputs:` refused with
file:line, and `shardflow dot` rendered by Graphviz. Samples are counted by the key prefix of two synthetic
datasets written with Python's tarfile."""
import atexit
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, write_shard, yaml_value  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-mix-")
atexit.register(shutil.rmtree, tmp, True)  # on failure too


def dataset(prefix, shards, per_shard):
    """Shards of samples keyed PREFIX<shard>-<index> with a cls field (the sample's global number)."""
    for s in range(shards):
        write_shard(os.path.join(tmp, f"{prefix}-{s:03d}.tar"),
                    [(f"{prefix}{s:03d}-{i:05d}", {"cls": str(s * per_shard + i).encode()}) for i in range(per_shard)])
    return os.path.join(tmp, f"{prefix}-{{000..{shards - 1:03d}}}.tar")


A = dataset("a", 8, 500)   # 4000 samples
B = dataset("b", 4, 250)   # 1000 samples
SMALL_A = dataset("p", 3, 100)
SMALL_B = dataset("q", 1, 100)


def mix_graph(name, urls_a, urls_b, mix, source=None, batch_size=100, **settings):
    """Two branches (shard_source -> tar_split) named by `inputs:`, the mix, decode, batch, a .npy sink."""
    source = source or {}
    out = os.path.join(tmp, name)
    shutil.rmtree(out, ignore_errors=True)
    opts = lambda d: "".join(f", {k}: {yaml_value(v)}" for k, v in d.items())  # noqa: E731
    lines = [f"{k}: {yaml_value(v)}" for k, v in settings.items()] + [
        "stages:",
        f"  - {{name: src_a, type: shard_source, urls: \"{urls_a}\"{opts(source)}}}",
        "  - {name: split_a, type: tar_split}",
        f"  - {{name: src_b, type: shard_source, urls: \"{urls_b}\"{opts(source)}}}",
        "  - {name: split_b, type: tar_split}",
        f"  - {{name: mix, type: mix, inputs: [split_a, split_b]{opts(mix)}}}",
        "  - {type: decode}",
        f"  - {{type: batch, batch_size: {batch_size}, partial: true}}",
        f"  - {{type: device_sink, npy_dir: {out}}}",
    ]
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, out


def batches(path, out, extra=()):
    shutil.rmtree(out, ignore_errors=True)
    run(["run", path, "--quiet", "--no-summary"] + list(extra))
    return {(e, b): (keys, fields["cls"]) for e, b, keys, fields in read_batches(out)}


def keys_of(result, epoch=None):
    return [k for (e, b) in sorted(result) if epoch is None or e == epoch for k in result[(e, b)][0]]


ENDLESS = dict(sampling="resample", shuffle=True)

# 1. proportions: 20,000 samples of a 0.75/0.25 mix of endless (resampled) sources
path, out = mix_graph("prop", A, B, dict(weights=[0.75, 0.25], stop="never", samples_per_epoch=20000),
                      source=ENDLESS, batch_size=1000, seed=7, epochs=1)
full = batches(path, out)
keys = keys_of(full)
n_a = sum(k.startswith("a") for k in keys)
sd = math.sqrt(20000 * 0.75 * 0.25)
check(len(keys) == 20000, f"the mix cuts the epoch at samples_per_epoch: {len(keys)} samples")
check(abs(n_a - 15000) <= 4.5 * sd, f"0.75/0.25 mix: {n_a} of 20000 from the first input, expected 15000 +- {4.5 * sd:.0f}")
for (e, b), (ks, cls) in full.items():  # every sample's bytes travel with its key
    check(all(int(c) == int(k[1:4]) * (500 if k[0] == "a" else 250) + int(k[5:]) for k, c in zip(ks, cls)),
          f"batch {b}: labels match keys")

# 2. determinism: the same seed gives the same sequence whatever the threads; another seed another one
path, out = mix_graph("same", A, B, dict(weights=[0.75, 0.25], stop="never", samples_per_epoch=20000),
                      source=ENDLESS, batch_size=1000, seed=7, epochs=1, threads=1)
check(keys_of(batches(path, out)) == keys, "same seed, 1 thread instead of all: the identical sequence")
path, out = mix_graph("other", A, B, dict(weights=[0.75, 0.25], stop="never", samples_per_epoch=20000),
                      source=ENDLESS, batch_size=1000, seed=8, epochs=1)
other = keys_of(batches(path, out))
check(other != keys and [k[0] for k in other] != [k[0] for k in keys], "another seed: another mix")

# 3. exact resumption from several batch positions, endless sources (never) and finite ones (longest)
for tag, mix, source in (("never", dict(weights=[0.75, 0.25], stop="never", samples_per_epoch=1500), ENDLESS),
                         ("longest", dict(weights=[0.6, 0.4], stop="longest"), dict(shuffle=True))):
    path, out = mix_graph("resume-" + tag, A, B, mix, source=source, seed=3, epochs=2)
    whole = batches(path, out)
    per_epoch = max(b for (e, b) in whole if e == 0) + 1
    for epoch, step in ((0, 1), (0, per_epoch // 2), (1, 7), (1, per_epoch - 1)):
        resumed = batches(path, out, ["--start-epoch", str(epoch), "--start-step", str(step)])
        expect = {k: v for k, v in whole.items() if k >= (epoch, step)}
        check(sorted(resumed) == sorted(expect), f"{tag}: resumed at ({epoch},{step}), the same batches follow")
        check(all(resumed[k][0] == expect[k][0] and np.array_equal(resumed[k][1], expect[k][1]) for k in expect),
              f"{tag}: resumed at ({epoch},{step}), identical keys and labels")

# 4. samples_per_epoch equal on every rank (2 ranks), and the ranks read different samples
per_rank = []
for rank in (0, 1):
    path, out = mix_graph(f"rank{rank}", A, B, dict(weights=[0.75, 0.25], stop="never", samples_per_epoch=1234),
                          source=ENDLESS, seed=5, epochs=2)
    r = batches(path, out, ["--rank", str(rank), "--world-size", "2"])
    per_rank.append(r)
    for e in (0, 1):
        check(len(keys_of(r, e)) == 1234, f"rank {rank} epoch {e}: {len(keys_of(r, e))} samples, not 1234")
check(keys_of(per_rank[0]) != keys_of(per_rank[1]), "the two ranks resample different shards")

# 5. stop policies over finite sources: 300 samples (p) and 100 (q), equal weights
path, out = mix_graph("first", SMALL_A, SMALL_B, dict(stop="first"), source=dict(shuffle=False), seed=1, epochs=1)
ks = keys_of(batches(path, out))
n_p, n_q = sum(k[0] == "p" for k in ks), sum(k[0] == "q" for k in ks)
check((n_q == 100) != (n_p == 300) and n_p + n_q < 400, f"first: ends when one input runs out ({n_p} p, {n_q} q)")
path, out = mix_graph("longest", SMALL_A, SMALL_B, dict(stop="longest"), source=dict(shuffle=False), seed=1, epochs=1)
ks = keys_of(batches(path, out))
check([k for k in ks if k[0] == "p"] == sorted(k for k in ks if k[0] == "p") and
      sum(k[0] == "p" for k in ks) == 300 and sum(k[0] == "q" for k in ks) == 100,
      "longest: both inputs drained, each in its source's order")
path, out = mix_graph("zero", SMALL_A, SMALL_B, dict(stop="longest", weights=[1, 0]), source=dict(shuffle=False),
                      seed=1, epochs=1)
ks = keys_of(batches(path, out))
check(len(ks) == 300 and all(k[0] == "p" for k in ks), "weight 0: that input is never drawn")
# Weights whose sum overflows a double are normalised (by the largest first): [1e308, 1e308] mixes like [1, 1].
even = keys_of(batches(*mix_graph("even", SMALL_A, SMALL_B, dict(stop="longest", weights=[1, 1]),
                                  source=dict(shuffle=False), seed=1, epochs=1)))
path, out = mix_graph("huge", SMALL_A, SMALL_B, dict(stop="longest", weights=[1e308, 1e308]),
                      source=dict(shuffle=False), seed=1, epochs=1)
p = run(["run", path, "--quiet", "--no-summary"], check=False)
ks = keys_of({(e, b): (keys, None) for e, b, keys, _ in read_batches(out)})
check(p.returncode == 0 and len(ks) == 400 and ks == even,
      f"weights [1e308, 1e308]: the mix of weights [1, 1] ({len(ks)} samples, {len(even)} with [1, 1]): {p.stderr}")
path, out = mix_graph("never", SMALL_A, SMALL_B, dict(stop="never", samples_per_epoch=1000), source=ENDLESS, seed=1,
                      epochs=1)
ks = keys_of(batches(path, out))
q = [k for k in ks if k[0] == "q"]
check(len(ks) == 1000 and 400 < len(q) < 600 and len(set(q)) <= 100,
      f"never: the 100-sample input is resampled ({len(q)} samples of it, {len(set(q))} distinct)")

# 6. resampled shards: with replacement, by seed, rank and epoch (a chain; tar_split cuts the epoch)
R = dataset("r", 16, 10)


def shard_order(seed, rank):
    name = f"res-{seed}-{rank}"
    out = os.path.join(tmp, name)
    shutil.rmtree(out, ignore_errors=True)
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"seed: {seed}\nepochs: 2\nstages:\n"
                f"  - {{type: shard_source, urls: \"{R}\", sampling: resample, samples_per_epoch: 200}}\n"
                "  - {type: tar_split}\n  - {type: decode}\n  - {type: batch, batch_size: 10}\n"
                f"  - {{type: device_sink, npy_dir: {out}}}\n")
    r = batches(path, out, ["--rank", str(rank), "--world-size", "2"])
    return [[int(r[k][0][0][1:4]) for k in sorted(r) if k[0] == e] for e in (0, 1)]


s1, s1b, s2, r1 = shard_order(1, 0), shard_order(1, 0), shard_order(2, 0), shard_order(1, 1)
check(s1 == s1b, "resampled shards: the same seed and rank draw the same shards")
check(s1 != s2 and s1 != r1 and s1[0] != s1[1], "resampled shards differ by seed, rank and epoch")
check(all(len(e) == 20 and len(set(e)) < 20 for e in s1), f"20 draws from 16 shards repeat some (with replacement): {s1}")

# 7. a bad input name is refused with the graph file and line; `dot` draws the branches
path, _ = mix_graph("bad", A, B, dict(weights=[0.5, 0.5]))
text = open(path).read().replace("inputs: [split_a, split_b]", "inputs: [split_a, split_c]")
with open(path, "w") as f:
    f.write(text)
p = run(["run", path], check=False)
line = text.splitlines().index([ln for ln in text.splitlines() if "split_c" in ln][0]) + 1
check(p.returncode != 0 and f"{path}:{line}" in p.stderr and "split_c" in p.stderr and "src_a" in p.stderr,
      f"a bad input name names the file:line and the stages: {p.stderr}")
for what, old, new, at, words in (
        ("a stage read twice", "  - {name: mix", "  - {name: extra, type: decode, input: split_a}\n  - {name: mix",
         "{name: mix", ["split_a", "feeds both"]),
        ("a branch nobody reads", "inputs: [split_a, split_b]", "inputs: [split_a]", "{name: split_b",
         ["split_b", "feeds no stage"]),
        ("inputs on a source", "{name: src_b, type: shard_source,", "{name: src_b, type: shard_source, input: split_a,",
         "{name: src_b", ["src_b", "source"]),
        ("a later stage", "inputs: [split_a, split_b]", "inputs: [split_a, batch]", "{name: mix", ["batch", "later"])):
    path, _ = mix_graph("bad2", A, B, {})
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    p = run(["run", path], check=False)
    line = [n for n, ln in enumerate(text.replace(old, new).splitlines(), 1) if at in ln][0]
    check(p.returncode != 0 and all(w in p.stderr for w in words) and f"{path}:{line}:" in p.stderr,
          f"{what} is refused: {p.stderr}")
path, _ = mix_graph("dot", A, B, dict(weights=[0.5, 0.5]))
dot = run(["dot", path]).stdout
check('"split_a" -> "mix"' in dot and '"split_b" -> "mix"' in dot and '"mix" -> "decode"' in dot, f"dot edges: {dot}")
svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
check(svg.count('class="edge"') == 7, "graphviz renders the 7 edges")

# 8. groups keep working after the mix (decode) and on a branch (each input's decode): the same batches
def grouped(name, branch_group):
    path, out = mix_graph(name, SMALL_A, SMALL_B, dict(weights=[0.75, 0.25], stop="longest"),
                          source=dict(shuffle=True), seed=9, epochs=2)
    text = open(path).read()
    if branch_group:  # decode on each branch (the first in a group), none after the mix
        text = text.replace("  - {name: src_b", "  - {name: dec_a, type: decode, group: g}\n  - {name: src_b")
        text = text.replace("  - {name: mix", "  - {name: dec_b, type: decode}\n  - {name: mix")
        text = text.replace("inputs: [split_a, split_b]", "inputs: [dec_a, dec_b]").replace("  - {type: decode}\n", "")
    alone = batches(path, out)
    with open(path, "w") as f:
        f.write("groups:\n  g: {processes: 2}\n" + (text if branch_group else text.replace("{type: decode}", "{type: decode, group: g}")))
    together = batches(path, out)
    check(len(alone) > 0 and sorted(alone) == sorted(together) and
          all(alone[k][0] == together[k][0] and np.array_equal(alone[k][1], together[k][1]) for k in alone),
          f"{name}: a group gives the batches of one process")


grouped("group-after-mix", False)
grouped("group-on-branch", True)

# 9. a mix of more inputs than a fixed port list would have (its ports are a template, in%u): twelve branches with
# a weight each, stop: longest, so every sample of every branch comes out once; each input's count in the table.
BRANCHES = 12
urls = [dataset(f"m{i:02d}x", 1, 10 + i) for i in range(BRANCHES)]
out = os.path.join(tmp, "many")
lines = ["seed: 3", "epochs: 1", "stages:"]
for i, u in enumerate(urls):
    lines += [f"  - {{name: src{i}, type: shard_source, urls: \"{u}\"}}", f"  - {{name: split{i}, type: tar_split}}"]
lines += [f"  - {{name: mix, type: mix, stop: longest, inputs: [{', '.join(f'split{i}' for i in range(BRANCHES))}], "
          f"weights: [{', '.join(str(i + 1) for i in range(BRANCHES))}]}}",
          "  - {type: decode}", "  - {type: batch, batch_size: 16, partial: true}", f"  - {{type: device_sink, npy_dir: {out}}}"]
path = os.path.join(tmp, "many.yaml")
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
p = run(["run", path, "--quiet"], check=False)
got = sorted(k for e, b, keys, fields in read_batches(out) for k in keys) if p.returncode == 0 else []
want = sorted(f"m{i:02d}x000-{j:05d}" for i in range(BRANCHES) for j in range(10 + i))
check(p.returncode == 0 and got == want, f"a mix of {BRANCHES} inputs gives every sample of each once: "
      f"{len(got)} of {len(want)}\n{p.stderr[-2000:]}")
counts = {ln.split()[1]: int(ln.split()[2]) for ln in p.stderr.splitlines() if ln.startswith("  <- ")}
check(counts == {f"split{i}": 10 + i for i in range(BRANCHES)}, f"the stage table counts each input: {counts}")
check.done("mix")
