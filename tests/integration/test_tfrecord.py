"""TFRecord shards (.tfrecord, .tfrecord.gz, .tfrecord.zst) read by tar_split as tf.train.Example records: records
written here from the wire formats (protobuf's encoding by hand, TFRecord's framing with a table CRC32C checked
against RFC 3720's vectors; TensorFlow is not in Debian), read by a graph shard_source -> tar_split (tfrecord_fields) ->
decode -> batch, equal to the same samples from tar shards; damaged records as error records naming shard and offset."""
import gzip
import io
import os
import struct
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-tfrecord-")
rng = np.random.default_rng(26)

# CRC32C (Castagnoli, reflected 0x82F63B78), one byte at a time: an independent reference for the engine's.
TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


check(crc32c(bytes(32)) == 0x8A9136AA and crc32c(b"\xff" * 32) == 0x62A8AB43
      and crc32c(bytes(range(32))) == 0x46DD794E, "the test's CRC32C gives RFC 3720's vectors")


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(v):
    v &= (1 << 64) - 1  # negative int64: ten bytes, two's complement
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def ld(field, data):
    """A length-delimited protobuf field."""
    return varint(field << 3 | 2) + varint(len(data)) + data


def feature(value):
    """tf.train.Feature: bytes -> bytes_list (1), list of float -> float_list (2, packed), list of int -> int64_list (3, packed)."""
    if isinstance(value, bytes):
        return ld(1, ld(1, value))
    if isinstance(value[0], float):
        return ld(2, ld(1, struct.pack(f"<{len(value)}f", *value)))
    return ld(3, ld(1, b"".join(varint(v) for v in value)))


def example(features):
    """tf.train.Example{features: Features{feature: map<string, Feature>}} (a map entry is key 1, value 2)."""
    entries = b"".join(ld(1, ld(1, k.encode()) + ld(2, feature(v))) for k, v in features.items())
    return ld(1, entries)


def record(data):
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))


def jpeg(arr):
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format="JPEG", quality=90)
    return out.getvalue()


N = 12
samples = []
for i in range(N):
    samples.append({"image/encoded": jpeg(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)),
                    "label": [int(rng.integers(-5, 1000))],
                    "bbox": [float(x) for x in rng.random(4, dtype=np.float32)]})

# Shards of 4 records each: plain, gzip, zstd. Keys are the records' indices in their shards.
plain, gz, zst = (os.path.join(tmp, n) for n in ("a.tfrecord", "b.tfrecord.gz", "c.tfrecord.zst"))
parts = [b"".join(record(example(s)) for s in samples[k:k + 4]) for k in (0, 4, 8)]
with open(plain, "wb") as f:
    f.write(parts[0])
with gzip.open(gz, "wb") as f:
    f.write(parts[1])
subprocess.run(["zstd", "-q", "-f", "-o", zst], input=parts[2], check=True)

# The same samples as tar shards: KEY.jpg and KEY.cls.
tars = []
for n, k in enumerate((0, 4, 8)):
    path = os.path.join(tmp, f"t{n}.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, s in enumerate(samples[k:k + 4]):
            for ext, data in (("jpg", s["image/encoded"]), ("cls", str(s["label"][0]).encode())):
                info = tarfile.TarInfo(f"{i}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    tars.append(path)


def run_graph(name, urls, middle, split_opts=None, expect=0, **settings):
    out = os.path.join(tmp, name + ".out")
    stages = [("shard_source", dict(urls=urls, shuffle=False)), ("tar_split", split_opts or {})] + middle + [
        ("batch", dict(batch_size=4, partial=True)), ("device_sink", dict(npy_dir=out))]
    path = write_graph(os.path.join(tmp, name + ".yaml"), stages, **settings)
    p = run(["run", path, "--quiet", "--no-summary"], check=False)
    check(p.returncode == expect, f"{name}: exit {p.returncode}, expected {expect}\n{p.stderr}")
    batches = read_batches(out)
    keys = [k for b in batches for k in b[2]]
    fields = {f: np.concatenate([b[3][f] for b in batches]) for f in (batches[0][3] if batches else {})}
    return keys, fields, p.stderr


urls = "::".join([plain, gz, zst])
JPG = dict(tfrecord_fields="jpg=image/encoded")
tf_keys, tf_fields, _ = run_graph("tfrecord", urls, [("decode", {})], split_opts=JPG)
tar_keys, tar_fields, _ = run_graph("tar", "::".join(tars), [("decode", {}), ("rename", dict(names="jpg,label=cls"))])
check(tf_keys == [str(i % 4) for i in range(N)], f"keys are the records' indices: {tf_keys}")
check(tf_keys == tar_keys, "the same keys as the tar shards")
check(tf_fields["jpg"].shape == (N, 16, 16, 3) and np.array_equal(tf_fields["jpg"], tar_fields["jpg"]),
      "decoded JPEG bytes equal the tar shards' decoded members")
want_labels = np.array([s["label"][0] for s in samples], dtype=np.int64)
check(tf_fields["label"].dtype == np.int64 and np.array_equal(tf_fields["label"], want_labels)
      and np.array_equal(tar_fields["label"], want_labels), "int64_list of one value: an int64 scalar per sample")
want_bbox = np.array([s["bbox"] for s in samples], dtype=np.float32)
check(tf_fields["bbox"].dtype == np.float32 and np.array_equal(tf_fields["bbox"], want_bbox),
      "float_list: float32 [4] per sample")

# tfrecord_key: an int64 feature keys the samples and is no field.
keys, fields, _ = run_graph("keyed", plain, [("decode", {})], split_opts=dict(tfrecord_key="label", **JPG))
check(keys == [str(s["label"][0]) for s in samples[:4]] and "label" not in fields, f"tfrecord_key: {keys}")

# Damage, each in a copy of the plain shard: the error names the shard and the record's byte offset.
offsets = [0]
for s in samples[:4]:
    offsets.append(offsets[-1] + len(record(example(s))))
whole = parts[0]


def damaged(name, data):
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def flip(data, at):
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]


cases = [
    # name, bytes, keys still read, message
    ("data_crc.tfrecord", flip(whole, offsets[1] + 12 + 5), ["0", "2", "3"], "data fails its CRC32C"),
    ("length_crc.tfrecord", flip(whole, offsets[2] + 9), ["0", "1"], "length fails its CRC32C"),
    ("cut.tfrecord", whole[:offsets[3] - 3], ["0", "1"], "truncated"),
]
for name, data, want_keys, message in cases:
    path = damaged(name, data)
    bad_at = offsets[1] if name.startswith("data") else offsets[2]
    keys, fields, err = run_graph(name, path, [("decode", {})], split_opts=JPG, error_policy="skip")
    check(keys == want_keys, f"{name}: samples read {keys}, expected {want_keys}")
    check(f"{path} @ byte {bad_at}" in err and message in err, f"{name}: error names shard and offset:\n{err}")
    _, _, err = run_graph(name + "-fail", path, [("decode", {})], split_opts=JPG, error_policy="fail", expect=1)
    check(f"{path} @ byte {bad_at}" in err, f"{name}: error_policy fail stops with it:\n{err}")

# shardflow ls lists TFRecord shards too: one line per record with its offset.
p = run(["ls", "--json", plain])
import json  # noqa: E402
listed = [json.loads(line) for line in p.stdout.splitlines()]
check([(x["__key__"], x["offset"]) for x in listed] == [(str(i), offsets[i]) for i in range(4)],
      f"ls: {p.stdout}")

check.done("tfrecord")
