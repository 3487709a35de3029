"""device_sink's device: cuda through the real stage, executor and Python binding, on a fake CUDA driver
(tests/plugins/fake_cuda.c: device memory is host memory, read here through the DLPack data pointer): the
batches equal the CPU path's (copied, and normalised on the "device" against augment's float32/bfloat16), the
DLPack stream contract (the consumer's stream waits, the release is recorded on it), at most `prefetch`
batches ahead of the trainer, every buffer back after many batches and nothing held at the end, and an
allocation failure as a clean error. The same on a real GPU: tests/gpu/run.sh."""
import ctypes
import gc
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
os.environ["SF_CUDA_LIBRARY"] = os.environ["SF_FAKE_CUDA"]  # read when the first cuda pipeline starts
from sfutil import Checks, make_dataset, wait_for, write_graph  # noqa: E402

import shardflow  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-device-sink-")
urls, truth = make_dataset(tmp, shards=4, per_shard=25)
fake = ctypes.CDLL(os.environ["SF_FAKE_CUDA"])  # the same loaded library as the engine's dlopen: its counters
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]
NAMES = ["device", "pinned", "events", "streams", "contexts", "copies", "waits", "releases", "pushed"]


def counts():
    out, streams = (ctypes.c_long * 9)(), (ctypes.c_size_t * 2)()
    fake.fake_cuda_counts(out, streams)
    return dict(zip(NAMES, out), wait_stream=streams[0], release_stream=streams[1])


def graph(name, dtype, sink, batch_size=16, epochs=1):
    return write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls)),
        ("tar_split", {}),
        ("decode", {}),
        ("augment", dict(crop="random", size=8, padding=2, flip=0.5, dtype=dtype, layout="chw",
                         **({} if dtype == "uint8" else dict(mean=MEAN, std=STD)))),
        ("batch", dict(batch_size=batch_size, partial=False)),
        ("device_sink", sink),
    ], seed=7, epochs=epochs)


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


def raw(field):
    """(device, shape, the bytes) of a producer's tensor, read at its data pointer (fake device memory is host
    memory), before it is handed over."""
    t = DLTensor.from_address(field._managed)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    n = int(np.prod(shape)) * t.bits // 8
    return (t.device_type, t.device_id), shape, ctypes.string_at(t.data + t.byte_offset, n)


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def consume(field, stream):
    """What a consumer does: __dlpack__(stream=...), then frees the tensor when done with it."""
    capsule = field.__dlpack__(stream=stream)
    shardflow.library.sf_dlpack_release(_get_pointer(capsule, b"dltensor"))


def host_batches(path, n=None):
    """Every batch of a CPU run as {field: (shape, bytes)} and its keys."""
    out = []
    with shardflow.Pipeline(path, output="dlpack", epochs=1) as p:
        for b in p:
            out.append(({k: raw(v)[1:] for k, v in b.items() if k != "__key__"}, b["__key__"]))
            if n and len(out) == n:
                break
    return out


# Copied as they are: every field's bytes and shape, on (kDLCUDA, 0); the consumer's stream waited for the
# copy, and the release was recorded on that stream.
ref = host_batches(graph("cpu", "float32", {}))
check(len(ref) == 6, f"{len(ref)} batches of 16 from 100 samples")
before = counts()
with shardflow.Pipeline(graph("gpu", "float32", dict(device="cuda:0")), output="dlpack", epochs=1) as p:
    got = 0
    for i, b in enumerate(p):
        fields, keys = ref[i]
        check(b["__key__"] == keys, f"batch {i}: keys")
        for name, field in b.items():
            if name == "__key__":
                continue
            device, shape, data = raw(field)
            check(device == (2, 0) and field.__dlpack_device__() == (2, 0), f"batch {i} {name}: on cuda:0 ({device})")
            check((shape, data) == fields[name], f"batch {i} {name}: the CPU path's bytes {shape}")
            consume(field, 0x5000 + i)
            c = counts()
            check(c["wait_stream"] == 0x5000 + i, f"batch {i} {name}: the consumer's stream waited: {c}")
        # the batch's buffer is free once its last tensor is: its release is ordered after the consumer's stream
        check(counts()["release_stream"] == 0x5000 + i, f"batch {i}: the release recorded on its stream")
        got += 1
check(got == 6, f"{got} batches on the device")
c = counts()
check(c["copies"] - before["copies"] == 6, f"one copy a batch: {c['copies'] - before['copies']}")
check(c["waits"] - before["waits"] == 12 and c["releases"] - before["releases"] == 6,
      f"one wait a field, one release a batch: {c}")
gc.collect()
c = counts()
check(all(c[k] == 0 for k in ("device", "pinned", "events", "streams", "contexts", "pushed")),
      f"nothing held once the pipeline and its tensors are gone: {c}")

# Normalised on the device: uint8 batches in, augment's float32 / bfloat16 values out, bit for bit.
for dtype in ("float32", "bfloat16"):
    ref = host_batches(graph("cpu-" + dtype, dtype, {}))
    sink = dict(device="cuda", normalize=dtype, mean=MEAN, std=STD)
    with shardflow.Pipeline(graph("norm-" + dtype, "uint8", sink), output="dlpack", epochs=1) as p:
        batches = list(p)
    check(len(batches) == len(ref), f"normalize {dtype}: {len(batches)} batches")
    for i, (b, (fields, keys)) in enumerate(zip(batches, ref)):
        device, shape, data = raw(b["ppm"])
        check(device == (2, 0) and (shape, data) == fields["ppm"], f"normalize {dtype}: batch {i} equals augment's "
              f"{dtype} {fields['ppm'][0]} ({shape})")
        check(raw(b["cls"])[1:] == fields["cls"], f"normalize {dtype}: batch {i} labels")
    del batches, b

# prefetch: 2 batches copied ahead of the trainer, however much room the output queue has; taking one lets
# one more be copied.
start = counts()["copies"]  # the pipeline starts copying as soon as it is made
with shardflow.Pipeline(graph("ahead", "float32", dict(device="cuda", prefetch=2), batch_size=4), output="dlpack",
                        epochs=1) as p:
    # Each count is waited for (a loaded machine may be slow to copy), then 0.3 s more, in which a copy too many
    # would show.
    copies = lambda: counts()["copies"] - start
    wait_for(lambda: copies() >= 2, 30, "two batches copied ahead")
    time.sleep(0.3)
    waiting = copies()
    first = p.next_batch()
    wait_for(lambda: copies() >= 3, 30, "one more batch copied after one was taken")
    time.sleep(0.3)
    ahead = copies()
    second = p.next_batch()
    wait_for(lambda: copies() >= 4, 30, "one more again")
    time.sleep(0.3)
    after = copies()
    check(waiting == 2 and ahead == 3 and after == 4,
          f"prefetch 2 copied before the trainer asks: {waiting}; one taken: {ahead}; one more taken: {after}")
    del first, second

# Many batches dropped as they come: the buffers are reused (counted by the sink), all back at the end.
path = graph("many", "float32", dict(device="cuda", prefetch=2), batch_size=4, epochs=8)
with shardflow.Pipeline(path, output="dlpack") as p:
    n = 0
    for epoch in range(8):
        for b in p:
            for name, field in b.items():
                if name != "__key__":
                    consume(field, 0x7000)
            n += 1
    held = counts()
    stats = {s["name"]: s for s in p.stats()}["device_sink"].get("counters", {})
check(n == 200, f"{n} batches")
check(0 < stats.get("gpu_buffers_allocated", 0) <= 6 and 0 < stats.get("pinned_buffers_allocated", 0) <= 4,
      f"buffers reused: {stats}")
check(held["device"] <= 6, f"device buffers held while running: {held['device']}")
gc.collect()
c = counts()
check(all(c[k] == 0 for k in ("device", "pinned", "events", "streams", "contexts", "pushed")), f"nothing held: {c}")

# Out of device memory: a clean error naming the device and what to lower, not a crash.
fake.fake_cuda_fail_allocs(1000)
try:
    with shardflow.Pipeline(graph("oom", "float32", dict(device="cuda:0")), output="dlpack", epochs=1) as p:
        list(p)
    check(False, "a run without device memory succeeded")
except shardflow.ShardflowError as e:
    check("cuda:0: cannot allocate" in str(e) and "lower batch_size" in str(e), f"out of device memory: {e}")
fake.fake_cuda_fail_allocs(0)
gc.collect()
c = counts()
check(all(c[k] == 0 for k in ("device", "pinned", "events", "streams", "contexts", "pushed")),
      f"nothing held after the failure: {c}")

# NumPy outputs refuse GPU batches with the reason.
try:
    with shardflow.Pipeline(graph("numpy", "float32", dict(device="cuda")), output="dict", epochs=1) as p:
        p.next_batch()
    check(False, "numpy output of a GPU batch")
except shardflow.ShardflowError as e:
    check("NumPy takes host memory only" in str(e), f"numpy output: {e}")
check.done("device_sink on a fake CUDA driver")
