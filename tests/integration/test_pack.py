"""pack: documents of a token field (npy members after decode) packed into samples of exactly `length` tokens.
Every output sample (tokens, segment_ids, positions, cu_seqlens, key) equals an independent numpy model of the
documented rule (a buffer of `buffer` pieces, first-fit-decreasing, bins in opening order, pieces in arrival
order); split and truncate counted; pad_id; the fill ratio on 10,000 documents; the same output in two runs and
with replicas on decode; resumption at 8 positions (epoch, step) equals the tail of the full run; after a mix of two
sources (the mix's order read from the same graph without pack); a FIELD.length scalar cuts documents; bad documents are
error records naming shard and key; bad options are refused with file:line."""
import atexit
import io
import os
import re
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, stage_table, write_shard, yaml_value  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-pack-")
atexit.register(shutil.rmtree, tmp, True)  # on failure too


def npy(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


NEXT_TOKEN = [1]


def corpus(prefix, shards, per_shard, lengths, dtype=np.int32, seed=0):
    """Shards PREFIX-NNN.tar of KEY.npy documents, lengths drawn by lengths(rng); every token id is unique (a
    running counter), so a token names its document and position. Returns (url pattern, [(key, array)] in
    shard order)."""
    rng = np.random.default_rng(seed)
    docs = []
    for s in range(shards):
        members = []
        for i in range(per_shard):
            n = int(lengths(rng))
            arr = np.arange(NEXT_TOKEN[0], NEXT_TOKEN[0] + n, dtype=dtype)
            NEXT_TOKEN[0] += n
            key = f"{prefix}{s:03d}-{i:05d}"
            docs.append((key, arr))
            members.append((key, {"npy": npy(arr)}))
        write_shard(os.path.join(tmp, f"{prefix}-{s:03d}.tar"), members)
    return os.path.join(tmp, f"{prefix}-{{000..{shards - 1:03d}}}.tar"), docs


def reference(docs, length, buffer, overflow="split", pad_id=0):
    """The documented rule, written plainly: documents (empty ones dropped, long ones split into `length`-token
    pieces or truncated) fill a buffer of `buffer` pieces; a full buffer (and the last one) is packed
    first-fit-decreasing (longest first, ties in arrival order, into the first opened bin with room); bins leave
    in the order they were opened, each with its pieces in arrival order."""
    out, pieces = [], []

    def flush():
        room, bin_of = [], [0] * len(pieces)
        for i in sorted(range(len(pieces)), key=lambda i: (-len(pieces[i][1]), i)):
            n = len(pieces[i][1])
            b = next((b for b, r in enumerate(room) if r >= n), len(room))
            if b == len(room):
                room.append(length)
            room[b] -= n
            bin_of[i] = b
        for b in range(len(room)):
            members = [pieces[i] for i in range(len(pieces)) if bin_of[i] == b]
            tokens = np.full(length, pad_id, dtype=np.int64)
            seg = np.zeros(length, dtype=np.int32)
            pos = np.zeros(length, dtype=np.int32)
            cu, at = [0], 0
            for j, (_, arr) in enumerate(members):
                tokens[at:at + len(arr)] = arr
                seg[at:at + len(arr)] = j + 1
                pos[at:at + len(arr)] = np.arange(len(arr))
                at += len(arr)
                cu.append(at)
            out.append(dict(key=members[0][0], tokens=tokens, seg=seg, pos=pos, cu=np.array(cu, dtype=np.int32)))
        pieces.clear()

    for key, arr in docs:
        if overflow == "truncate":
            arr = arr[:length]
        for start in range(0, len(arr), length):
            pieces.append((key, arr[start:start + length]))
            if len(pieces) == buffer:
                flush()
    flush()
    return out


def graph(name, urls, pack, decode=None, batch_size=8, cu=False, before=(), source=None, **settings):
    """shard_source -> tar_split -> decode -> (before) -> pack -> batch -> device_sink into tmp/name."""
    out = os.path.join(tmp, name)
    shutil.rmtree(out, ignore_errors=True)
    opts = lambda d: "".join(f"\n    {k}: {yaml_value(v)}" for k, v in (d or {}).items())  # noqa: E731
    lines = [f"{k}: {yaml_value(v)}" for k, v in dict(dict(seed=3, epochs=1), **settings).items()] + [
        "stages:",
        f"  - type: shard_source\n    urls: \"{urls}\"{opts(dict(dict(shuffle=False), **(source or {})))}",
        "  - type: tar_split",
        f"  - type: decode{opts(decode)}",
        *before,
    ]
    if pack is not None:
        lines.append(f"  - type: pack{opts(dict(dict(field='npy'), **pack))}")
        ragged = "\n    ragged: npy.cu_seqlens" if cu else ""
    else:
        ragged = "\n    ragged: npy"
    lines += [f"  - type: batch\n    batch_size: {batch_size}\n    partial: true{ragged}",
              f"  - type: device_sink\n    npy_dir: {out}"]
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, out


def samples(out, epoch=None):
    """The packed samples the sink dumped, in order: [dict(key, tokens, seg, pos, cu, epoch, batch)]."""
    got = []
    for e, b, keys, fields in read_batches(out):
        if epoch is not None and e != epoch:
            continue
        for j, key in enumerate(keys):
            s = dict(key=key, tokens=fields["npy"][j], seg=fields["npy.segment_ids"][j],
                     pos=fields["npy.positions"][j], epoch=e, batch=b)
            if "npy.cu_seqlens" in fields:
                off = fields["npy.cu_seqlens.offsets"]
                s["cu"] = fields["npy.cu_seqlens"][off[j]:off[j + 1]]
            got.append(s)
    return got


def compare(tag, got, want, cu=False, dtype=np.int32):
    check(len(got) == len(want), f"{tag}: {len(got)} samples, the model makes {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        same = (g["key"] == w["key"] and g["tokens"].dtype == dtype and np.array_equal(g["tokens"], w["tokens"])
                and g["seg"].dtype == np.int32 and np.array_equal(g["seg"], w["seg"])
                and g["pos"].dtype == np.int32 and np.array_equal(g["pos"], w["pos"])
                and (not cu or (g["cu"].dtype == np.int32 and np.array_equal(g["cu"], w["cu"]))))
        if not same:
            raise AssertionError(f"{tag}: sample {i} differs from the model:\n got key {g['key']} "
                                 f"tokens {g['tokens'][:12]}... seg {g['seg'][:12]}... pos {g['pos'][:12]}... "
                                 f"cu {g.get('cu')}\nwant key {w['key']} tokens {w['tokens'][:12]}... "
                                 f"seg {w['seg'][:12]}... pos {w['pos'][:12]}... cu {w['cu']}")
    check(True, f"{tag}: every sample equals the model")


def run_graph(path, *extra):
    return run(["run", path, "--quiet"] + list(extra))


# 1. 10,000 documents of 1..1024 tokens, a few up to 5000 (split), some empty (dropped, counted as filtered),
# length 2048, buffer 1000: every sample equals the model, every token once in order, the fill ratio >= 0.97,
# and the counters (documents, split_documents, tokens, slots) in the stage table and --stats-json.
def big_length(rng):
    u = rng.random()
    return 0 if u < 0.01 else int(rng.integers(2049, 5000)) if u < 0.03 else int(rng.integers(1, 1025))


BIG, big_docs = corpus("big", 10, 1000, big_length, seed=1)
path, out = graph("big", BIG, dict(length=2048, buffer=1000, cu_seqlens=True), cu=True, batch_size=16)
stats = os.path.join(tmp, "big.jsonl")
p = run_graph(path, "--stats-json", stats)
got, want = samples(out), reference(big_docs, 2048, 1000)
compare("10,000 documents, length 2048, buffer 1000", got, want, cu=True)
real = np.concatenate([s["tokens"][s["seg"] > 0] for s in got])
check(np.array_equal(np.sort(real), np.concatenate([a for _, a in big_docs])),
      "every token of the corpus exactly once (ids are unique and rise through the corpus)")
check(all(np.all(np.diff(s["tokens"][s["seg"] == k]) == 1) for s in got[:200] for k in range(1, s["seg"].max() + 1)),
      "each segment's tokens in their document's order")
n_tokens = sum(len(a) for _, a in big_docs)
fill = n_tokens / (len(got) * 2048)
check(fill >= 0.97, f"fill ratio {fill:.4f} >= 0.97 with a buffer of 1,000")
n_empty = sum(len(a) == 0 for _, a in big_docs)
n_split = sum(len(a) > 2048 for _, a in big_docs)
want_counters = {"documents": len(big_docs) - n_empty, "split_documents": n_split, "tokens": n_tokens,
                 "slots": len(got) * 2048}
row = stage_table(p.stderr).get("pack", {})
check(row.get("counters") == want_counters and row.get("filtered") == n_empty and row.get("items") == len(got),
      f"the stage table's pack row: {row}, want counters {want_counters}, filtered {n_empty}, items {len(got)}")
final = [__import__("json").loads(line) for line in open(stats)][-1]
node = next(n for n in final["nodes"] if n["name"] == "pack")
check(node.get("counters") == want_counters, f"--stats-json's pack counters: {node.get('counters')}")
m = re.search(r"shardflow: pack: epoch 0: (\d+) documents \((\d+) split\) packed into (\d+) samples of 2048 tokens, "
              r"fill ratio ([0-9.]+) \(tokens / slots\)", p.stderr)
check(m and (int(m[1]), int(m[2]), int(m[3])) == (len(big_docs) - n_empty, n_split, len(got))
      and abs(float(m[4]) - fill) < 1e-4, f"the epoch's account line: {m and m[0]}, fill {fill:.4f}")

# 2. A small corpus, documents around the length: split vs truncate (counts), pad_id, int64 output.
SMALL, small_docs = corpus("small", 3, 60, lambda rng: int(rng.integers(1, 300)), seed=2)
n_long = sum(len(a) > 128 for _, a in small_docs)
check(n_long > 10, f"the small corpus has documents longer than 128: {n_long}")
for overflow, pad_id, dtype in (("split", 0, "int32"), ("truncate", -7, "int64")):
    tag = f"overflow {overflow}, pad_id {pad_id}, dtype {dtype}"
    path, out = graph(f"small-{overflow}", SMALL, dict(length=128, buffer=17, overflow=overflow, pad_id=pad_id,
                                                       dtype=dtype, cu_seqlens=True), cu=True)
    p = run_graph(path)
    got = samples(out)
    compare(tag, got, reference(small_docs, 128, 17, overflow, pad_id), cu=True,
            dtype=np.int32 if dtype == "int32" else np.int64)
    check(all(np.all(s["tokens"][s["seg"] == 0] == pad_id) for s in got) and any((s["seg"] == 0).any() for s in got),
          f"{tag}: padding is pad_id")
    counters = stage_table(p.stderr)["pack"]["counters"]
    check(counters.get(f"{'split' if overflow == 'split' else 'truncated'}_documents") == n_long,
          f"{tag}: {n_long} long documents counted: {counters}")
    if overflow == "truncate":
        check(counters["tokens"] == sum(min(len(a), 128) for _, a in small_docs), f"{tag}: tokens cut: {counters}")

# 3. Deterministic: two runs, and decode with 3 replicas, give the same samples (those of the model).
path, out = graph("replicas", SMALL, dict(length=128, buffer=17), decode=dict(replicas=3))
run_graph(path)
compare("decode replicas: 3", samples(out), reference(small_docs, 128, 17))
path, out = graph("twice", SMALL, dict(length=128, buffer=17))
run_graph(path)
first = samples(out)
shutil.rmtree(out)
run_graph(path)
compare("the same graph twice", samples(out), first)

# 4. Resume: two epochs of shuffled shards and a shuffle stage before pack; --start-epoch/--start-step give the
# full run's batches from that point, and the first epoch's output is a function of its input order alone.
before = ["  - type: shuffle\n    buffer_size: 50"]
path, out = graph("resume", SMALL, dict(length=128, buffer=17), batch_size=4, before=before,
                  source=dict(shuffle=True), epochs=2)
run_graph(path)
full = {(e, b): (keys, f) for e, b, keys, f in read_batches(out)}
per_epoch = max(b for (e, b) in full if e == 0) + 1
check(per_epoch >= 6 and any(e == 1 for e, _ in full), f"the full run: {per_epoch} batches in epoch 0, and epoch 1")
check([full[k][0] for k in sorted(full) if k[0] == 0] != [full[k][0] for k in sorted(full) if k[0] == 1],
      "the two epochs differ (shuffled)")
last = max(b for (e, b) in full if e == 1) + 1
for epoch, step in ((0, 1), (0, 2), (0, per_epoch // 2), (0, per_epoch - 1), (0, per_epoch), (1, 0), (1, 1),
                    (1, last // 2)):
    shutil.rmtree(out)
    run_graph(path, "--start-epoch", str(epoch), "--start-step", str(step))
    resumed = {(e, b): (keys, f) for e, b, keys, f in read_batches(out)}
    expect = {k: v for k, v in full.items() if k >= (epoch, step)}
    check(sorted(resumed) == sorted(expect), f"resume at ({epoch}, {step}): the same batches follow")
    check(all(resumed[k][0] == expect[k][0] and all(np.array_equal(resumed[k][1][n], expect[k][1][n])
                                                    for n in expect[k][1]) for k in expect),
          f"resume at ({epoch}, {step}): identical keys and tokens")

# 5. After a mix of two sources: the mix's order, read from the same graph without pack (the draws depend on the
# seed and the node's name only), packed by the model, equals pack's output.
OTHER, other_docs = corpus("other", 2, 50, lambda rng: int(rng.integers(1, 200)), seed=5)


def mix_graph(name, pack):
    out = os.path.join(tmp, name)
    shutil.rmtree(out, ignore_errors=True)
    tail = (["  - {type: pack, field: npy, length: 256, buffer: 23}", "  - {type: batch, batch_size: 4}"] if pack
            else ["  - {type: batch, batch_size: 4, ragged: npy}"])
    lines = ["seed: 9", "epochs: 1", "stages:",
             f"  - {{name: src_a, type: shard_source, urls: \"{SMALL}\", shuffle: false}}",
             "  - {name: split_a, type: tar_split}",
             f"  - {{name: src_b, type: shard_source, urls: \"{OTHER}\", shuffle: false}}",
             "  - {name: split_b, type: tar_split}",
             "  - {name: mix, type: mix, inputs: [split_a, split_b], weights: [0.6, 0.4], stop: longest}",
             "  - {type: decode}", *tail, f"  - {{type: device_sink, npy_dir: {out}}}"]
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    run_graph(path)
    return out


order = [k for _, _, keys, _ in read_batches(mix_graph("mix-order", False)) for k in keys]
by_key = dict(small_docs + other_docs)
check(sorted(order) == sorted(by_key) and order[:len(small_docs)] != [k for k, _ in small_docs],
      "the mix takes every document of both sources once, interleaved")
compare("after a mix", samples(mix_graph("mix-pack", True)), reference([(k, by_key[k]) for k in order], 256, 23))

# 6. FIELD.length: only the first FIELD.length tokens of a document count (tokenize's padded output). npz members
# with arrays t and t.length decode to fields npz.t and npz.t.length.
rng = np.random.default_rng(6)
padded, cut = [], []
for i in range(40):
    n = int(rng.integers(0, 90))
    arr = np.full(64, 3, dtype=np.int32)
    arr[:min(n, 64)] = np.arange(100 * i, 100 * i + min(n, 64))
    buf = io.BytesIO()
    np.savez(buf, **{"t": arr, "t.length": np.int64(n)})
    padded.append((f"t{i:03d}", {"npz": buf.getvalue()}))
    cut.append((f"t{i:03d}", arr[:min(n, 64)]))
write_shard(os.path.join(tmp, "padded-000.tar"), padded)
path, out = graph("length-field", os.path.join(tmp, "padded-000.tar"), dict(field="npz.t", length=100, buffer=9))
p = run_graph(path)
got = [dict(key=k, tokens=f["npz.t"][j], seg=f["npz.t.segment_ids"][j], pos=f["npz.t.positions"][j])
       for _, _, keys, f in read_batches(out) for j, k in enumerate(keys)]
compare("FIELD.length cuts each document", got, reference(cut, 100, 9))
check(stage_table(p.stderr)["pack"]["filtered"] == sum(len(a) == 0 for _, a in cut), "empty documents: filtered")

# 7. Bad documents: a float32 array, a 2-D array, an int64 id past int32, a sample without the field, and an
# encoded field (no decode): error records naming the shard and the key; the rest packed as the model says.
good = [(f"g{i:02d}", np.arange(1000 * i, 1000 * i + 5 + i, dtype=np.int32)) for i in range(12)]
bad = {"badfloat": {"npy": npy(np.ones(5, dtype=np.float32))},
       "bad2d": {"npy": npy(np.ones((2, 3), dtype=np.int32))},
       "badbig": {"npy": npy(np.array([1, 2**40], dtype=np.int64))},
       "badnone": {"cls": b"3"}}
members = [(k, {"npy": npy(a)}) for k, a in good[:6]] + list(bad.items()) + [(k, {"npy": npy(a)}) for k, a in good[6:]]
bad_shard = write_shard(os.path.join(tmp, "bad-000.tar"), members)
path, out = graph("bad", bad_shard, dict(length=32, buffer=5), error_policy="skip")
p = run_graph(path)
compare("bad documents skipped", samples(out), reference(good, 32, 5))
for key, needle in (("badfloat", "is float32: pack takes integer token ids"), ("bad2d", "is a 2-D array"),
                    ("badbig", "holds token id 1099511627776 at position 1, which does not fit"),
                    ("badnone", "has no field 'npy'")):
    line = next((l for l in p.stderr.splitlines() if f"key {key}" in l), "")
    check(bad_shard in line and needle in line and "pack" in line, f"{key}: the error names shard and key: {line!r}")
check(stage_table(p.stderr)["pack"]["skipped"] == 4, "4 documents skipped")
# error_policy fail stops at the first bad document, with documents in the buffer and packed ones queued.
text = open(path).read().replace("error_policy: skip", "error_policy: fail")
with open(path, "w") as f:
    f.write(text)
p = run(["run", path, "--quiet", "--no-summary"], check=False)
check(p.returncode != 0 and "key badfloat" in p.stderr and "Sanitizer" not in p.stderr,
      f"error_policy fail stops at the float32 document: {p.returncode} {p.stderr}")
path, out = graph("encoded", bad_shard, dict(length=32), decode=None, error_policy="fail")
text = open(path).read().replace("  - type: decode\n", "")
with open(path, "w") as f:
    f.write(text)
p = run(["run", path, "--quiet", "--no-summary"], check=False)
check(p.returncode != 0 and "Sanitizer" not in p.stderr and f"{bad_shard} " in p.stderr and "key g00" in p.stderr
      and "field 'npy' is still encoded bytes" in p.stderr, f"an encoded field stops a fail run: {p.stderr}")

# 8. Options: refused with the graph file's line, the option named and what to write.
def refused(option_line, line, *needles):
    field = "" if "field:" in option_line else "    field: npy\n"
    text = (f"stages:\n  - type: shard_source\n    urls: {bad_shard}\n    shuffle: false\n  - type: tar_split\n"
            f"  - type: decode\n  - type: pack\n{field}{option_line}\n  - type: batch\n  - type: device_sink\n")
    path = os.path.join(tmp, "opt.yaml")
    with open(path, "w") as f:
        f.write(text)
    p = run(["run", path, "--quiet", "--no-summary"], check=False)
    named = all(n in p.stderr for n in needles) and (line is None or f"{path}:{line}" in p.stderr)
    check(p.returncode != 0 and "Sanitizer" not in p.stderr and named,
          f"{option_line.strip()}: refused with {needles}, line {line}: {p.returncode} {p.stderr}")


refused("    length: 0", 9, "length")
refused("    overflow: wrap", 9, "overflow", "split", "truncate")
refused("    buffer: -3", 9, "buffer")
refused("    pad_id: 4000000000", 9, "pad_id")
refused("    dtype: float32", 9, "dtype", "int32", "int64")
refused("    field: averyveryverylongname", None, "option field", "too long", "rename")

check.done("pack")
