#!/usr/bin/python3
"""`shardflow write` of any fields, checked with Python's tarfile against the inputs.

A directory of KEY.EXT files (--layout files): every KEY is one sample, its members KEY.EXT in sorted
order, bytes equal to the files; names without an extension and hidden files are skipped. A JSON-lines
manifest: file paths relative to the manifest, {"inline": "text"} as UTF-8, {"inline": {...}} as
JSON that json.loads reads back equal; manifest order with --no-shuffle, the same samples (each
sample's members together) when shuffled, --maxcount splitting shards. Errors name the manifest line
and the field: a missing file, a duplicate key, a line that is not JSON, a value that is neither.

Keys and paths from the input are checked: a __key__ may hold '/' (WebDataset keys may name
subdirectories) but no leading '/', no empty component, no control character; keys longer than
ustar's 100 bytes round-trip (pax headers); --root DIR refuses inputs that resolve outside DIR; a
failed write leaves no shard and no temporary file behind; a URL pattern's staging file in $TMPDIR
does not follow a symlink planted at a name another user could predict.
"""
import io
import json
import os
import resource
import shutil
import signal
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sfutil import Checks, nginx, run, run_with_pid  # noqa: E402

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


def manifest_of(path, samples):
    """Writes a manifest of {key: {field: inline text or ("file", path)}}; returns its path."""
    lines = []
    for key, fields in samples:
        obj = {"__key__": key}
        for field, v in fields.items():
            obj[field] = v[1] if isinstance(v, tuple) else {"inline": v}
        lines.append(json.dumps(obj))
    put(path, ("\n".join(lines) + "\n").encode())
    return path


def test_keys():
    src = os.path.join(TMP, "keys")
    deep = "/".join(f"dir{i:02d}" for i in range(40)) + "/x"  # 241 bytes: past ustar's name + prefix
    keys = ["train/0001", "k" * 150, deep, "caf\u00e9-\u65e5"]
    manifest = manifest_of(os.path.join(src, "good.jsonl"), [(k, {"txt": f"text of {i}"}) for i, k in enumerate(keys)])
    out = os.path.join(src, "out", "k-%06d.tar")
    p = run(["write", "--no-shuffle", manifest, out], check=False)
    check(p.returncode == 0, f"keys with '/' and keys longer than 100 bytes are written: {p.stderr.strip()}")
    got = members(out, 1)
    check(got == [(f"{k}.txt", f"text of {i}".encode()) for i, k in enumerate(keys)],
          f"tarfile reads every key back whole: {[n for n, _ in got]}")
    with tarfile.open(out % 0) as tf:  # the reference extractor lands every member inside its target
        target = os.path.join(src, "extract")
        tf.extractall(target, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    check(sorted(os.path.relpath(os.path.join(d, f), target) for d, _, fs in os.walk(target) for f in fs)
          == sorted(f"{k}.txt" for k in keys), "extractall writes the keys under its target")
    listed = run(["ls", out % 0]).stdout.splitlines()
    check(listed == [f"{k}\ttxt" for k in keys], f"shardflow ls groups the long keys as tarfile does: {listed}")

    bad_keys = {"/etc/passwd": "'/'", "a//b": "empty", "a/": "empty", "dir/../../x": "dot",
                "a\nb": "control", "a\x1b[31mred": "control", "a\x7fb": "control", "a\u009bb": "control"}
    for key, why in bad_keys.items():
        path = manifest_of(os.path.join(src, "bad.jsonl"), [("ok", {"txt": "fine"}), (key, {"txt": "x"})])
        bad_out = os.path.join(src, "bad", "b-%06d.tar")
        p = run(["write", path, bad_out], check=False)
        check(p.returncode == 1 and "bad.jsonl:2: " in p.stderr and "__key__" in p.stderr and why in p.stderr,
              f"key {key!r} refused naming the line and why ({why}): {p.returncode} {p.stderr.strip()!r}")
        check(not any(c in p.stderr.rstrip("\n") for c in "\n\x1b\x7f\u009b"), f"the message holds no raw control: {p.stderr!r}")
        check(not os.path.exists(os.path.dirname(bad_out)), "a refused manifest writes no shard")
    for field in ("t\x1bxt", "t\nxt"):
        path = manifest_of(os.path.join(src, "bad.jsonl"), [("k", {field: "x"})])
        p = run(["write", path, os.path.join(src, "bad", "b-%06d.tar")], check=False)
        check(p.returncode == 1 and "bad.jsonl:1: " in p.stderr and "control" in p.stderr and "\x1b" not in p.stderr,
              f"field {field!r} refused: {p.stderr.strip()!r}")
    # --layout files: names come from the directory; the same rules apply to them
    for name in ("a\x1bb.txt", "ok.t\nxt"):
        d = os.path.join(src, "dir")
        shutil.rmtree(d, ignore_errors=True)
        put(os.path.join(d, "fine.txt"), b"x")
        put(os.path.join(d, name), b"y")
        p = run(["write", "--layout", "files", d, os.path.join(src, "bad", "b-%06d.tar")], check=False)
        check(p.returncode == 1 and "control" in p.stderr and "\x1b" not in p.stderr and repr(name)[1:-1] in p.stderr,
              f"file {name!r} refused, named escaped: {p.stderr.strip()!r}")


def test_root():
    src = os.path.join(TMP, "rooted")
    put(os.path.join(src, "data", "a.txt"), b"inside")
    secret = os.path.join(TMP, "outside", "secret.txt")
    put(secret, b"secret")
    os.symlink(secret, os.path.join(src, "data", "link.txt"))
    out = os.path.join(TMP, "root-out", "r-%06d.tar")
    ok = manifest_of(os.path.join(src, "ok.jsonl"), [("a", {"txt": ("file", "data/a.txt")})])
    run(["write", "--root", src, ok, out])
    check(members(out, 1) == [("a.txt", b"inside")], "--root: a file under the root is written")
    for path in ("../outside/secret.txt", secret, "data/link.txt"):
        m = manifest_of(os.path.join(src, "m.jsonl"), [("a", {"txt": ("file", "data/a.txt")}), ("b", {"txt": ("file", path)})])
        p = run(["write", "--root", src, m, out], check=False)
        check(p.returncode == 1 and "m.jsonl:2: " in p.stderr and "--root" in p.stderr,
              f"--root refuses {path}: {p.returncode} {p.stderr.strip()}")
    # without --root a manifest reads what its paths and symlinks name (documented)
    m = manifest_of(os.path.join(src, "m.jsonl"), [("b", {"txt": ("file", "data/link.txt")})])
    run(["write", m, out])
    check(members(out, 1) == [("b.txt", b"secret")], "without --root a symlink is followed")
    d = os.path.join(src, "data")
    p = run(["write", "--layout", "files", "--root", src, d, out], check=False)
    check(p.returncode == 1 and "link.txt" in p.stderr and "--root" in p.stderr, f"--layout files --root: {p.stderr.strip()}")
    p = run(["write", "--root", os.path.join(TMP, "no-such-root"), ok, out], check=False)
    check(p.returncode != 0 and "--root" in p.stderr and "no-such-root" in p.stderr, f"a missing --root: {p.stderr.strip()}")


def test_no_partial_shard():
    """A write that fails part way (here: the file size limit, as a full disk would) leaves nothing."""
    src = os.path.join(TMP, "partial")
    rng = np.random.default_rng(3)
    samples = []
    for i in range(6):
        put(os.path.join(src, f"{i}.bin"), rng.bytes(300_000))
        samples.append((f"s{i}", {"bin": ("file", f"{i}.bin")}))
    m = manifest_of(os.path.join(src, "m.jsonl"), samples)
    outdir = os.path.join(TMP, "partial-out")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (700_000, 700_000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead

    p = run(["write", "--no-shuffle", m, os.path.join(outdir, "p-%06d.tar")], check=False, preexec_fn=limit)
    check(p.returncode == 1 and "p-000000.tar" in p.stderr, f"the failed write names the shard: {p.stderr.strip()}")
    check(os.listdir(outdir) == [], f"no partial shard or temporary file is left: {os.listdir(outdir)}")


def test_staging_symlinks():
    """A URL pattern stages each shard in $TMPDIR: at a fresh, unpredictable name, not through a planted symlink."""
    src = os.path.join(TMP, "stage")
    for i in range(3):
        put(os.path.join(src, f"{i}.txt"), f"sample {i}".encode())
    m = manifest_of(os.path.join(src, "m.jsonl"), [(f"s{i}", {"txt": ("file", f"{i}.txt")}) for i in range(3)])
    www, stage, victim = os.path.join(TMP, "www"), os.path.join(TMP, "stage-tmp"), os.path.join(TMP, "victim")
    os.makedirs(www)
    os.makedirs(stage)
    put(victim, b"precious")
    planted = []

    def plant(pid):
        for n in range(4):
            planted.append(os.path.join(stage, f"shardflow-write-{pid}-{n}.tar"))
            os.symlink(victim, planted[-1])

    dav = "location /up/ { dav_methods PUT DELETE MOVE; create_full_put_path on; client_max_body_size 0; }"
    with nginx(www, dav) as base:
        p = run_with_pid(["write", "--no-shuffle", "--maxcount", "1", m, f"{base}/up/w-%06d.tar"], plant,
                         env=dict(os.environ, TMPDIR=stage))
    check(p.returncode == 0, f"write to http:// next to planted symlinks: {p.stderr.strip()}")
    check(open(victim, "rb").read() == b"precious", "the planted symlink's target was overwritten")
    check(members(os.path.join(www, "up", "w-%06d.tar"), 3) == [(f"s{i}.txt", f"sample {i}".encode()) for i in range(3)],
          "the uploaded shards hold the samples")
    check(sorted(os.listdir(stage)) == sorted(os.path.basename(n) for n in planted), f"staging files are removed: {os.listdir(stage)}")


if __name__ == "__main__":
    test_directory()
    test_manifest()
    test_errors()
    test_keys()
    test_root()
    test_no_partial_shard()
    test_staging_symlinks()
    check.done("write_fields")
    shutil.rmtree(TMP)
