"""Indexed shards: `shardflow index` against tarfile's own member offsets; shard_source's order: global (every
sample exactly once per epoch for 1, 2, 3 and 7 ranks; one permutation whatever the rank or replica layout, another
for another seed or epoch; position uncorrelated with the dataset's order, the first 1,000 samples from >= 90% of
the shards), order: block (whole blocks of consecutive samples), samples_per_epoch, resumes from a count of
consumed samples at other world sizes, and a stale index refused naming both files. The reference is the shards'
key lists as Python's tarfile reads them. A mix by position (stop: never over order: global inputs) against a
Python model of its documented draw (docs/resume.md): each rank's batches at 1-3 ranks, resumed from a count at
other world sizes and DataLoader workers, the weights within 4 sigma."""
import os
import shutil
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, nginx, read_batches, run, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-index-")


def make_shards(root, shards, per_shard, prefix="s", tag=""):
    """Shards of samples keyed TAGSSS_IIII with a cls member (and a txt member of varying size); returns the URL
    pattern and the dataset's keys in shard order (tarfile's reading)."""
    os.makedirs(root, exist_ok=True)
    paths = []
    for s in range(shards):
        samples = [(f"{tag}{s:03d}_{i:04d}", {"cls": str(i % 10).encode(), "txt": b"x" * ((s * 7 + i * 13) % 700)})
                   for i in range(per_shard)]
        paths.append(write_shard(os.path.join(root, f"{prefix}{s:03d}.tar"), samples))
    keys = []
    for p in paths:
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                k = m.name.split(".")[0]
                if not keys or keys[-1] != k:
                    keys.append(k)
    return os.path.join(root, prefix + "{%03d..%03d}.tar" % (0, shards - 1)), paths, keys


def order_run(name, urls, rank=0, world=1, seed=1, epochs=1, batch_size=250, replicas=1, expect_fail=False,
              group=None, **source):
    """One rank's keys per epoch, in the order the trainer gets them. group: decode in a group of these settings."""
    out = os.path.join(tmp, name)
    shutil.rmtree(out, ignore_errors=True)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, **source)),
        ("tar_split", {}),
        ("decode", dict(replicas=replicas, **({"group": "decoders"} if group else {}))),
        ("batch", dict(batch_size=batch_size, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ], groups={"decoders": group} if group else None, seed=seed, epochs=epochs)
    p = run(["run", graph, "--quiet", "--no-summary", "--rank", str(rank), "--world-size", str(world)],
            check=not expect_fail)
    if expect_fail:
        return p
    per = {}
    for e, _, keys, fields in read_batches(out):
        per.setdefault(e, []).extend(keys)
        for k, c in zip(keys, fields["cls"]):
            check(int(k.split("_")[1]) % 10 == c, f"{name}: the label of {k} travels with it")
    return per


def interleave(parts):
    """The global order from the ranks' parts: position p is rank p mod W's (p div W)-th sample."""
    out, k = [], 0
    while True:
        row = [part[k] for part in parts if k < len(part)]
        if not row:
            return out
        out += row
        k += 1


def dealt(order, world, batch):
    """The model of shard_source's deal (the batch size): round i of the order gives rank r its positions
    i*B*W + r*B .. + B; the short last round goes a position at a time. Per rank, its batches in order."""
    rnd = batch * world
    full = len(order) // rnd
    out = []
    for r in range(world):
        bs = [order[i * rnd + r * batch:i * rnd + (r + 1) * batch] for i in range(full)]
        tail = order[full * rnd + r::world]
        out.append(bs + ([tail] if tail else []))
    return out


# ---- shardflow index, against tarfile ----
urls, paths, keys = make_shards(os.path.join(tmp, "big"), shards=50, per_shard=200)  # 10,000 samples
p = run(["index", urls])
check(len(p.stdout.splitlines()) == 50, f"one line per shard: {p.stdout[:200]}")
for path in paths[:3] + paths[-1:]:
    with tarfile.open(path) as tf:
        members = tf.getmembers()
        end = tf.offset  # where tarfile stopped: the end-of-archive blocks
    firsts = {}
    for m in members:
        firsts.setdefault(m.name.split(".")[0], m.offset)
    starts = list(firsts.values()) + [end]
    expect = [(starts[i], starts[i + 1] - starts[i], k) for i, k in enumerate(firsts)]
    lines = open(path + ".sfidx").read().splitlines()
    got = [(int(a), int(b), c) for a, b, c in (line.split(" ", 2) for line in lines[6:])]
    check(lines[0] == "shardflow-index 1" and lines[4] == "etag -" and lines[5] == f"samples {len(expect)}", f"{path}: header {lines[:5]}")
    check(got == expect, f"{path}: each sample's offset and length are tarfile's ({got[:2]} vs {expect[:2]})")
    check(lines[2] == f"size {os.path.getsize(path)}", "the index records the shard's size")

# ---- shardflow write writes the index with the shards ----
files = os.path.join(tmp, "files")
os.makedirs(files)
for i in range(30):
    for ext, data in (("cls", str(i % 10).encode()), ("txt", b"t" * (i * 37))):
        with open(os.path.join(files, f"{i:03d}_{i:04d}.{ext}"), "wb") as f:
            f.write(data)
run(["write", "-q", "--layout", "files", "--maxcount", "8", files, os.path.join(tmp, "w", "w-%03d.tar")])
written = sorted(os.listdir(os.path.join(tmp, "w")))
check(written == [f"w-{i:03d}.tar{e}" for i in range(4) for e in ("", ".sfidx")], f"write: shards and indexes {written}")
made = {n: open(os.path.join(tmp, "w", n)).read() for n in written if n.endswith(".sfidx")}
run(["index", "-q", os.path.join(tmp, "w", "w-{000..003}.tar")])
check(all(open(os.path.join(tmp, "w", n)).read() == t for n, t in made.items()), "write's index is shardflow index's")
run(["write", "-q", "--no-index", "--layout", "files", files, os.path.join(tmp, "w2", "w-%03d.tar")])
check(os.listdir(os.path.join(tmp, "w2")) == ["w-000.tar"], "write --no-index writes none")

# ---- order: global ----
position = {k: i for i, k in enumerate(keys)}
layouts = {}
for world in (1, 2, 3, 7):
    parts = [order_run(f"g{world}r{r}", urls, rank=r, world=world, epochs=2 if world == 1 else 1,
                       replicas=2 if world == 3 else 1, order="global") for r in range(world)]
    for e in (0, 1) if world == 1 else (0,):
        got = [k for part in parts for k in part[e]]
        check(len(got) == len(keys) and set(got) == set(keys), f"{world} ranks, epoch {e}: every sample exactly once")
    sizes = [len(part[0]) for part in parts]
    check(max(sizes) - min(sizes) <= 1, f"{world} ranks: equal parts (+-1): {sizes}")
    layouts[world] = interleave([part[0] for part in parts])
    if world == 1:
        epoch0, epoch1 = parts[0][0], parts[0][1]
for world in (2, 3, 7):
    check(layouts[world] == layouts[1], f"{world} ranks (3 with decode replicas): the same permutation as 1 rank")
check(epoch0 != epoch1 and sorted(epoch0) == sorted(epoch1), "another epoch, another permutation of the same samples")
grouped = order_run("ggroup", urls, order="global", epochs=2, group={"processes": 2, "unit_samples": 64})
check(grouped[0] == epoch0 and grouped[1] == epoch1, "decode in a group of 2 processes: the same permutations")
other_seed = order_run("gseed", urls, seed=2, order="global")[0]
check(other_seed != epoch0, "another seed, another permutation")

index_of = np.array([position[k] for k in epoch0], dtype=np.float64)
rho = np.corrcoef(np.arange(len(index_of)), index_of)[0, 1]  # both are ranks: Pearson of ranks is Spearman's rho
check(abs(rho) < 0.05, f"output position vs dataset index: |Spearman rho| = {abs(rho):.4f} < 0.05")
shards_seen = {k.split("_")[0] for k in epoch0[:1000]}
check(len(shards_seen) >= 45, f"the first 1,000 samples come from {len(shards_seen)} of 50 shards (>= 90%)")
unshuffled = order_run("gplain", urls, order="global", shuffle=False)[0]
check(unshuffled == keys, "shuffle: false reads the dataset in shard order")

# samples_per_epoch: every rank the same count; at ranks x spe = the dataset, every sample once.
parts = [order_run(f"spe{r}", urls, rank=r, world=4, order="global", samples_per_epoch=2500, epochs=2)
         for r in range(4)]
check(all(len(p[e]) == 2500 for p in parts for e in (0, 1)), "samples_per_epoch: 2,500 on every rank, every epoch")
check(sorted(k for p in parts for k in p[0]) == sorted(keys), "4 ranks x 2,500: every sample once")
parts = [order_run(f"spe3r{r}", urls, rank=r, world=3, order="global", samples_per_epoch=4000) for r in range(3)]
got = [k for p in parts for k in p[0]]
check(all(len(p[0]) == 4000 for p in parts), "samples_per_epoch past the dataset: 4,000 on each of 3 ranks")
check(set(got) == set(keys), "...every sample at least once (the order repeats, reshuffled)")

# ---- order: block ----
block = [order_run(f"b{world}r{r}", urls, rank=r, world=world, order="block", block_size=16)[0] for world in (1, 3)
         for r in range(world)]
check(sorted(block[0]) == sorted(keys), "block, 1 rank: every sample once")
check(sorted(k for part in block[1:] for k in part) == sorted(keys), "block, 3 ranks: every sample once")
runs = [block[0][i:i + 16] for i in range(0, len(keys) - 16, 16)]
whole = sum(all(position[b] == position[r[0]] + j for j, b in enumerate(r)) for r in runs)
check(whole >= 0.95 * len(runs), f"block: {whole} of {len(runs)} runs of 16 are consecutive samples")
check(block[0] != keys and block[0][:16] != keys[:16], "block: blocks in a seeded order")

# ---- resume: the epoch's first C positions consumed at one world size, the rest at another ----
small, small_paths, small_keys = make_shards(os.path.join(tmp, "small"), shards=8, per_shard=35, prefix="r")
run(["index", "-q", small])
full = order_run("rfull", small, order="global", batch_size=7)[0]
for old in (2, 3):
    for steps in (1, 3, 5, 8):  # every old rank returned `steps` batches of 7
        consumed = steps * 7 * old
        for new in (1, 3, 7):
            if new == old:
                continue
            parts = [order_run(f"res{old}-{steps}-{new}-{r}", small, rank=r, world=new, order="global", batch_size=7,
                               start=consumed)[0] if consumed < len(small_keys) else [] for r in range(new)]
            rest = [k for part in parts for k in part]
            check(sorted(full[:consumed] + rest) == sorted(small_keys),
                  f"{old} -> {new} ranks after {consumed}: every sample once")
            check(interleave(parts) == full[consumed:], f"{old} -> {new} ranks after {consumed}: the same order goes on")
# deal (Python sets it to the batch size): rounds of one batch per rank, worker = round mod workers; a start
# of any layout. The rank's batches in DataLoader's order (its workers in turn) are the model's.
for visit, world, workers, start in (("global", 2, 3, 42), ("global", 3, 3, 0), ("global", 1, 3, 35), ("block", 3, 2, 21)):
    order = full if visit == "global" else order_run("bfull", small, order="block", block_size=5, batch_size=7)[0]
    model = dealt(order[start:], world, 7)
    for r in range(world):
        for w in range(workers):
            got = order_run(f"deal-{visit}{world}{workers}-{r}{w}", small, rank=r, world=world, order=visit, block_size=5,
                            batch_size=7, deal=7, workers=workers, worker=w, start=start)[0]
            check(got == [k for b in model[r][w::workers] for k in b],
                  f"deal 7, order {visit}, rank {r} of {world}, worker {w} of {workers}, start {start}: the model's rounds")
p = order_run("bres", small, order="block", block_size=5, start=7, world=2, expect_fail=True)
check(p.returncode != 0 and "multiple of ranks x workers" in p.stderr, f"block refuses a start of another world: {p.stderr}")

# ---- remote shards over HTTP: ranged GETs pinned to the ETag the index recorded ----
remote_idx = os.path.join(tmp, "remote-idx")
with nginx(os.path.join(tmp, "small")) as base:
    remote = base + "/r{000..007}.tar"
    p = run(["index", remote], check=False)
    check(p.returncode == 2 and "--out" in p.stderr, f"a remote shard's index needs --out: {p.stderr}")
    run(["index", "-q", "--out", remote_idx, remote])
    etags = [line for n in os.listdir(remote_idx) for line in open(os.path.join(remote_idx, n)) if line.startswith("etag")]
    check(len(etags) == 8 and all(e.startswith('etag "') for e in etags), f"the ETags are recorded: {etags[:2]}")
    parts = [order_run(f"http{r}", remote, rank=r, world=2, order="global", batch_size=7, index_dir=remote_idx)[0]
             for r in range(2)]
    check(interleave(parts) == full, "over HTTP, 2 ranks: the same permutation as the local shards'")
    os.remove(os.path.join(remote_idx, sorted(os.listdir(remote_idx))[2]))
    blocks = order_run("httpblock", remote, order="block", block_size=5, index_dir=remote_idx)[0]
    check(len(os.listdir(remote_idx)) == 8, "a missing remote index is made on first use, in index_dir")
    check(sorted(blocks) == sorted(small_keys), "over HTTP, order: block: every sample once")
    p = order_run("http_noidx", remote, order="global", expect_fail=True)
    check(p.returncode != 0 and "index_dir" in p.stderr, f"remote shards need index_dir: {p.stderr}")
    os.utime(small_paths[3], (1, 1))  # nginx's ETag (mtime-size) changes: as if the shard was rewritten
    p = order_run("http_stale", remote, order="global", index_dir=remote_idx, expect_fail=True)
    check("changed since it was indexed" in p.stderr and "r003.tar @ byte" in p.stderr,
          f"a remote shard changed since its index is refused: {p.stderr}")
    r003_idx = os.path.join(remote_idx, next(n for n in os.listdir(remote_idx) if n.startswith("r003.tar-")))
    check(r003_idx in p.stderr and base + "/r003.tar" in p.stderr
          and f"shardflow index --out {remote_idx} {base}/r003.tar" in p.stderr,
          f"...naming the index file, the shard's URL and the command that rebuilds the index: {p.stderr}")
run(["index", "-q", small])  # the local indexes, after the mtime change

# ---- missing, stale and unusable indexes ----
os.remove(small_paths[2] + ".sfidx")
check(order_run("made", small, order="global")[0] == full, "a missing index is made on first use, same order")
check(os.path.exists(small_paths[2] + ".sfidx"), "...and kept next to the shard")
idx_dir = os.path.join(tmp, "indexes")
p = run(["index", "--out", idx_dir, small])
check(len(os.listdir(idx_dir)) == 8 and all(line.startswith(idx_dir) for line in p.stdout.splitlines()),
      "index --out DIR writes there")
write_shard(small_paths[5], [(f"005_{i:04d}", {"cls": b"1", "txt": b"changed"}) for i in range(35)])
p = order_run("stale", small, order="global", expect_fail=True)
check(p.returncode != 0 and small_paths[5] + ".sfidx" in p.stderr and small_paths[5] in p.stderr
      and "stale" in p.stderr, f"a stale index is refused, naming both files: {p.stderr}")
p = order_run("stale_dir", small, order="global", index_dir=idx_dir, expect_fail=True)
check(p.returncode != 0 and idx_dir in p.stderr and "stale" in p.stderr, f"...also in index_dir: {p.stderr}")
# Megatron-Energon's SHARD.tar.idx (as `energon prepare` writes it: each sample's first member offset, then
# tarfile's offset at the end, native uint64) is read in place of a missing .sfidx; an older one is stale.
import struct  # noqa: E402
energon, energon_paths, energon_keys = make_shards(os.path.join(tmp, "energon"), shards=3, per_shard=20, prefix="e")
for path in energon_paths:
    with tarfile.open(path) as tf, open(path + ".idx", "wb") as iw:
        last = None
        for m in tf:
            base = m.name.split(".")[0]
            if base != last:
                iw.write(struct.pack("Q", m.offset))
                last = base
        iw.write(struct.pack("Q", tf.offset))
check(order_run("energon_run", energon, order="global", shuffle=False)[0] == energon_keys, "Energon's .tar.idx is read")
check(not any(os.path.exists(p + ".sfidx") for p in energon_paths), "...and no index of ours is made for it")
os.utime(energon_paths[1] + ".idx", (0, 0))
p = order_run("energon_stale", energon, order="global", expect_fail=True)
check(p.returncode != 0 and energon_paths[1] + ".idx" in p.stderr and "stale" in p.stderr,
      f"an Energon index older than its shard is refused, naming both: {p.stderr}")
# A damaged index is refused with its file and line, a huge sample count without allocating for it.
run(["index", "-q", small])  # r005 was rewritten above
good = open(small_paths[6] + ".sfidx").read()
lines = good.splitlines(True)
for name, text, line in (("garbage", good.replace(lines[8], "12 x 34\n"), 9),
                         ("count", good.replace(lines[5], "samples 99999999999999\n"), 6),
                         ("gap", good.replace(lines[7], "%d %s" % (int(lines[7].split(" ", 1)[0]) + 512,
                                                                   lines[7].split(" ", 1)[1])), 8)):
    with open(small_paths[6] + ".sfidx", "w") as f:
        f.write(text)
    os.utime(small_paths[6] + ".sfidx")
    p = order_run("bad_" + name, small, order="global", expect_fail=True)
    check(p.returncode != 0 and f"r006.tar.sfidx:{line}" in p.stderr and "malformed" in p.stderr,
          f"a damaged index ({name}) is refused naming its file and line {line}: {p.stderr}")
with open(small_paths[6] + ".sfidx", "w") as f:
    f.write(good)
gz = os.path.join(tmp, "c.tar.gz")
with open(small_paths[0], "rb") as f, open(gz, "wb") as g:
    import gzip
    g.write(gzip.compress(f.read()))
p = run(["index", gz], check=False)
check(p.returncode == 1 and "compressed" in p.stderr, f"a compressed shard cannot be indexed: {p.stderr}")

# ---- mix by position: a model of its draws, written from docs/resume.md's formula ----
M64 = (1 << 64) - 1


def seed_mix(seed, word):
    """sf_seed_mix: splitmix64's step and finaliser over seed ^ word x 0xd6e8feb86659fd93."""
    z = ((seed ^ ((word * 0xd6e8feb86659fd93) & M64)) + 0x9e3779b97f4a7c15) & M64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def node_seed(seed, name):
    """A node's seed: the graph seed mixed with the FNV-1a hash of the node's name."""
    h = 0xcbf29ce484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001b3) & M64
    return seed_mix(seed, h)


def mix_pick(seed, epoch, p, weights):
    """The input of mixed position p: u from the position's hash, the first input whose running weight passes it."""
    u = (seed_mix(seed_mix(seed_mix(seed, epoch), 0x6d6978), p) >> 11) * 2.0 ** -53
    big = max(weights)
    x = u * sum(w / big for w in weights if w > 0)
    for i, w in enumerate(weights):
        if w > 0:
            if x < w / big:
                return i
            x -= w / big
    return max(i for i, w in enumerate(weights) if w > 0)


def mixed(seed, weights, orders, n, epoch=0, name="mix"):
    """The epoch's first n mixed positions: input j's k-th sample (its own order, passes after it) goes to the
    k-th position drawing j. Returns (keys, the input of each)."""
    s, taken, out, which = node_seed(seed, name), [0] * len(orders), [], []
    for p in range(n):
        j = mix_pick(s, epoch, p, weights)
        out.append(orders[j][taken[j]])
        which.append(j)
        taken[j] += 1
    return out, which


def mix_end(seed, weights, sizes, epoch=0, name="mix"):
    """stop: first by position: the epoch's positions are those before the first position whose draw j would be
    input j's (sizes[j] + 1)-th sample (docs/resume.md)."""
    s, taken, p = node_seed(seed, name), [0] * len(sizes), 0
    while True:
        j = mix_pick(s, epoch, p, weights)
        if taken[j] == sizes[j]:
            return p
        taken[j] += 1
        p += 1


def mix_yaml(path, urls_a, urls_b, weights, samples, seed=5, epochs=1, deal=0, sink=None, stop="never"):
    """Two order: global sources (src_a, src_b) -> tar_split -> mix -> decode -> batch of 4 (-> a .npy sink)."""
    d = f", deal: {deal}" if deal else ""
    with open(path, "w") as f:
        f.write(f"seed: {seed}\nepochs: {epochs}\nstages:\n"
                f"  - {{name: src_a, type: shard_source, urls: \"{urls_a}\", order: global{d}}}\n"
                "  - {name: split_a, type: tar_split}\n"
                f"  - {{name: src_b, type: shard_source, urls: \"{urls_b}\", order: global{d}}}\n"
                "  - {name: split_b, type: tar_split}\n"
                f"  - {{name: mix, type: mix, inputs: [split_a, split_b], weights: {list(weights)}, stop: {stop}, "
                f"samples_per_epoch: {samples}}}\n"
                "  - {name: decode, type: decode}\n  - {name: batch, type: batch, batch_size: 4, partial: true}\n"
                + (f"  - {{name: sink, type: device_sink, npy_dir: {sink}}}\n" if sink else ""))
    return path


def input_order(name, urls, n, seed=5, epochs=1):
    """The order: global positions 0..n-1 of one source named name (passes after the first reshuffled), per
    epoch: one rank reading samples_per_epoch n, the reference for a mix's input."""
    out = os.path.join(tmp, "io_" + name)
    shutil.rmtree(out, ignore_errors=True)
    with open(os.path.join(tmp, f"io_{name}.yaml"), "w") as f:
        f.write(f"seed: {seed}\nepochs: {epochs}\nstages:\n  - {{name: {name}, type: shard_source, urls: \"{urls}\", "
                f"order: global, samples_per_epoch: {n}}}\n  - {{type: tar_split}}\n  - {{type: decode}}\n"
                f"  - {{type: batch, batch_size: 50, partial: true}}\n  - {{type: device_sink, npy_dir: {out}}}\n")
    run(["run", os.path.join(tmp, f"io_{name}.yaml"), "--quiet", "--no-summary"])
    per = {}
    for e, _, ks, _ in read_batches(out):
        per.setdefault(e, []).extend(ks)
    return per


mix_a, _, mix_a_keys = make_shards(os.path.join(tmp, "mix_a"), shards=3, per_shard=20, prefix="ma", tag="A")  # 60
mix_b, _, mix_b_keys = make_shards(os.path.join(tmp, "mix_b"), shards=2, per_shard=25, prefix="mb", tag="B")  # 50
run(["index", "-q", mix_a])
run(["index", "-q", mix_b])
references = (input_order("src_a", mix_a, 600, epochs=2), input_order("src_b", mix_b, 600, epochs=2))
mix_orders = {e: [o[e] for o in references] for e in (0, 1)}
check(sorted(mix_orders[0][0][:60]) == sorted(mix_a_keys) and mix_orders[0][0][:60] != mix_orders[0][0][60:120]
      and sorted(mix_orders[0][0][60:120]) == sorted(mix_a_keys), "an input's reference: its passes, each reshuffled")


def cli_mix(name, world, start=0, epochs=1, samples=45, stop="never"):
    """Each rank's batches of the mix of mix_a (weight 1) and mix_b (weight 3) through `shardflow run`, dealt in
    rounds of 4 (deal written in the graph), resumed at start (both sources' start). Per rank: {epoch: batches}."""
    per = []
    for r in range(world):
        out = os.path.join(tmp, f"{name}_r{r}")
        shutil.rmtree(out, ignore_errors=True)
        graph = mix_yaml(os.path.join(tmp, name + ".yaml"), mix_a, mix_b, (1, 3), samples, epochs=epochs, deal=4,
                         sink=out, stop=stop)
        extra = ["--set", f"src_a.start={start}", "--set", f"src_b.start={start}"] if start else []
        run(["run", graph, "--quiet", "--no-summary", "--rank", str(r), "--world-size", str(world)] + extra)
        got = {}
        for e, _, ks, _ in read_batches(out):
            got.setdefault(e, []).append(ks)
        per.append(got)
    return per


def per_pass_once(keys, which, totals, tag):
    """Each input's samples, cut into passes of its size, hold every sample at most once per pass."""
    for j, total in enumerate(totals):
        mine = [k for k, w in zip(keys, which) if w == j]
        passes = [mine[i:i + total] for i in range(0, len(mine), total)]
        check(all(len(set(p)) == len(p) for p in passes) and len(mine) > 0,
              f"{tag}: input {j}'s {len(mine)} samples: each at most once per pass of its {total}")


for world in (1, 2, 3):
    parts = cli_mix(f"cmix{world}", world, epochs=2)
    for e in (0, 1):
        model, which = mixed(5, (1, 3), mix_orders[e], 45 * world, epoch=e)
        got = [p.get(e, []) for p in parts]
        check(got == dealt(model, world, 4), f"CLI mix by position, {world} ranks, epoch {e}: each rank's batches are "
              f"the model's ({[b[:2] for b in got[0][:2]]} vs {[b[:2] for b in dealt(model, world, 4)[0][:2]]})")
        per_pass_once(model, which, (60, 50), f"CLI mix, {world} ranks, epoch {e}")
# resumed from a count: start = the mixed positions consumed, every rank goes on with the rest
model = mixed(5, (1, 3), mix_orders[0], 135)[0]
for world, start in ((2, 16), (3, 37), (1, 100)):
    got = [p.get(0, []) for p in cli_mix(f"cmixs{world}", world, start=start, samples=135 // world)]
    check(got == dealt(model[start:135 // world * world], world, 4),
          f"CLI mix resumed at {start} on {world} ranks: the rest of the model's positions")
# the weights hold: 1:3 over 4000 positions within 4 sigma
big_model, big_which = mixed(5, (1, 3), [o * 100 for o in mix_orders[0]], 4000)
n_b = sum(big_which)
check(abs(n_b - 3000) < 4 * (4000 * 0.75 * 0.25) ** 0.5, f"mix weights 1:3: input 1 drew {n_b} of 4000")
got = [k for b in cli_mix("cmixw", 1, samples=600)[0][0] for k in b]
n_b = sum(k[0] == "B" for k in got)
check(got == mixed(5, (1, 3), mix_orders[0], 600)[0] and abs(n_b - 450) < 4 * (600 * 0.1875) ** 0.5,
      f"...and the run's 600: {n_b} from input 1 (expected 450)")

# the plan's settings refused when written by hand where they cannot hold, naming what to do
p = run(["run", mix_yaml(os.path.join(tmp, "cmix_bad.yaml"), mix_a, mix_b, (1, 3), 45), "--quiet", "--set",
         "src_a.mix=mix"], check=False)
check(p.returncode != 0 and "mix \"mix\" goes with order: global, deal > 0" in p.stderr and "leave mix" in p.stderr,
      f"shard_source's mix written without deal is refused: {p.stderr[-300:]}")
p = run(["run", mix_yaml(os.path.join(tmp, "cmix_bad2.yaml"), mix_a, mix_b, (1, 3), 45, stop="longest", deal=4),
         "--quiet", "--set", "mix.deal=4"], check=False)
check(p.returncode != 0 and "stop: never" in p.stderr and "deal" in p.stderr,
      f"a mix told to deal by position with stop: longest is refused: {p.stderr[-300:]}")

# stop: first by position (the mix's default, no samples_per_epoch): the epoch ends before the first position
# that would draw an input past its dataset size, every rank and worker finding the same end from the draws
first_ends = {e: mix_end(5, (1, 3), (60, 50), epoch=e) for e in (0, 1)}
check(all(50 <= n < 110 for n in first_ends.values()) and first_ends[0] != first_ends[1],
      f"stop: first's model: each epoch ends by its own draws, within both inputs: {first_ends}")
first_models = {e: mixed(5, (1, 3), mix_orders[e], first_ends[e], epoch=e) for e in (0, 1)}
for world in (1, 2, 3):
    parts = cli_mix(f"cfirst{world}", world, epochs=2, samples=0, stop="first")
    for e in (0, 1):
        model, which = first_models[e]
        got = [p.get(e, []) for p in parts]
        check(got == dealt(model, world, 4), f"CLI mix stop: first by position, {world} ranks, epoch {e}: each rank's "
              f"batches are the model's, the epoch's {first_ends[e]} positions")
        keys = [k for part in got for b in part for k in b]
        check(sorted(k for k, w in zip(model, which) if w == 1) == sorted(mix_b_keys)
              and len(set(keys)) == len(keys) and set(keys) <= set(mix_a_keys) | set(mix_b_keys),
              f"...{world} ranks, epoch {e}: the shorter input's samples each exactly once, the other's at most once")
# samples_per_epoch with stop: first caps the epoch further (the rank's: 10 x ranks positions)
got = [p.get(0, []) for p in cli_mix("cfirstcap", 2, samples=10, stop="first")]
check(got == dealt(first_models[0][0][:20], 2, 4), "stop: first with samples_per_epoch 10 on 2 ranks: the first 20")
# resumed from a count near the epoch's end
start = first_ends[0] - 5
got = [p.get(0, []) for p in cli_mix("cfirsts", 3, start=start, samples=0, stop="first")]
check(got == dealt(first_models[0][0][start:], 3, 4), f"CLI stop: first resumed at {start} on 3 ranks: the rest")
# --explain says the mix deals by position
p = run(["run", mix_yaml(os.path.join(tmp, "cfirst_x.yaml"), mix_a, mix_b, (1, 3), 0, stop="first", deal=4),
         "--explain"])
check("deals by position" in p.stdout and "stop: first" in p.stdout and "src_a, src_b" in p.stdout,
      f"--explain names the mix by position: {p.stdout}")
p = run(["run", mix_yaml(os.path.join(tmp, "cfirst_x2.yaml"), mix_a, mix_b, (1, 3), 0, stop="first"), "--explain"])
check("deals by position" not in p.stdout, f"...and not for undealt inputs: {p.stdout}")

# ---- Python: state_dict() is a few integers; load_state_dict() resumes it at any world size ----
if os.environ.get("SF_SANITIZE", "none") == "none":  # the binding cannot load into python under a sanitizer
    import pickle
    sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
    os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
    import shardflow  # noqa: E402

    run(["index", "-q", small])  # the shard rewritten above
    graph = write_graph(os.path.join(tmp, "py.yaml"), [
        ("shard_source", dict(urls=small, order="global")), ("tar_split", {}), ("decode", {}),
        ("batch", dict(batch_size=4, partial=True))], seed=5)

    def epoch_keys(pipeline, batches=None):
        out = []
        for i, b in enumerate(pipeline):
            out += list(b["__key__"])
            if batches is not None and i + 1 == batches:
                break
        return out

    whole = epoch_keys(shardflow.Pipeline(graph, output="dict"))
    check(sorted(whole) == sorted(small_keys), "Python, 1 rank: every sample once")
    for old, steps, new in ((2, 3, 3), (3, 5, 1), (1, 20, 7), (7, 2, 2)):
        consumed, states = [], []
        for r in range(old):
            p = shardflow.Pipeline(graph, rank=r, world_size=old, output="dict")
            consumed += epoch_keys(p, steps)
            states.append(p.state_dict())
            p.close()
        blob = pickle.dumps(states[0])
        check(len(blob) < 1024, f"state_dict pickles to {len(blob)} bytes (< 1 KB)")
        check(all(st["consumed"] == steps * 4 * old for st in states), f"consumed counts all ranks: {states[0]}")
        rest = []
        for r in range(new):
            p = shardflow.Pipeline(graph, rank=r, world_size=new, output="dict")
            p.load_state_dict(states[-1])  # any one rank's state: they say the same
            if r == 0:
                part = epoch_keys(p, 1)
                check(p.state_dict()["consumed"] == steps * 4 * old + 4 * new, "consumed goes on counting")
                p.load_state_dict(p.state_dict())
                part += epoch_keys(p)
            else:
                part = epoch_keys(p)
            rest += part
            p.close()
        check(sorted(consumed + rest) == sorted(small_keys), f"Python {old} -> {new} ranks after {steps} steps: "
              "every sample once")
        check(set(consumed) == set(whole[:steps * 4 * old]), "the consumed samples are the permutation's first")

    # ---- DataLoader workers: the rank's batches come from its workers in turn (DataLoader's round robin) ----
    def loader(graph, rank, world, workers, state=None, take=None, sources=("shard_source",), **kw):
        """One rank's batches as a DataLoader of `workers` workers yields them (round robin over the workers'
        pipelines: shard_source workers / worker, on each of the sources), each a list of keys; take: stop after
        that many, returning (batches, each worker's state_dict() at that point)."""
        split = lambda w: {f"{s}__{o}": v for s in sources for o, v in (("workers", workers), ("worker", w))}  # noqa
        pipes = [shardflow.Pipeline(graph, rank=rank, world_size=world, output="dict", **split(w), **kw)
                 for w in range(workers)]
        if state is not None:
            for p in pipes:
                p.load_state_dict(state)
        its = [iter(p) for p in pipes]
        out, t = [], 0
        while take is None or t < take:
            b = next(its[t % workers], None)
            if b is None:
                left = [w for w in range(workers) if w != t % workers and next(its[w], None) is not None]
                check(not left, f"workers {left} still had batches when worker {t % workers} was done")
                break
            out.append(list(b["__key__"]))
            t += 1
        states = [p.state_dict() for p in pipes]
        for p in pipes:
            p.close()
        return out, states

    def resume_case(graph, epoch_order, cases, batch, tag, **kw):
        """epoch_order(world): the positions of an epoch at that world size (samples_per_epoch x ranks)."""
        for old, ow, k, new, nw in cases:
            order = epoch_order(old)
            eaten, states = [], []
            for r in range(old):
                got, st = loader(graph, r, old, ow, take=k, **kw)
                check(got == dealt(order, old, batch)[r][:k], f"{tag}: rank {r} of {old}, {ow} workers: the model's batches")
                eaten += [key for b in got for key in b]
                states += st
            # The rank's state: the worker whose round is next has the least count (the same on every rank).
            state = min(states, key=lambda s: s["consumed"])
            check(state["consumed"] == k * batch * old and len(pickle.dumps(state)) < 1024,
                  f"{tag}: the least worker count is every rank's k x B x ranks: {state}")
            check(set(eaten) == set(order[:k * batch * old]), f"{tag}: k batches of every rank are the order's first")
            order = epoch_order(new)  # the epoch resumed in the new world: its size there
            rest, model = [], dealt(order[k * batch * old:], new, batch)
            for r in range(new):
                got = loader(graph, r, new, nw, state=state, **kw)[0]
                check(got == model[r], f"{tag}: {old}x{ow} -> {new}x{nw} after {k}: rank {r} goes on as the model "
                      f"({[b[:2] for b in got[:2]]} vs {[b[:2] for b in model[r][:2]]})")
                rest += [key for b in got for key in b]
            check(sorted(eaten + rest) == sorted(order), f"{tag}: {old} ranks x {ow} workers -> {new} x {nw} after "
                  f"{k} batches: every sample of the epoch exactly once")

    cases = ((1, 1, 5, 2, 2), (2, 2, 3, 3, 3), (3, 3, 2, 1, 1), (2, 3, 4, 1, 2), (3, 2, 1, 2, 3), (1, 2, 69, 3, 1))
    resume_case(graph, lambda world: whole, cases, 4, "workers")
    # samples_per_epoch (the rank's, 45: not whole batches) and decode in a group of worker processes
    spe = write_graph(os.path.join(tmp, "py_spe.yaml"), [
        ("shard_source", dict(urls=small, order="global", samples_per_epoch=45)), ("tar_split", {}), ("decode", {}),
        ("batch", dict(batch_size=4, partial=True))], seed=5)
    first = loader(spe, 0, 2, 1)[0] + loader(spe, 1, 2, 1)[0]
    check(sorted(len(b) for b in first) == [1] * 2 + [4] * 22, "samples_per_epoch 45 on 2 ranks: 11 batches and 1")
    spe_order = [key for b in loader(spe, 0, 1, 1, samples_per_epoch=135)[0] for key in b]
    resume_case(spe, lambda world: spe_order[:45 * world], ((2, 1, 4, 3, 2), (2, 2, 5, 1, 3)), 4, "samples_per_epoch")
    grouped = write_graph(os.path.join(tmp, "py_group.yaml"), [
        ("shard_source", dict(urls=small, order="global")), ("tar_split", {}), ("decode", dict(group="decoders")),
        ("batch", dict(batch_size=4, partial=True))], groups={"decoders": {"processes": 2, "unit_samples": 8}}, seed=5)
    resume_case(grouped, lambda world: whole, ((2, 2, 5, 3, 1),), 4, "group")

    # order: block (whole blocks of 5, dealt in rounds of the batch size): resumes at any layout too
    blocked = write_graph(os.path.join(tmp, "py_block.yaml"), [
        ("shard_source", dict(urls=small, order="block", block_size=5)), ("tar_split", {}), ("decode", {}),
        ("batch", dict(batch_size=4, partial=True))], seed=5)
    block_order = [key for b in loader(blocked, 0, 1, 1)[0] for key in b]
    at = {k: i for i, k in enumerate(small_keys)}
    runs = sum(at[block_order[i + 1]] == at[block_order[i]] + 1 for i in range(len(block_order) - 1))
    check(runs >= 0.75 * len(block_order) and block_order != small_keys,
          f"order: block in Python: blocks of consecutive samples in a seeded order ({runs} steps of +1)")
    resume_case(blocked, lambda world: block_order, ((2, 2, 3, 3, 1), (1, 1, 7, 2, 3)), 4, "block")

    # mix by position (stop: never, samples_per_epoch, inputs order: global): its state is a count of mixed
    # positions, and it resumes at any world size and workers as the model of its draws says
    py_mix = mix_yaml(os.path.join(tmp, "py_mix_never.yaml"), mix_a, mix_b, (1, 3), 45)
    mix_model = mixed(5, (1, 3), mix_orders[0], 600)[0]
    resume_case(py_mix, lambda world: mix_model[:45 * world],
                ((1, 1, 3, 2, 2), (1, 1, 11, 2, 2), (2, 1, 2, 3, 2), (2, 1, 5, 3, 2), (3, 2, 1, 1, 1), (3, 2, 3, 1, 1)),
                4, "mix", sources=("src_a", "src_b"))
    # ...with decode in a group of worker processes
    py_mix_group = os.path.join(tmp, "py_mix_group.yaml")
    with open(py_mix_group, "w") as f:
        f.write("groups:\n  decoders: {processes: 2, unit_samples: 8}\n" + open(py_mix).read().replace(
            "{name: decode, type: decode}", "{name: decode, type: decode, group: decoders}"))
    resume_case(py_mix_group, lambda world: mix_model[:45 * world], ((2, 2, 3, 3, 1),), 4, "mix in a group",
                sources=("src_a", "src_b"))

    # mix with stop: first by position (no samples_per_epoch: the epoch ends where an input would run out): its
    # state is a count too, resumed at any layout, from early and near the epoch's end (its end is ~first_ends[0])
    py_first = mix_yaml(os.path.join(tmp, "py_mix_first.yaml"), mix_a, mix_b, (1, 3), 0, stop="first")
    resume_case(py_first, lambda world: first_models[0][0],
                ((1, 1, 3, 2, 2), (1, 1, (first_ends[0] - 1) // 4, 2, 2), (3, 2, 1, 1, 1),
                 (3, 2, (first_ends[0] - 1) // 12, 1, 1)), 4, "mix stop: first", sources=("src_a", "src_b"))
    # ...a state saved after its last batch resumes with the next epoch, whose end is its own
    p = shardflow.Pipeline(py_first, output="dict")
    batches = iter(p)
    whole0 = [k for _ in range((first_ends[0] + 3) // 4) for k in next(batches)["__key__"]]
    state = p.state_dict()
    p.close()
    check(whole0 == first_models[0][0] and state["consumed"] >= first_ends[0],
          f"stop: first in Python: the model's epoch, saved after its last batch: {state}")
    q = shardflow.Pipeline(py_first, output="dict")
    q.load_state_dict(state)
    check(epoch_keys(q) == first_models[1][0], "...resumes with epoch 1, the model's")
    q.close()
    # mix with stop: longest (an exhausted input's positions would leave holes in the dealt rounds): refused
    # with the reason
    mixed_longest = mix_yaml(os.path.join(tmp, "py_mix.yaml"), small, small, (1, 1), 0, stop="longest")
    p = shardflow.Pipeline(mixed_longest, output="dict")
    epoch_keys(p, 2)
    st = p.state_dict()
    check("consumed" not in st, f"a mix's state holds no count: {st}")
    try:
        p.load_state_dict(dict(st, consumed=8))
        check(False, "a count of consumed samples is refused for a mix")
    except ValueError as e:
        check("mix" in str(e) and "draws" in str(e) and "stop: longest" in str(e),
              f"...naming the mix, its draws and its stop policy: {e}")
    p.close()

    # A state saved after the epoch's last batch resumes with the next epoch (not an empty one).
    p = shardflow.Pipeline(graph, output="dict")
    batches = iter(p)
    for _ in range((len(small_keys) + 3) // 4):
        next(batches)
    state = p.state_dict()
    p.close()
    check(state["epoch"] == 0 and state["consumed"] >= len(small_keys), f"saved at the end of epoch 0: {state}")
    p = shardflow.Pipeline(graph, output="dict")
    whole1 = (epoch_keys(p), epoch_keys(p))[1]
    p.close()
    q = shardflow.Pipeline(graph, output="dict")
    q.load_state_dict(state)
    check(epoch_keys(q) == whole1 and whole1 != whole, "...resumes with epoch 1, as the uninterrupted run")
    q.close()

    # The iterable form's state through torchdata's Stateful protocol, as a StatefulDataLoader drives it in
    # each worker: state_dict() mid-iteration, load_state_dict() into a fresh copy, the rest follows exactly.
    try:
        import shardflow.torch as sft
        for extra in ({}, {"shard_source__workers": 2, "shard_source__worker": 1}):  # a DataLoader worker's split
            ds = sft.PipelineDataset(graph, output="dict", **extra)
            full_run = [list(b["__key__"]) for b in ds]
            it = iter(ds)
            head = [list(next(it)["__key__"]) for _ in range(3)]
            state = ds.state_dict()
            it.close()
            ds2 = sft.PipelineDataset(graph, output="dict", **extra)
            ds2.load_state_dict(pickle.loads(pickle.dumps(state)))
            rest = [list(b["__key__"]) for b in ds2]
            check(head + rest == full_run, f"PipelineDataset state_dict/load_state_dict ({extra or 'no workers'}): "
                  "the iteration goes on exactly")
        # A real DataLoader of 3 workers, its rank's state from the trainer's count, resumed with 2 workers.
        import torch.utils.data
        ds = sft.PipelineDataset(graph, output="dict")
        it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=3))
        head = [list(next(it)["__key__"]) for _ in range(5)]
        del it
        state = ds.state_dict(batches=5)
        check(head == dealt(whole, 1, 4)[0][:5] and state["pipeline"]["consumed"] == 20,
              f"DataLoader, 3 workers: the model's batches, and the rank's state counts 20: {state}")
        ds2 = sft.PipelineDataset(graph, output="dict")
        ds2.load_state_dict(pickle.loads(pickle.dumps(state)))
        rest = [list(b["__key__"]) for b in torch.utils.data.DataLoader(ds2, batch_size=None, num_workers=2)]
        check(rest == dealt(whole[20:], 1, 4)[0], "...resumed by a DataLoader of 2 workers: the rest, in order")
        check(ds2.state_dict(batches=3)["pipeline"]["consumed"] == 32, "...whose count goes on from the loaded one")
        # samples_per_epoch 6 in batches of 4 (2 batches) and 3 workers: the third has no round and yields none.
        ds = sft.PipelineDataset(spe, output="dict", samples_per_epoch=6)
        got = [list(b["__key__"]) for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=3)]
        check(got == dealt(spe_order[:6], 1, 4)[0] and len(ds) == 2, f"3 workers, 2 batches an epoch: {got}")
        # Without samples_per_epoch the dataset's 10 samples make 3 batches of 4: the fourth worker has no round and
        # yields none (the epoch's size comes from the indexes), every sample once.
        tiny, _, tiny_keys = make_shards(os.path.join(tmp, "tiny"), shards=1, per_shard=10, prefix="t")
        run(["index", "-q", tiny])
        tiny_graph = write_graph(os.path.join(tmp, "py_tiny.yaml"), [
            ("shard_source", dict(urls=tiny, order="global")), ("tar_split", {}), ("decode", {}),
            ("batch", dict(batch_size=4, partial=True))], seed=5)
        got = [list(b["__key__"]) for b in torch.utils.data.DataLoader(
            sft.PipelineDataset(tiny_graph, output="dict"), batch_size=None, num_workers=4)]
        check(len(got) == 3 and sorted(k for b in got for k in b) == sorted(tiny_keys),
              f"4 workers, 3 batches an epoch, no samples_per_epoch: every sample once: {got}")
        # A mix by position in a DataLoader: its inputs split alike over the workers, resumed by the rank's count
        ds = sft.PipelineDataset(py_mix, output="dict")
        it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=3))
        head = [list(next(it)["__key__"]) for _ in range(4)]
        del it
        state = ds.state_dict(batches=4)
        check(head == dealt(mix_model[:45], 1, 4)[0][:4] and state["pipeline"]["consumed"] == 16 and len(ds) == 12,
              f"DataLoader over a mix, 3 workers: the model's batches, a count of 16, 12 batches an epoch: {state}")
        ds2 = sft.PipelineDataset(py_mix, output="dict")
        ds2.load_state_dict(pickle.loads(pickle.dumps(state)))
        rest = [list(b["__key__"]) for b in torch.utils.data.DataLoader(ds2, batch_size=None, num_workers=2)]
        check(rest == dealt(mix_model[16:45], 1, 4)[0], "...resumed by a DataLoader of 2 workers: the mix's rest")
    except ImportError:
        pass

    # A map-style Dataset: len() from the indexes, ds[i] = sample i of the shards in list order, decoded.
    seq_graph = write_graph(os.path.join(tmp, "ds.yaml"), [
        ("shard_source", dict(urls=small)), ("tar_split", {}), ("decode", {}), ("shuffle", dict(buffer_size=50)),
        ("batch", dict(batch_size=6, partial=False))], seed=5)
    ds = shardflow.Dataset(seq_graph)
    check(len(ds) == len(small_keys), f"len(Dataset) is the dataset's samples: {len(ds)}")
    for i in (0, 1, 34, 35, 279, -1):
        row = ds[i]
        check(row["__key__"] == small_keys[i] and int(row["cls"]) == int(small_keys[i].split("_")[1]) % 10,
              f"ds[{i}] is sample {i} of the shards: {row['__key__']}")
    picks = [200, 3, 77, 3, 150, 9, 10, 11]
    rows = ds.__getitems__(picks)
    check([r["__key__"] for r in rows] == [small_keys[i] for i in picks], "__getitems__ keeps the order asked")
    try:
        ds[len(ds)]
        check(False, "an index past the end raises IndexError")
    except IndexError:
        pass
    try:
        import torch
        # Batches of indices reach the dataset whole (one pass of the graph each): torch >= 2 calls
        # __getitems__ on its own; this form works with every version.
        sampler = torch.utils.data.BatchSampler(
            torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)), 32, False)
        loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, collate_fn=lambda rows: rows)
        seen = [r["__key__"] for rows in loader for r in rows]
        check(sorted(seen) == sorted(small_keys) and seen != small_keys,
              "DataLoader(Dataset, shuffle=True): every sample once, shuffled")
    except ImportError:
        pass

check.done("index")
shutil.rmtree(tmp)
