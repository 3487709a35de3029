"""rename's `__key__` source and augment's refusal of uint16 images, through the CLI's .npy dumps.

`__key__` follows WebDataset's to_tuple("__key__", ...): the reference keys are Python's tarfile member names
up to the first dot, in tuple position; the images next to them are PIL's decoding of the same members.
A uint16 image (decode's depth 16, PIL writes a 16-bit PNG) reaching augment is an error record naming the
field and decode's `depth` option, where it used to pass through uncropped.
"""
import io
import os
import shutil
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-fields-gaps-")
try:
    rng = np.random.default_rng(3)

    def png(arr):
        b = io.BytesIO()
        Image.fromarray(arr).save(b, "PNG")
        return b.getvalue()

    # Keys of different lengths, one with dots past the first (WebDataset: the key ends at the first dot).
    keys = ["a", "bb02", "c-long-key-0003", "dd"]
    shard = write_shard(os.path.join(tmp, "keys.tar"),
                        [(k, {"png": png(rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)), "cls": b"%d" % i})
                         for i, k in enumerate(keys)])
    with tarfile.open(shard) as tf:
        ref = {}
        for m in tf:
            key, field = m.name.split(".", 1)
            ref.setdefault(key, {})[field] = tf.extractfile(m).read()

    out = os.path.join(tmp, "out")
    graph = write_graph(os.path.join(tmp, "keys.yaml"), [
        ("shard_source", dict(urls=shard, shuffle=False)), ("tar_split", {}), ("decode", {}),
        ("rename", dict(names='"key=__key__,image=png,label=cls"')),
        ("batch", dict(batch_size=4, ragged="key")), ("device_sink", dict(npy_dir=out))], seed=0, epochs=1)
    p = run(["run", graph, "--quiet", "--no-summary"])
    batches = read_batches(out)
    check(len(batches) == 1, f"one batch: {len(batches)}")
    _, _, batch_keys, fields = batches[0]
    check(sorted(fields) == ["image", "key", "key.offsets", "label"], f"fields: {sorted(fields)}")
    values, offsets = fields["key"], fields["key.offsets"]
    got = [bytes(values[offsets[j]:offsets[j + 1]]).decode() for j in range(len(offsets) - 1)]
    check(got == list(ref) == batch_keys, f"key field {got} != tarfile's keys {list(ref)} (batch keys {batch_keys})")
    for j, k in enumerate(got):
        want = np.asarray(Image.open(io.BytesIO(ref[k]["png"])).convert("RGB"))
        check(np.array_equal(fields["image"][j], want), f"{k}: image next to its key is PIL's decoding")
        check(int(fields["label"][j]) == int(ref[k]["cls"]), f"{k}: label next to its key")

    # A bare __key__ entry keeps its name; it may stand between other fields (to_tuple order).
    out2 = os.path.join(tmp, "out2")
    p = run(["run", graph, "--quiet", "--no-summary", "--set", "rename.names=label=cls,__key__",
             "--set", "batch.ragged=__key__", "--set", f"device_sink.npy_dir={out2}"])
    _, _, _, fields = read_batches(out2)[0]
    v, o = fields["__key__"], fields["__key__.offsets"]
    check([bytes(v[o[j]:o[j + 1]]).decode() for j in range(len(o) - 1)] == list(ref), "bare __key__: the keys")
    check("image" not in fields and "png" not in fields, f"bare __key__: only the named fields: {sorted(fields)}")

    # augment on a uint16 image: an error record naming the field and decode's depth, not a silent pass-through.
    deep = write_shard(os.path.join(tmp, "deep.tar"),
                       [("d%d" % i, {"png": png(rng.integers(0, 65536, (8, 8), dtype=np.uint16))}) for i in range(3)])
    out3 = os.path.join(tmp, "out3")
    graph = write_graph(os.path.join(tmp, "deep.yaml"), [
        ("shard_source", dict(urls=deep)), ("tar_split", {}), ("decode", dict(depth=16, mode="keep")),
        ("augment", dict(crop="center", size=4, dtype="uint8", layout="hwc")),
        ("batch", dict(batch_size=3, partial=True)), ("device_sink", dict(npy_dir=out3))],
        seed=0, epochs=1, error_policy="skip", max_error_rate=1)
    p = run(["run", graph, "--quiet", "--no-summary"], check=False)
    check(read_batches(out3) == [], f"no uint16 image passes augment untransformed: {read_batches(out3)}")
    check("field 'png' is a uint16 image" in p.stderr and "depth: 8" in p.stderr and "key d0" in p.stderr,
          f"the record names the key, the field and decode's depth: {p.stderr[-800:]}")
    # The same graph at depth 8 on 8-bit images (a 16-bit gray PNG is refused by decode at depth 8) crops them.
    out4 = os.path.join(tmp, "out4")
    p = run(["run", graph, "--quiet", "--no-summary", "--set", f"shard_source.urls={shard}",
             "--set", "decode.depth=8", "--set", "batch.batch_size=4", "--set", f"device_sink.npy_dir={out4}"])
    _, _, k4, fields = read_batches(out4)[0]
    for j, k in enumerate(k4):
        pil = np.asarray(Image.open(io.BytesIO(ref[k]["png"])).convert("RGB"))
        windows = [pil[y:y + 4, x:x + 4] for y in range(2) for x in range(3)]
        check(any(np.array_equal(fields["png"][j], w) for w in windows), f"{k}: depth 8: a 4x4 window of PIL's pixels")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.done("fields_gaps")
