"""Variable-length fields through Python: a caption dataset (jpg + txt + json + an undecoded bin member) with
40 different caption lengths reaches Pipeline(output="dict") with every caption intact next to its image
(compared with what tarfile and PIL read); token-like int32 ids (the test plugin `ids`: byte + 1000) padded
and ragged against numpy; the same through torch tensors and with decode in a group of worker processes. A plain
`batch` (no ragged/pad) collates txt and json as lists by default, as WebDataset's default collation does: through
the CLI (the device sink's .npy dumps: values + offsets) and Python (list[str], parsed json), images and classes fixed."""
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
import shardflow  # noqa: E402
from sfutil import Checks, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-varlen-")
IDS = os.environ["SF_IDS_PLUGIN"]
rng = np.random.default_rng(13)
WORDS = ["shard", "flow", "café", "naïve", "Łódź", "日本", "tar", "🙂", "batch", "x"]
captions = []
while len(captions) < 40:  # 40 captions of 40 different byte lengths (one empty)
    text = " ".join(rng.choice(WORDS, int(rng.integers(0, 12))))
    if len(text.encode()) not in {len(c.encode()) for c in captions}:
        captions.append(text)
for s in range(2):
    samples = []
    for i in range(20):
        n = s * 20 + i
        img = np.full((16, 16, 3), (n * 6, 255 - n * 6, (n * 37) % 256), np.uint8)
        jpg = io.BytesIO()
        Image.fromarray(img).save(jpg, "JPEG", quality=95)
        meta = {"n": n, "caption": captions[n], "tags": ["a"] * (n % 4)}
        samples.append((f"c{n:03d}", {"jpg": jpg.getvalue(), "txt": captions[n].encode(),
                                      "json": json.dumps(meta).encode(), "cls": str(n % 10).encode(), "bin": bytes(rng.integers(0, 256, n, np.uint8))}))
    write_shard(os.path.join(tmp, f"cap-{s}.tar"), samples)
truth = {}
for s in range(2):
    with tarfile.open(os.path.join(tmp, f"cap-{s}.tar")) as tf:
        for m in tf:
            key, field = m.name.split(".", 1)
            truth.setdefault(key, {})[field] = tf.extractfile(m).read()
check(len({len(t["txt"]) for t in truth.values()}) == 40, "40 different caption lengths")


def graph(name, batch, group=False, ids=True):
    g = {"group": "decoders"} if group else {}
    path = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=os.path.join(tmp, "cap-{0..1}.tar"))),
        ("tar_split", {}),
        ("decode", dict(**g)),
    ] + ([("ids", dict(**g))] if ids else []) + [
        ("batch", dict(batch_size=7, **batch)),
        ("device_sink", {}),
    ], groups={"decoders": {"processes": 1}} if group else None, plugins=[IDS], seed=1, epochs=1)
    return path


def batches(path, output="dict"):
    with shardflow.Pipeline(path, output=output) as p:
        return list(p)


def check_captions(tag, got):
    keys = [k for b in got for k in b["__key__"]]
    check(sorted(keys) == sorted(truth) and len(keys) == 40, f"{tag}: every sample once")
    for b in got:
        n = len(b["__key__"])
        check(len(b["txt"]) == n and len(b["json"]) == n and len(b["bin"]) == n, f"{tag}: one entry per sample")
        check("txt.offsets" not in b and "json.offsets" not in b, f"{tag}: offsets folded into the lists")
        for j, key in enumerate(b["__key__"]):
            t = truth[key]
            check(isinstance(b["txt"][j], str) and b["txt"][j] == t["txt"].decode(), f"{tag} {key}: caption intact")
            check(b["json"][j] == json.loads(t["json"]), f"{tag} {key}: json parsed")
            check(isinstance(b["bin"][j], bytes) and b["bin"][j] == t["bin"], f"{tag} {key}: bytes intact")
            ref = np.asarray(Image.open(io.BytesIO(t["jpg"])).convert("RGB"), np.int16)
            image = np.asarray(b["jpg"][j], np.int16)
            check(np.abs(image - ref).max() <= 2, f"{tag} {key}: the image next to it is its own (PIL)")


def want_ids(key):
    return np.frombuffer(truth[key]["txt"], np.uint8).astype(np.int32) + 1000


# Padded ids: [B, L] with -1 after each sample's length, plus ids.length int32 [B].
padded = batches(graph("padded", dict(ragged="txt,json,bin", pad="ids=-1")))
check_captions("padded", padded)
for b in padded:
    lengths = [len(truth[k]["txt"]) for k in b["__key__"]]
    check(b["ids"].dtype == np.int32 and b["ids"].shape == (len(lengths), max(lengths)), "padded: [B, longest]")
    check(b["ids.length"].dtype == np.int32 and b["ids.length"].tolist() == lengths, "padded: lengths")
    for j, key in enumerate(b["__key__"]):
        want = np.full(max(lengths), -1, np.int32)
        want[:lengths[j]] = want_ids(key)
        check(np.array_equal(b["ids"][j], want), f"padded {key}: ids against numpy")

# Ragged ids: a list of 1-D int32 arrays.
ragged = batches(graph("ragged", dict(ragged="txt,json,bin,ids")))
check_captions("ragged", ragged)
for b in ragged:
    for j, key in enumerate(b["__key__"]):
        check(b["ids"][j].dtype == np.int32 and np.array_equal(b["ids"][j], want_ids(key)), f"ragged {key}: ids")

# Torch: ragged ids are a list of int32 tensors; captions the same strings.
import torch  # noqa: E402

tb = batches(graph("torch", dict(ragged="txt,json,bin,ids")), output="torch_dict")
for b in tb:
    for j, key in enumerate(b["__key__"]):
        check(b["txt"][j] == truth[key]["txt"].decode(), f"torch {key}: caption")
        check(b["ids"][j].dtype == torch.int32 and np.array_equal(b["ids"][j].numpy(), want_ids(key)), f"torch {key}")

# A group: samples cross the wire as before, the head batches them.
grouped = batches(graph("grouped", dict(ragged="txt,json,bin", pad="ids=-1"), group=True))
check_captions("group", grouped)
check([b["__key__"] for b in grouped] == [b["__key__"] for b in padded], "group: the same batches")

# A plain batch: txt and json are lists by default (WebDataset's default collation), the undecoded bin member
# is left out, images and classes are fixed [B, ...] as ever. Before, every batch but the first sample's
# shape was skipped ("39 of 40 samples read were skipped").
plain = graph("plain", {}, ids=False)
npy = os.path.join(tmp, "plain-npy")
p = subprocess.run([os.environ["SHARDFLOW"], "run", plain, "--quiet", "--set", f"device_sink.npy_dir={npy}"],
                   capture_output=True, text=True, timeout=120)
check(p.returncode == 0 and "sample(s) skipped" not in p.stdout + p.stderr and "Train Samples=40 " in p.stdout,
      f"plain batch: the CLI runs every sample (rc {p.returncode}: {(p.stdout + p.stderr).strip()[-300:]})")
dumped = sorted({re.match(r"(e\d+_b\d+)_", n).group(1) for n in os.listdir(npy)}) if os.path.isdir(npy) else []
seen = []
for b in dumped:
    keys = open(os.path.join(npy, f"{b}_keys.txt")).read().split()
    seen += keys
    for name in ("txt", "json"):
        values, offsets = np.load(os.path.join(npy, f"{b}_{name}.npy")), np.load(os.path.join(npy, f"{b}_{name}.offsets.npy"))
        check(values.dtype == np.uint8 and values.ndim == 1 and offsets.dtype == np.int64 and
              offsets.shape == (len(keys) + 1,) and offsets[0] == 0 and offsets[-1] == len(values),
              f"plain {b}: {name} is ragged (uint8 values, int64 offsets [B+1])")
        for j, key in enumerate(keys):
            check(values[offsets[j]:offsets[j + 1]].tobytes() == truth[key][name], f"plain {b} {key}: C's {name} bytes")
    cls = np.load(os.path.join(npy, f"{b}_cls.npy"))
    check(cls.shape == (len(keys),) and cls.tolist() == [int(truth[k]["cls"]) for k in keys], f"plain {b}: classes")
    check(np.load(os.path.join(npy, f"{b}_jpg.npy")).shape == (len(keys), 16, 16, 3), f"plain {b}: images [B,16,16,3]")
    check(not os.path.exists(os.path.join(npy, f"{b}_bin.npy")), f"plain {b}: the undecoded bin member is left out")
check(sorted(seen) == sorted(truth), f"plain: the CLI's batches hold every sample once ({len(seen)})")

got = batches(plain)
keys = [k for b in got for k in b["__key__"]]
check(sorted(keys) == sorted(truth), f"plain: Python gets every sample once ({len(keys)})")
for b in got:
    n = len(b["__key__"])
    check("bin" not in b and "txt.offsets" not in b and "json.offsets" not in b, "plain: lists, no offsets, no bin")
    check(b["jpg"].shape == (n, 16, 16, 3) and b["cls"].tolist() == [int(truth[k]["cls"]) for k in b["__key__"]],
          "plain: images and classes fixed")
    for j, key in enumerate(b["__key__"]):
        check(isinstance(b["txt"][j], str) and b["txt"][j] == truth[key]["txt"].decode(), f"plain {key}: list[str]")
        check(b["json"][j] == json.loads(truth[key]["json"]), f"plain {key}: parsed json")
shutil.rmtree(tmp, ignore_errors=True)
check.done("varlen")
