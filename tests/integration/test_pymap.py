"""Python map functions (type: python): the map's output equals NumPy's on the tarfile-read samples,
bytes in and out, None drops (counted), exceptions become error records with the key (skip goes on,
fail stops; SystemExit, KeyboardInterrupt and GeneratorExit stop it and reach the trainer's thread),
function: "pkg.module:fn" resolves, refused in a group and by `shardflow run`, and fn
runs on its own thread while the pool keeps stepping the other stages."""
import ctypes
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
from sfutil import Checks, make_dataset, run, write_graph  # noqa: E402

import shardflow  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-pymap-")
SHARDS, PER_SHARD = 4, 25
urls, _ = make_dataset(tmp, shards=SHARDS, per_shard=PER_SHARD)


def tar_samples():
    """{key: {field: bytes}} read with Python's tarfile, independent of the engine."""
    out = {}
    for s in range(SHARDS):
        with tarfile.open(os.path.join(tmp, f"shard-{s:06d}.tar")) as tf:
            for m in tf.getmembers():
                key, field = m.name.split(".", 1)
                out.setdefault(key, {})[field] = tf.extractfile(m).read()
    return out


def ppm_array(data):
    """A binary PPM (P6, maxval 255) as uint8 [H,W,3], parsed with NumPy."""
    f = io.BytesIO(data)
    magic, (w, h), _ = f.readline(), map(int, f.readline().split()), f.readline()
    assert magic.strip() == b"P6"
    return np.frombuffer(f.read(), np.uint8).reshape(h, w, 3)


raw = tar_samples()
LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def graph(name, python_opts, decode_first=True, **settings):
    stages = [("shard_source", dict(urls=urls)), ("tar_split", {})]
    stages += [("decode", {}), ("python", python_opts)] if decode_first else [("python", python_opts), ("decode", {})]
    stages += [("batch", dict(batch_size=8, partial=True)), ("device_sink", {})]
    settings.setdefault("seed", 3)
    settings.setdefault("epochs", 1)
    return write_graph(os.path.join(tmp, name + ".yaml"), stages, **settings)


def collect(p):
    """{key: {field: value}} of one epoch. (A Pipeline reads ahead into the next epoch unless its epochs
    argument ends it: pass epochs=1 where stats() are to count one epoch.)"""
    out = {}
    for b in p:
        for j, key in enumerate(b["__key__"]):
            out[key] = {k: v[j] for k, v in b.items() if k != "__key__"}
    return out


# 1. Decoded tensors in (read-only views), new tensors out, compared with NumPy on the tarfile data.
seen_threads = set()


def luma(s):
    seen_threads.add(threading.current_thread().name)
    check(not s["ppm"].flags.writeable, "views are read-only")
    return {"ppm": s["ppm"], "gray": s["ppm"].astype(np.float32) @ LUMA, "cls": s["cls"] * 3 + 1,
            "__key__": s["__key__"]}


with shardflow.Pipeline(graph("views", {}), map={"python": luma}, output="dict") as p:
    got = collect(p)
check(set(got) == set(raw), f"every sample mapped once: {len(got)} of {len(raw)}")
for key, fields in raw.items():
    img = ppm_array(fields["ppm"])
    check(np.array_equal(got[key]["ppm"], img), f"{key}: the unchanged view passes on")
    check(np.allclose(got[key]["gray"], img.astype(np.float32) @ LUMA, rtol=1e-6), f"{key}: gray equals NumPy's")
    check(int(got[key]["cls"]) == int(fields["cls"]) * 3 + 1, f"{key}: label mapped")
check(seen_threads == {"shardflow-map-python"}, f"fn ran on its own thread only: {seen_threads}")

# 2. Encoded fields in as bytes, bytes out (decoded downstream); None drops, counted as filtered (not skipped: no error).
def relabel(s):
    check(isinstance(s["cls"], bytes) and isinstance(s["ppm"], bytes), "encoded fields arrive as bytes")
    if int(s["__key__"]) % 5 == 0:
        return None
    return {"ppm": s["ppm"], "cls": str(int(s["cls"]) + 10).encode()}


with shardflow.Pipeline(graph("bytes", {}, decode_first=False), map={"python": relabel}, output="dict", epochs=1) as p:
    got = collect(p)
    stats = {node['name']: node for node in p.stats()}
kept = {k for k in raw if int(k) % 5}
check(set(got) == kept, f"None dropped {len(raw) - len(kept)} samples: kept {len(got)}")
for key in kept:
    check(int(got[key]["cls"]) == int(raw[key]["cls"]) + 10, f"{key}: bytes out decoded downstream")
    check(np.array_equal(got[key]["ppm"], ppm_array(raw[key]["ppm"])), f"{key}: image intact")
check(stats["python"]["filtered"] == len(raw) - len(kept) and stats["python"]["skipped"] == 0
      and stats["python"]["errors"] == 0, f"drops counted as filtered, no error records: {stats['python']}")
check(stats["python"]["items"] == len(kept), f"output counted: {stats['python']}")

# 3. An exception is an error record with the key, the exception's type and message.
BAD = "0000042"


def picky(s):
    if s["__key__"] == BAD:
        raise ValueError(f"cannot map {s['__key__']}")
    return {"ppm": s["ppm"], "cls": s["cls"]}


with shardflow.Pipeline(graph("skip", {}, error_policy="skip"), map={"python": picky}, output="dict", epochs=1) as p:
    got = collect(p)
    stats = {node['name']: node for node in p.stats()}
    err = shardflow._Error()
    check(shardflow.library.sf_pipeline_last_error(p._pipeline, err), "skip: an error record exists")
check(set(got) == set(raw) - {BAD}, "skip: every other sample arrives")
check(stats["python"]["errors"] == 1 and stats["python"]["skipped"] == 1, f"skip: counted {stats['python']}")
check(err.key.decode() == BAD and b"ValueError: cannot map 0000042" in err.message,
      f"the record names the key and the exception: {err.key} {err.message}")

try:
    with shardflow.Pipeline(graph("fail", {}, error_policy="fail"), map={"python": picky}, output="dict") as p:
        collect(p)
    check(False, "fail policy: the pipeline stops")
except shardflow.ShardflowError as e:
    check(BAD in str(e) and "ValueError" in str(e), f"fail policy: stops with the record: {e}")


# A function that fails on every sample with the same exception: the code is wrong, not the input, and the
# message says so (before: "check the shard list, the credentials..." / "fix the input").
def broken(s):
    return {"ppm": s["image"], "cls": s["cls"]}  # KeyError: 'image' for every sample


for rate in (0.5, 1):  # the error budget stops it, or the empty epoch does
    p = shardflow.Pipeline(graph(f"broken-{rate}", {}, max_error_rate=rate), map={"python": broken}, output="dict")
    try:
        collect(p)
        check(False, f"max_error_rate {rate}: a map failing on every sample stops the pipeline")
    except shardflow.ShardflowError as e:
        check("every sample failed in python with the same error: python map broken raised KeyError: 'image'" in str(e)
              and "the stage's code or options are wrong, not the input" in str(e) and "fix the input" not in str(e)
              and "shard list" not in str(e), f"max_error_rate {rate}: the message blames the function: {e}")
        time.sleep(0.2)  # records of steps still running land meanwhile
        try:
            p.next_batch()
        except shardflow.ShardflowError as again:
            check(str(again) == str(e), f"the verdict stays what stopped the run, not a later record: {again}")
    finally:
        p.close()

# 4. function: "pkg.module:fn" resolves a module on sys.path.
pkg = os.path.join(tmp, "mods", "mymaps")
os.makedirs(pkg)
open(os.path.join(pkg, "__init__.py"), "w").close()
with open(os.path.join(pkg, "fns.py"), "w") as f:
    f.write("def invert(s):\n    return {'ppm': 255 - s['ppm'], 'cls': s['cls']}\n")
sys.path.insert(0, os.path.join(tmp, "mods"))
with shardflow.Pipeline(graph("module", {"function": '"mymaps.fns:invert"'}), output="dict") as p:
    got = collect(p)
check(all(np.array_equal(got[k]["ppm"], 255 - ppm_array(raw[k]["ppm"])) for k in raw), "module function ran")
try:
    shardflow.Pipeline(graph("nomodule", {"function": '"mymaps.nope:f"'}), output="dict")
    check(False, "a missing module is refused")
except ValueError as e:
    check("'python'" in str(e) and "mymaps.nope:f" in str(e), f"names the node and the function: {e}")

# 5. Refused inside a group (names the node) and by the CLI (says to run it from Python).
grouped = graph("grouped", {"function": '"mymaps.fns:invert"', "group": "decoders"})
with open(grouped) as f:
    text = f.read()
with open(grouped, "w") as f:
    f.write("groups:\n  decoders:\n    processes: 1\n" + text)
try:
    shardflow.Pipeline(grouped, output="dict")
    check(False, "a python node in a group is refused")
except shardflow.ShardflowError as e:
    check("node 'python' (python) cannot run in group 'decoders': its Python function runs" in str(e)
          and "grouped.yaml:" in str(e),
          f"group refusal names the node and the line: {e}")
cli = run(["run", graph("cli", {"function": '"mymaps.fns:invert"'}), "--quiet", "--no-summary"], check=False)
check(cli.returncode != 0 and "shardflow.Pipeline" in cli.stderr and "'python'" in cli.stderr,
      f"shardflow run refuses type: python: {cli.stderr}")

# 6. Its own thread: while fn holds the GIL for 0.5 s on the first sample (a PyDLL call keeps it),
# shards keep arriving (each behind a 0.1 s pipe, read on one of the two pool threads) and the other
# pool thread decodes them into the python node's queue. A node that waited for fn, or pool threads
# that needed the GIL, would let nothing through meanwhile (short queues: no slack upstream).
os.makedirs(os.path.join(tmp, "many"))
make_dataset(os.path.join(tmp, "many"), shards=8, per_shard=25)
many_urls = "pipe:sleep 0.1; cat " + os.path.join(tmp, "many", "shard-{000000..000007}.tar")
libc = ctypes.PyDLL(None)
holder, progress = [], {}


def hold_gil(s):
    if not progress:
        while not holder:
            time.sleep(0.01)
        before = {node['name']: node for node in holder[0].stats()}
        libc.usleep(500000)
        after = {node['name']: node for node in holder[0].stats()}
        progress.update({k: after[k]["items"] - before[k]["items"] for k in ("decode", "python")})
    return {"ppm": s["ppm"], "cls": s["cls"]}


slow = write_graph(os.path.join(tmp, "slow.yaml"), [
    ("shard_source", dict(urls=many_urls, allow_pipe=True)), ("tar_split", {}), ("decode", {}),
    ("python", dict(in_flight=256)), ("batch", dict(batch_size=8, partial=True)), ("device_sink", {})],
    seed=1, epochs=1, threads=2, queue_size=4)
p = shardflow.Pipeline(slow, map={"python": hold_gil}, output="dict")
holder.append(p)
got = collect(p)
p.close()
check(len(got) == 200, f"all samples through: {len(got)}")
check(progress["python"] == 0 and progress["decode"] >= 8,
      f"decode went on while fn held the GIL: {progress}")

# 7. SystemExit, KeyboardInterrupt and GeneratorExit (not Exceptions) from fn stop the pipeline whatever its
# error_policy and reach the trainer's thread: the first two as themselves (Ctrl-C in a map, sys.exit(7)),
# the other as ShardflowError caused by it. Each in a process of its own: a hang shows as a timeout.
for policy in ("skip", "fail"):
    stopping = graph(f"stopping-{policy}", {}, error_policy=policy)
    for raised, want in (("KeyboardInterrupt('in the map')", "KeyboardInterrupt None"),
                         ("SystemExit(7)", "SystemExit None 7"),
                         ("GeneratorExit()", "ShardflowError GeneratorExit SF_ECANCELED")):
        script = f"""
import sys, threading
sys.path.insert(0, {os.path.join(os.environ["SF_SOURCE_ROOT"], "python")!r})
import shardflow
def fn(s):
    if s["__key__"] == {BAD!r}:
        raise {raised}
    return {{"ppm": s["ppm"], "cls": s["cls"]}}
p = shardflow.Pipeline({stopping!r}, map={{"python": fn}}, output="dict")
n = 0
try:
    for b in p:
        n += len(b["__key__"])
    print("ended after", n)
except BaseException as e:
    print(type(e).__name__, type(e.__cause__).__name__ if e.__cause__ else None, getattr(e, "code", "") or "",
          threading.current_thread() is threading.main_thread())
    print(e)
p.close()
"""
        try:
            proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
            lines = proc.stdout.splitlines()
        except subprocess.TimeoutExpired as e:
            proc, lines = None, [f"hung for 30 s: {e.stdout!r}"]
        check(proc is not None and proc.returncode == 0 and len(lines) == 2
              and lines[0].split() == want.split() + ["True"],
              f"{policy}: fn raising {raised}: want {want!r} in the trainer's thread, got {lines} "
              f"{proc and proc.stderr[-1500:]}")
        if want.startswith("ShardflowError"):
            check(len(lines) == 2 and BAD in lines[1] and "GeneratorExit" in lines[1],
                  f"{policy}: the error names the key and the exception: {lines}")

# 8. Token documents made by a map (int64 arrays of any length) packed by pack: the segments of the packed
# sequences are exactly the documents NumPy makes from the tarfile data, each once, at positions 0.. .
def doc_of(img, label):
    return img.reshape(-1)[:5 + 9 * label].astype(np.int64) + 1


packed_graph = write_graph(os.path.join(tmp, "packed.yaml"), [
    ("shard_source", dict(urls=urls)), ("tar_split", {}), ("decode", {}), ("python", {}),
    ("pack", dict(field="tokens", length=100, buffer=16, dtype="int64")),
    ("batch", dict(batch_size=4, partial=True)), ("device_sink", {})], seed=3, epochs=1)
with shardflow.Pipeline(packed_graph, map={"python": lambda s: {"tokens": doc_of(s["ppm"], int(s["cls"]))}},
                        output="dict", epochs=1) as p:
    segments = []
    for b in p:
        tokens, seg, pos = (np.asarray(b[k]) for k in ("tokens", "tokens.segment_ids", "tokens.positions"))
        check(tokens.shape[1:] == (100,) and tokens.dtype == np.int64, f"packed rows: {tokens.shape} {tokens.dtype}")
        for j in range(len(tokens)):
            for k in range(1, int(seg[j].max()) + 1):
                check(list(pos[j][seg[j] == k]) == list(range(int((seg[j] == k).sum()))), "positions 0.. per document")
                segments.append(tuple(tokens[j][seg[j] == k]))
want = [tuple(doc_of(ppm_array(f["ppm"]), int(f["cls"]))) for f in raw.values()]
check(sorted(segments) == sorted(want), f"packed segments are the map's documents: {len(segments)} of {len(want)}")

shutil.rmtree(tmp)
print("thread proof:", progress)
check.done("pymap")
