"""Python output follows rename's names: output="tuple" in the named order, "dict" keyed by the names, against
the same shards read with Python's tarfile and PIL (WebDataset's getfirst rule for the alternatives)."""
import io
import os
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
from sfutil import Checks, ppm_bytes, write_graph, write_shard  # noqa: E402

import shardflow  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-fields-python-")
rng = np.random.default_rng(7)


def png_bytes(arr):
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format="PNG")
    return out.getvalue()


samples = []
for i in range(10):
    fields = {"cls": str(i).encode(), "txt": f"caption {i}".encode(),
              "ppm": ppm_bytes(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))}
    if i % 2:
        fields["png"] = png_bytes(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
    samples.append((f"k{i:02d}", fields))
shard = write_shard(os.path.join(tmp, "s.tar"), samples)

# The reference: tarfile's members grouped by key (first dot), images decoded by PIL.
ref = {}
with tarfile.open(shard) as tf:
    for m in tf:
        key, field = m.name.split(".", 1)
        ref.setdefault(key, {})[field] = tf.extractfile(m).read()


def getfirst(sample, alts):
    return next(sample[a] for a in alts.split(";") if a in sample)


def pixels(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=shard)), ("tar_split", {}), ("decode", {}),
    ("rename", dict(names='"label=cls,image=png;ppm"')), ("batch", dict(batch_size=4, partial=True)),
    ("device_sink", {})])
keys = sorted(ref)

for names, order in [(None, ("label", "image=png;ppm")), ("image=ppm;png,label=cls", ("image=ppm;png", "label"))]:
    kwargs = {"names": names} if names else {}  # a keyword argument sets rename's option
    what = f"names={names or 'label=cls,image=png;ppm'}"
    with shardflow.Pipeline(graph, output="tuple", epochs=1, **kwargs) as p:
        batches = list(p)
    check(all(isinstance(b, tuple) and len(b) == 2 for b in batches), f"{what}: tuples of two fields")
    for j, name in enumerate(order):
        got = np.concatenate([b[j] for b in batches])
        if name == "label":
            check(got.tolist() == [int(ref[k]["cls"]) for k in keys], f"{what}: tuple item {j} is the label")
        else:
            want = np.stack([pixels(getfirst(ref[k], name.split("=")[1])) for k in keys])
            check(got.shape == want.shape and np.array_equal(got, want),
                  f"{what}: tuple item {j} is {name}, decoded as PIL does")

with shardflow.Pipeline(graph, output="dict", epochs=1) as p:
    batches = list(p)
check(all(list(b) == ["label", "image", "__key__"] for b in batches), f"dict keys {[list(b) for b in batches][:1]}")
check(sum((b["__key__"] for b in batches), []) == keys, "dict: __key__ in shard order")
check(np.array_equal(np.concatenate([b["image"] for b in batches]),
                     np.stack([pixels(getfirst(ref[k], "png;ppm")) for k in keys])), "dict: image by name")

# No output given: a graph with rename yields its names' tuple (numpy here: the test's python3 has no torch), with
# rename's __key__ (WebDataset's to_tuple("__key__", ...)) as list[str] and the txt caption as list[str].
with shardflow.Pipeline(graph, epochs=1, names="__key__,image=png;ppm,label=cls,txt", ragged="__key__,txt") as p:
    batches = list(p)
check(all(isinstance(b, tuple) and len(b) == 4 for b in batches), f"default output after rename: {batches[0]!r:.200}")
check(sum((b[0] for b in batches), []) == keys, f"tuple item 0 is the keys: {batches[0][0]}")
check(np.array_equal(np.concatenate([b[1] for b in batches]),
                     np.stack([pixels(getfirst(ref[k], "png;ppm")) for k in keys])), "tuple item 1: the images")
check(np.concatenate([b[2] for b in batches]).tolist() == [int(ref[k]["cls"]) for k in keys], "tuple item 2: labels")
check(sum((b[3] for b in batches), []) == [ref[k]["txt"].decode() for k in keys], "tuple item 3: the captions")

try:
    shardflow.Pipeline(graph, output="tuples")
    check(False, "an unknown output is refused")
except ValueError as e:
    check("tuple" in str(e), f"the refusal lists the forms: {e}")

check.done("fields_python")
