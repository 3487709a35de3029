"""tar_split's grouping, as shown by `shardflow ls --json`, against an independent reading with Python's tarfile."""
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, run  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-tarsplit-")


def add_file(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tf.addfile(info, io.BytesIO(data))


def add_special(tf, name, kind, target=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    info.mtime = 0
    tf.addfile(info)


def write_tricky(path, fmt):
    """Every corner of the grouping rule, in one shard."""
    with tarfile.open(path, "w", format=fmt) as tf:
        add_file(tf, "__meta__", b"{}")                       # top-level __NAME__: metadata, skipped
        add_file(tf, "__index__.json", b"[]")                 # "__" after the name is not at its end: a sample
        add_file(tf, "__key__.txt", b"k")                     # likewise (WebDataset keeps it)
        add_file(tf, "__init__.py", b"")                      # likewise
        add_file(tf, "__meta__/inner.json", b"{}")            # under a __NAME__ directory: skipped
        add_file(tf, "__a/b__/c.json", b"{}")                 # "__a" is not __NAME__: a sample
        add_special(tf, "train", tarfile.DIRTYPE)             # directories: skipped
        add_special(tf, "train/v1.2", tarfile.DIRTYPE)
        add_file(tf, "train/v1.2/img_001.JPG", b"\xff\xd8" + b"j" * 300)
        add_file(tf, "train/v1.2/img_001.Cls", b"7")
        add_file(tf, "train/v1.2/img_001.seg.png", b"\x89PNG" + b"s" * 40)
        add_file(tf, "train/v1.2/img_001.TXT.GZ", gzip.compress(b"caption"))
        add_special(tf, "train/v1.2/img_002.jpg", tarfile.SYMTYPE, "img_001.JPG")  # skipped
        add_special(tf, "train/v1.2/img_003.jpg", tarfile.LNKTYPE, "train/v1.2/img_001.JPG")  # skipped
        add_file(tf, "train/v1.2/img_002.json", b'{"a": 1}')
        add_file(tf, "README", b"no dot: skipped")
        add_file(tf, "train/noext", b"skipped too")
        add_file(tf, "empty.txt", b"")                        # an empty member is still a field
        add_file(tf, "empty.bin", b"")
        add_file(tf, "a.b.c.d", b"abcd")                      # field "b.c.d"
        add_file(tf, "x/y.z/w.q", b"q")                       # dots in directories
        add_file(tf, "rep.jpg", b"1")                         # rep again below, not consecutive:
        add_file(tf, "other.jpg", b"2")                       # two samples with key "rep"
        add_file(tf, "rep.cls", b"3")
        add_file(tf, "sub/.hidden", b"h")                     # WebDataset: key "sub/", field "hidden"
        add_file(tf, ".toplevel", b"t")                       # no key: skipped
        add_file(tf, "sub/__meta__.json", b"m")               # not top-level: a sample
        add_file(tf, "big.bin", bytes(range(256)) * 257)      # spans several 512-byte blocks
        add_file(tf, "big.cls", b"0")
        if fmt != tarfile.USTAR_FORMAT:
            add_file(tf, "long/" + "d" * 60 + "/" + "n" * 50 + ".jpg", b"long")  # GNU/pax long names
            add_file(tf, "ünï/çødé.txt", "unicode".encode())
            add_file(tf, "k" * 300 + ".jpg", b"long key")          # keys have no fixed length
            add_file(tf, "k" * 300 + ".cls", b"1")
            add_file(tf, "d/" * 100 + "x.jpg", b"deep")


def reference(path, url):
    """WebDataset 1.0's rule (webdataset/tariterators.py: tar_file_iterator, base_plus_ext,
    group_by_keys), written independently: regular members only; a top-level name that starts and
    ends with "__", or one whose first component does (regex __[^/]*__($|/) at the start), is
    metadata; key and lower-cased suffix split by base_plus_ext's regex; consecutive keys group."""
    samples = []
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isreg():
                continue
            name = m.name
            if "/" not in name and name.startswith("__") and name.endswith("__"):
                continue
            if re.match(r"__[^/]*__($|/)", name):
                continue
            match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
            if not match:
                continue
            key, field = match.group(1), match.group(2).lower()
            data = tf.extractfile(m).read()
            if not samples or samples[-1]["__key__"] != key:
                samples.append({"__key__": key, "__url__": url, "offset": m.offset, "fields": [], "sizes": []})
            s = samples[-1]
            if field in s["fields"]:
                continue  # reported as a duplicate; the first copy stays
            s["fields"].append(field)
            s["sizes"].append(len(data))
    return samples


def ls(*urls, allow_pipe=False, json_out=True, expect=0):
    args = ["ls"] + (["--json"] if json_out else []) + (["--allow-pipe"] if allow_pipe else []) + list(urls)
    p = run(args, check=False)
    check(p.returncode == expect, f"ls {urls}: exit {p.returncode}, expected {expect}\n{p.stderr}")
    if not json_out:
        return p.stdout, p
    return [json.loads(line) for line in p.stdout.splitlines()], p


def same(got, want, what):
    if got != want:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise AssertionError(f"{what}: sample {i} differs:\n  got  {g}\n  want {w}")
        raise AssertionError(f"{what}: {len(got)} samples, expected {len(want)}")
    check(True, what)


# Plain tars in the three header dialects tarfile writes.
for fmt, tag in [(tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")]:
    path = os.path.join(tmp, f"tricky-{tag}.tar")
    write_tricky(path, fmt)
    want = reference(path, path)
    check(len(want) >= 14, f"{tag}: the reference finds the samples")
    names = [s["__key__"] for s in want]
    check("__key__" in names and "__init__" in names and "__meta__/inner" not in names,
          f"{tag}: the reference follows WebDataset on __NAME__ members")
    got, _ = ls(path)
    same(got, want, f"{tag}: ls --json equals the tarfile reference")
    got, _ = ls("file://" + path)
    same(got, reference(path, "file://" + path), f"{tag}: file:// URL")

    # The plain listing: key TAB fields.
    text, _ = ls(path, json_out=False)
    lines = [f"{s['__key__']}\t{','.join(s['fields'])}" for s in want]
    check(text.splitlines() == lines, f"{tag}: plain listing is key<TAB>fields")

base = os.path.join(tmp, "tricky-pax.tar")
want_base = reference(base, base)
keys = [s["__key__"] for s in want_base]
check(keys.count("rep") == 2, "non-consecutive repeats of a key are two samples")
check("train/v1.2/img_001" in keys and "x/y.z/w" in keys, "dots in directories stay in the key")
check(next(s for s in want_base if s["__key__"] == "train/v1.2/img_001")["fields"] == ["jpg", "cls", "seg.png", "txt.gz"],
      "upper-case and multi-dot extensions")

# Compressed variants: same samples (offsets are in the decompressed tar stream).
gz = base + ".gz"
with open(base, "rb") as f, open(gz, "wb") as g:
    g.write(gzip.compress(f.read()))
got, _ = ls(gz)
same(got, [dict(s, __url__=gz) for s in want_base], ".tar.gz equals the plain tar")
zst = base + ".zst"
subprocess.run(["zstd", "-q", "-f", base, "-o", zst], check=True)
got, _ = ls(zst)
same(got, [dict(s, __url__=zst) for s in want_base], ".tar.zst (zstd CLI) equals the plain tar")

# Brace patterns expand to several shards, listed in order.
for i in range(3):
    with tarfile.open(os.path.join(tmp, f"shard-{i}.tar"), "w") as tf:
        for k in range(4):
            add_file(tf, f"s{i}_{k}.jpg", b"x" * (i + k))
            add_file(tf, f"s{i}_{k}.cls", str(k).encode())
pattern = os.path.join(tmp, "shard-{0..2}.tar")
got, _ = ls(pattern)
want = sum((reference(os.path.join(tmp, f"shard-{i}.tar"), os.path.join(tmp, f"shard-{i}.tar")) for i in range(3)), [])
same(got, want, "brace pattern lists every shard in order")

# pipe: URLs run only with --allow-pipe.
url = f"pipe:cat {base}"
got, p = ls(url, expect=1)
check(got == [] and "allow_pipe" in p.stderr, "pipe: without --allow-pipe is refused with a hint")
got, _ = ls(url, allow_pipe=True)
same(got, [dict(s, __url__=url) for s in want_base], "pipe:cat with --allow-pipe")
url = f"pipe:zstd -q -d -c {zst}"
got, _ = ls(url, allow_pipe=True)
same(got, [dict(s, __url__=url) for s in want_base], "pipe:zstd -d")
url = f"pipe:cat {base}; exit 3"
got, p = ls(url, allow_pipe=True, expect=1)
check("exited with status 3" in p.stderr, f"a failing pipe command is an error: {p.stderr}")

# A duplicate field: reported with the key, the sample keeps its first copy, listing goes on.
dup = os.path.join(tmp, "dup.tar")
with tarfile.open(dup, "w") as tf:
    add_file(tf, "a.jpg", b"first")
    add_file(tf, "a.JPG", b"second!")
    add_file(tf, "a.cls", b"1")
    add_file(tf, "b.jpg", b"b")
got, p = ls(dup, expect=1)
same(got, reference(dup, dup), "a duplicate field keeps the first copy, later samples follow")
check("(key a)" in p.stderr and "jpg" in p.stderr and "twice" in p.stderr, f"duplicate message: {p.stderr}")

# Keys have no fixed length limit (the tricky shards above have 300-byte keys); the listing shows them whole.
text, _ = ls(base, json_out=False)
check(("k" * 300 + "\tjpg,cls") in text.splitlines(), "a 300-byte key is listed whole")

# Damaged shards: an error naming the shard, the byte offset and the key; other shards still listed.
with open(base, "rb") as f:
    whole = f.read()
with tarfile.open(base) as tf:
    members = tf.getmembers()
big = next(m for m in members if m.name == "big.bin")
cut = os.path.join(tmp, "cut.tar")
with open(cut, "wb") as f:
    f.write(whole[:big.offset_data + 1000])
got, p = ls(cut, pattern, expect=1)
want_cut = [s for s in reference(base, cut) if s["offset"] < big.offset]
same(got[:len(want_cut)], want_cut, "samples before the damage are listed")
check(len(got) == len(want_cut) + 12, "the next shards are still listed after a damaged one")
check(f"{cut} @ byte {big.offset} (key big)" in p.stderr and "truncated" in p.stderr
      and f"expected {big.size} bytes, got 1000" in p.stderr, f"truncation message: {p.stderr}")

junk = os.path.join(tmp, "junk.tar")
with open(junk, "wb") as f:
    f.write(b"this is not a tar file\n" * 100)
_, p = ls(junk, expect=1)
check(junk in p.stderr, "a non-tar file is reported by name")
_, p = ls(os.path.join(tmp, "missing.tar"), expect=1)
check("missing.tar" in p.stderr and "No such file" in p.stderr, "a missing shard is reported")

# Usage errors.
_, p = ls(expect=2)
check("usage" in p.stderr, "no URL is a usage error")
p = run(["ls", "--bogus", base], check=False)
check(p.returncode == 2 and "--bogus" in p.stderr, "an unknown option is a usage error")
p = run(["ls", "--help"], check=False)
check(p.returncode == 0 and "--json" in p.stdout, "--help")

check.done("test_tar_split")
