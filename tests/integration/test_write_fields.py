#!/usr/bin/python3
"""`shardflow write` of any fields, checked with Python's tarfile against the inputs.

A directory of KEY.EXT files (--layout files): every KEY is one sample, its members KEY.EXT in sorted
order, bytes equal to the files; names without an extension and hidden files are skipped. A JSON-lines
manifest: file paths relative to the manifest, {"inline": "text"} as UTF-8, {"inline": {...}} as
JSON that json.loads reads back equal; manifest order with --no-shuffle, the same samples (each
sample's members together) when shuffled, --maxcount splitting shards. Errors name the manifest line
and the field: a missing file, a duplicate key, a line that is not JSON, a value that is neither.
"""
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sfutil import Checks, run  # noqa: E402

TMP = tempfile.mkdtemp(prefix="sf_test_write_fields_")
check = Checks()


def members(pattern, shards):
    """[(name, bytes)] of the written shards in order, read with tarfile."""
    out = []
    for i in range(shards):
        with tarfile.open(pattern % i) as tf:
            out += [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    return out


def put(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return data


def test_directory():
    src = os.path.join(TMP, "files")
    rng = np.random.default_rng(1)
    npy = io.BytesIO()
    np.save(npy, rng.standard_normal((3, 4)).astype(np.float32))
    want = {
        "b01.txt": "caf\u00e9 au lait".encode(), "b01.json": b'{"w": 3}', "b01.jpg": rng.bytes(700),
        "a02.npy": npy.getvalue(), "a02.seg.png": rng.bytes(100), "c03.txt": b"",
        "Track 2.flac": rng.bytes(50),  # a space in the key; first dot splits
    }
    for name, data in want.items():
        put(os.path.join(src, name), data)
    put(os.path.join(src, "README"), b"no extension")
    put(os.path.join(src, ".hidden.txt"), b"hidden")
    out = os.path.join(TMP, "dir-%06d.tar")
    p = run(["write", "--layout", "files", "--no-shuffle", src, out])
    got = members(out, 1)
    expect = sorted(want.items(), key=lambda kv: tuple(kv[0].split(".", 1)))
    check([n for n, _ in got] == [n for n, _ in expect], f"directory: members sorted by (key, field): {[n for n, _ in got]}")
    check(got == expect, "directory: every member's bytes equal its file")
    check("4 samples" in p.stdout and "1 files without an extension skipped" in p.stdout, f"directory: summary: {p.stdout}")


def test_manifest():
    src = os.path.join(TMP, "manifest")
    rng = np.random.default_rng(2)
    lines, want = [], []
    for i in range(12):
        key = f"s{i:03d}"
        img = put(os.path.join(src, "img", f"{i}.jpg"), rng.bytes(int(rng.integers(10, 900))))
        caption = "a caption " + "\u65e5" * i + " \U0001f600" * (i % 3)
        meta = {"width": int(i * 10), "tags": ["x", str(i)], "ok": i % 2 == 0}
        lines.append(json.dumps({"__key__": key, "jpg": f"img/{i}.jpg", "txt": {"inline": caption},
                                 "json": {"inline": meta}}, ensure_ascii=i % 2 == 0))
        want.append((key, {"jpg": img, "txt": caption.encode(), "json": meta}))
    lines.insert(5, "")  # blank lines are allowed
    manifest = os.path.join(src, "m.jsonl")
    put(manifest, ("\n".join(lines) + "\n").encode())

    def compare(got, order, what):
        names = [n for n, _ in got]
        check(names == [f"{k}.{f}" for k, _ in order for f in ("jpg", "json", "txt")], f"{what}: member names and order")
        for (name, data), (key, fields) in zip(got, [(k, f) for k, fs in order for f in [fs] * 3]):
            field = name.split(".", 1)[1]
            ok = json.loads(data) == fields["json"] if field == "json" else data == fields[field]
            check(ok, f"{what}: {name} equals its input")

    out = os.path.join(TMP, "m-%06d.tar")
    run(["write", "--no-shuffle", "--maxcount", "5", manifest, out])
    check(os.path.exists(out % 2) and not os.path.exists(out % 3), "manifest: 12 samples, maxcount 5 -> 3 shards")
    compare(members(out, 3), want, "manifest")
    out = os.path.join(TMP, "ms-%06d.tar")
    run(["write", "--shuffle-seed", "7", manifest, out])
    got = members(out, 1)
    keys = [n.split(".")[0] for n, _ in got[::3]]
    check(sorted(keys) == [k for k, _ in want] and keys != [k for k, _ in want], f"shuffled: same samples, new order {keys}")
    compare(got, [(k, dict(want)[k]) for k in keys], "shuffled")


def test_errors():
    src = os.path.join(TMP, "bad")
    put(os.path.join(src, "a.txt"), b"a")
    cases = [
        ('{"__key__": "k", "txt": "missing.txt"}', "bad.jsonl:1: field txt: cannot read"),
        ('{"__key__": "k", "txt": "a.txt"}\n{"__key__": "k", "txt": "a.txt"}', "key k appears on more than one line"),
        ('{"__key__": "k", "txt": "a.txt"}\n{"__key__": "j", "txt": "a.txt",}', "bad.jsonl:2: column"),
        ('{"__key__": "k", "cls": 3}', 'bad.jsonl:1: field cls: give a file path (a string) or {"inline": VALUE}'),
        ('{"txt": "a.txt"}', 'bad.jsonl:1: give "__key__"'),
    ]
    for text, message in cases:
        put(os.path.join(src, "bad.jsonl"), text.encode() + b"\n")
        p = run(["write", os.path.join(src, "bad.jsonl"), os.path.join(TMP, "bad-%06d.tar")], check=False)
        check(p.returncode == 1 and message in p.stderr, f"error {message!r}: exit {p.returncode}, {p.stderr.strip()}")
    p = run(["write", "--layout", "files", os.path.join(src, "bad.jsonl"), os.path.join(TMP, "bad-%06d.tar")], check=False)
    check(p.returncode == 1 and "--layout files reads a directory" in p.stderr, f"--layout files on a file: {p.stderr}")


if __name__ == "__main__":
    test_directory()
    test_manifest()
    test_errors()
    check.done("write_fields")
    shutil.rmtree(TMP)
