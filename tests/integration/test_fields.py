"""rename (select / rename / order fields, WebDataset's rename and to_tuple) and tar_split's key_rule, against
the same shards read with Python's tarfile and PIL, and WebDataset's getfirst rule written out below."""
import io
import os
import re
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, ppm_bytes, run, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-fields-")
rng = np.random.default_rng(13)


def png_bytes(arr):
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format="PNG")
    return out.getvalue()


def getfirst(sample, alts):
    """WebDataset's getfirst: the first alternative the sample has; None when it has none."""
    return next((sample[a] for a in alts.split(";") if a in sample), None)


def tar_samples(path, split):
    """(key, {field: bytes}) of consecutive members by tarfile, keys and fields by split(name) -> (key, field)."""
    out = []
    with tarfile.open(path) as tf:
        for m in tf:
            parts = split(m.name)
            if parts is None:
                continue
            key, field = parts
            if not out or out[-1][0] != key:
                out.append((key, {}))
            out[-1][1][field.lower()] = tf.extractfile(m).read()
    return out


def keys_of(out):
    """Keys of the device sink's dumps in batch order (one a line: keys may hold spaces)."""
    keys = []
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if name.endswith("_keys.txt"):
            with open(os.path.join(out, name)) as f:
                keys += f.read().splitlines()
    return keys


def fields_of(out):
    """{field: array concatenated over batches} of the dumps."""
    got = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        m = re.match(r"e\d+_b\d+_(.*)\.npy$", name)
        if m:
            got.setdefault(m.group(1), []).append(np.load(os.path.join(out, name)))
    return {k: np.concatenate(v) for k, v in got.items()}


def run_graph(name, shard, middle, split_opts=None, expect=0, **settings):
    """shard_source -> tar_split -> middle stages -> batch (4) -> device_sink; returns (keys, fields, stderr)."""
    out = os.path.join(tmp, name)
    stages = [("shard_source", dict(urls=shard)), ("tar_split", split_opts or {})] + middle + [
        ("batch", dict(batch_size=4, partial=True)), ("device_sink", dict(npy_dir=out))]
    path = write_graph(os.path.join(tmp, name + ".yaml"), stages, **settings)
    p = run(["run", path, "--quiet", "--no-summary"], check=False)
    check(p.returncode == expect, f"{name}: exit {p.returncode}, expected {expect}\n{p.stderr}")
    return keys_of(out), fields_of(out), p.stderr


# A LAION-like shard: images as png or ppm (some samples both, with different pixels: the order of the
# alternatives decides), cls labels, captions, and one sample without any image.
samples = []
for i in range(14):
    fields = {"cls": str(i % 10).encode(), "txt": f"caption {i}".encode()}
    if i % 3 != 1:
        fields["png"] = png_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    if i % 3 != 0:
        fields["ppm"] = ppm_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    if i == 9:
        del fields["png"]  # i % 3 == 0: no ppm either: no image at all
    samples.append((f"s{i:03d}", fields))
shard = write_shard(os.path.join(tmp, "laion.tar"), samples)
ref = tar_samples(shard, lambda n: n.split(".", 1))


def pixels(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


# 1. to_tuple: only the named fields, in the named order; the first alternative present wins; the sample
#    missing one is an error record naming key, alternatives and its fields, counted as skipped.
names = "label=cls,image=png;ppm"
keys, got, err = run_graph("select", shard, [("decode", {}), ("rename", dict(names=f'"{names}"'))],
                           error_policy="skip")
want = [(k, s) for k, s in ref if getfirst(s, "png;ppm") is not None]
check(keys == [k for k, _ in want], f"select: keys {keys}, expected {[k for k, _ in want]}")
check(sorted(got) == ["image", "label"], f"select: fields {sorted(got)}, expected image and label only")
if sorted(got) == ["image", "label"]:
    check(np.array_equal(got["image"], np.stack([pixels(getfirst(s, "png;ppm")) for _, s in want])),
          "select: image holds the first alternative present (png before ppm), decoded as PIL does")
    check(got["label"].tolist() == [int(s["cls"]) for _, s in want], "select: label holds cls")
missing = [k for k, s in ref if getfirst(s, "png;ppm") is None]
check(missing == ["s009"], f"the reference has one sample without an image ({missing})")
check("s009" in err and "'image'" in err and "png;ppm" in err and "cls, txt" in err,
      f"the missing field's error names key, name, alternatives and the sample's fields:\n{err}")
check("1 error record(s), 1 sample(s) skipped" in err, f"the sample is counted as skipped:\n{err}")
# `names` is a list option: written as a YAML flow list, a block list, or the text "[a, b]" that --set and
# Python's keyword arguments (a list) give, with blanks around the items, it names what the comma string names.
for how, value in (("flow", "[label=cls, image=png;ppm]"), ("block", "\n      - label=cls\n      - image=png;ppm"),
                   ("text", '"[ label=cls , image=png;ppm ]"')):
    k2, g2, e2 = run_graph(f"select-{how}", shard, [("decode", {}), ("rename", dict(names=value))],
                           error_policy="skip")
    check(k2 == keys and sorted(g2) == sorted(got) and all(np.array_equal(g2[n], got[n]) for n in got),
          f"names as a {how} list: keys {k2}, fields {sorted(g2)}, expected {keys}, {sorted(got)}\n{e2}")
# The same inside a group (two worker processes): rename is a map stage, so it runs there too, and the
# missing field's error record travels to the head.
out = os.path.join(tmp, "select-group")
path = write_graph(os.path.join(tmp, "select-group.yaml"), [
    ("shard_source", dict(urls=shard)), ("tar_split", {}), ("decode", dict(group="decoders")),
    ("rename", dict(names=f'"{names}"', group="decoders")), ("batch", dict(batch_size=4, partial=True)),
    ("device_sink", dict(npy_dir=out))], groups={"decoders": {"processes": 2, "unit_samples": 4}},
    error_policy="skip")
p = run(["run", path, "--quiet", "--no-summary"], check=False)
check(p.returncode == 0 and keys_of(out) == [k for k, _ in want], f"group: keys {keys_of(out)}\n{p.stderr}")
g = fields_of(out)
check(sorted(g) == ["image", "label"] and all(np.array_equal(g[n], got[n]) for n in g),
      "group: the same fields and values as in one process")
check("s009" in p.stderr and "png;ppm" in p.stderr, f"group: the worker's error record reaches the head:\n{p.stderr}")
_, _, err = run_graph("select-fail", shard, [("decode", {}), ("rename", dict(names=f'"{names}"'))],
                      expect=1, error_policy="fail")
check("s009" in err, f"error_policy fail stops at the sample without an image:\n{err}")

# 2. keep: true (WebDataset's rename): unlisted fields stay, after the named ones; every alternative
#    (chosen or not) goes. Here the unlisted one is a decoded second image, mask.png.
both = [(f"b{i}", {"png": png_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)),
                   "ppm": ppm_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)),
                   "mask.png": png_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)),
                   "cls": b"3"}) for i in range(6)]
shard2 = write_shard(os.path.join(tmp, "both.tar"), both)
keys, got, _ = run_graph("keep", shard2, [("decode", {}), ("rename", dict(names='"image=ppm;png"', keep=True))])
check(sorted(got) == ["cls", "image", "mask.png"], f"keep: fields {sorted(got)}, expected cls, image, mask.png")
if "image" in got and "mask.png" in got:
    check(np.array_equal(got["image"], np.stack([pixels(s["ppm"]) for _, s in both])), "keep: image is the ppm")
    check(np.array_equal(got["mask.png"], np.stack([pixels(s["mask.png"]) for _, s in both])), "keep: mask kept")

# 3. Renaming before decode: an encoded field renamed away from its extension is refused (decode picks the
#    decoder by it); keeping the extension (image.png) is decoded by content as PIL does.
_, _, err = run_graph("encoded", shard2, [("rename", dict(names='"image=png"')), ("decode", {})], expect=1,
                      error_policy="fail")
check("still encoded" in err and "put decode before rename" in err, f"renaming an encoded field:\n{err}")
keys, got, _ = run_graph("encoded-ext", shard2, [("rename", dict(names='"image.png=png,label.cls=cls"')), ("decode", {})])
check(sorted(got) == ["image.png", "label.cls"], f"encoded-ext: fields {sorted(got)}")
if "image.png" in got:
    check(np.array_equal(got["image.png"], np.stack([pixels(s["png"]) for _, s in both])),
          "a renamed encoded field that keeps its extension is decoded as PIL does")

# 4. Bad `names` options are refused naming the option.
for bad, why in [("image=", "empty"), ("a=cls,a=png", "named twice"), ("jpg;png", "needs a new name"),
                 ("a=cls,b=cls", "source of both")]:
    _, _, err = run_graph("bad-names", shard2, [("rename", dict(names=f'"{bad}"'))], expect=1)
    check("names" in err and why in err, f"names: \"{bad}\" is refused with '{why}':\n{err}")

# 5. tar_split's key_rule on names holding dots, against tarfile with each rule written in Python.
def first_dot(name):  # WebDataset's rule (names here have no leading dots)
    d, _, base = name.rpartition("/")
    return (d + "/" if d else "") + base.split(".", 1)[0], base.split(".", 1)[1]


def last_dot(name):
    key, _, field = name.rpartition(".")
    return key, field


KEY_RE = r"^([^.]*[.][0-9]+)[.](.+)$"  # "Track 2.0" and "v1.2" (field "3-final.cls"); others skipped
rules = {"first_dot": (first_dot, {}), "last_dot": (last_dot, {}),
         "regex": (lambda n: (lambda m: m and (m.group(1), n[m.end(1) + 1:]))(re.match(KEY_RE, n)),
                   {"key_regex": f"'{KEY_RE}'"})}
dotted = []
for i, key in enumerate(["Track 2.0", "a.b.c", "dir.v1/x.y", "plain", "v1.2.3-final", "Track 2.1"]):
    dotted.append((key, {"cls": str(i).encode(), "ppm": ppm_bytes(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))}))
shard3 = write_shard(os.path.join(tmp, "dotted.tar"), dotted)


def batches_of(out):
    """[(keys, {field: array})] per batch in order, keys one a line."""
    got = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        m = re.match(r"e(\d+)_b(\d+)_(.*)\.(npy|txt)$", name)
        b = got.setdefault((m.group(1), m.group(2)), [None, {}])
        if m.group(4) == "txt":
            with open(os.path.join(out, name)) as f:
                b[0] = f.read().splitlines()
        else:
            b[1][m.group(3)] = np.load(os.path.join(out, name))
    return [tuple(v) for _, v in sorted(got.items())]


for rule, (split, extra) in rules.items():
    out = os.path.join(tmp, "rule-" + rule)
    path = write_graph(os.path.join(tmp, f"rule-{rule}.yaml"), [
        ("shard_source", dict(urls=shard3)), ("tar_split", dict(key_rule=rule, **extra)), ("decode", {}),
        ("batch", dict(batch_size=1)), ("device_sink", dict(npy_dir=out))])
    run(["run", path, "--quiet", "--no-summary"])
    want = tar_samples(shard3, split)
    got = batches_of(out)
    check([b[0] for b in got] == [[k] for k, _ in want],
          f"key_rule {rule}: keys {[b[0] for b in got]}, tarfile says {[k for k, _ in want]}")
    for (keys, arrays), (key, fields) in zip(got, want):
        check(sorted(arrays) == sorted(fields), f"key_rule {rule}: {key}: fields {sorted(arrays)} vs {sorted(fields)}")
        for name, data in fields.items():
            if name in arrays:
                ref_value = int(data) if name.endswith("cls") else pixels(data)
                check(np.array_equal(arrays[name][0], ref_value), f"key_rule {rule}: {key}.{name} differs from tarfile")

for extra, why in [({"key_rule": "regex", "key_regex": "'^(unclosed[.]x$'"}, "does not compile: "),
                   ({"key_rule": "regex", "key_regex": "'^[^.]*[.]cls$'"}, "has no group"),
                   ({"key_rule": "regex"}, "go together")]:
    path = write_graph(os.path.join(tmp, "bad-regex.yaml"), [
        ("shard_source", dict(urls=shard3)), ("tar_split", extra), ("batch", dict(batch_size=1)), ("device_sink", {})])
    p = run(["run", path, "--quiet", "--no-summary"], check=False)
    check(p.returncode != 0 and "key_regex" in p.stderr and why in p.stderr,
          f"tar_split {extra} is refused naming key_regex ('{why}'):\n{p.stderr}")
    if why == "does not compile: ":
        check(len(p.stderr.split(why, 1)[1].strip()) > 3, "the message carries regerror's text")

check.done("fields")
