"""The Python binding: batches equal the device sink's dumps, arrive without a copy (DLPack), outlive
their pipeline, take both __dlpack__ call forms, map keyword arguments to stage options, and report
errors with their file:line."""
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
from sfutil import Checks, make_dataset, read_batches, run, write_graph, write_shard  # noqa: E402

import shardflow  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-python-")
urls, truth = make_dataset(tmp, shards=4, per_shard=25)
out = os.path.join(tmp, "npy")
graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=urls)),
    ("tar_split", {}),
    ("decode", {}),
    ("augment", dict(crop="random", size=8, padding=2, flip=0.5, mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])),
    ("shuffle", dict(buffer_size=30)),
    ("batch", dict(batch_size=16)),
    ("device_sink", dict(npy_dir=out)),
], seed=5, epochs=2)
run(["run", graph, "--quiet", "--no-summary"])
reference = read_batches(out)

# Same batches as the CLI's run of the same graph, epoch by epoch, as NumPy arrays.
with shardflow.Pipeline(graph, output="dict") as p:
    got = []
    for epoch in range(2):
        check(p.epoch == epoch, f"epoch {epoch}")
        for b in p:
            got.append(b)
        check(p.step == 0 and p.epoch == epoch + 1, "the epoch ended")
check(len(got) == len(reference), f"{len(got)} batches, as the CLI ({len(reference)})")
for b, (e, i, keys, fields) in zip(got, reference):
    check(b["__key__"] == keys, f"epoch {e} batch {i}: keys")
    check(np.array_equal(b["ppm"], fields["ppm"]) and b["ppm"].dtype == np.float32, "images equal the dump")
    check(np.array_equal(b["cls"], fields["cls"]) and b["cls"].dtype == np.int64, "labels equal the dump")
    check(b["ppm"].shape == (len(keys), 3, 8, 8), "images are [B,3,8,8]")

# A trainer embedding a graph with a group: the head starts its local workers from the shardflow CLI found
# next to libshardflow (SHARDFLOW_BIN unset), and the batches are the same.
grouped = os.path.join(tmp, "grouped.yaml")
with open(graph) as f:
    text = f.read().replace("  - type: decode\n", "  - type: decode\n    group: decoders\n")
    text = text.replace("  - type: augment\n", "  - type: augment\n    group: decoders\n")
with open(grouped, "w") as f:
    f.write("groups:\n  decoders:\n    processes: 2\n" + text)
env_bin = os.environ.pop("SHARDFLOW_BIN", None)
with shardflow.Pipeline(grouped, output="dict", device_sink__npy_dir="") as p:
    got = [b for _ in range(2) for b in p]
    # The group's statistics reach Python as they reach the CLI (the stage's stats callback): its node, its local
    # workers that joined (one or both, as fast as they start: processes this one started, /proc says whose child
    # each is) and what each one ran.
    group = {n["name"]: n for n in p.stats()}.get("decoders", {})
    workers = group.get("group", {}).get("workers", [])
    parents = []
    for w in workers:
        try:
            with open(f"/proc/{w['pid']}/stat") as f:
                parents.append(int(f.read().rsplit(")", 1)[1].split()[1]))
        except OSError:
            parents.append(None)
    check(group.get("type") == "_group" and 1 <= len(workers) <= 2 and parents == [os.getpid()] * len(workers) and
          1 <= group["group"]["live"] <= 2,
          f"group stats: the node and its local workers: {group} {parents}")
    # A worker that joined after the other had taken every unit of this small dataset served none and has no
    # table yet; every worker that served samples has its own, and at least one served.
    check(any(w["samples"] > 0 for w in workers) and
          all({s["name"] for s in w["stages"]} >= {"decode", "augment"} for w in workers if w["samples"] > 0),
          f"group stats: each worker's own stage table: {workers}")
    # Every sample the node passed on came from a worker (it may hold more, done ahead), and a worker's own table
    # (reported with each result) counts at least what the head took from it.
    made = [sum(s["items"] for s in w["stages"] if s["name"] == "augment") for w in workers]
    check(group["items"] <= sum(w["samples"] for w in workers) and all(
          w["samples"] <= m for w, m in zip(workers, made)), f"group stats: the node's {group['items']} samples, "
          f"the workers' {[w['samples'] for w in workers]}, their augment's {made}")
check(len(got) == len(reference), f"group: {len(got)} batches, as the CLI ({len(reference)})")
for b, (e, i, keys, fields) in zip(got, reference):
    check(b["__key__"] == keys and np.array_equal(b["ppm"], fields["ppm"]), f"group: epoch {e} batch {i} equal")
if env_bin is not None:
    os.environ["SHARDFLOW_BIN"] = env_bin

# No copy: the arrays view memory they do not own (the engine's batch buffer), and they stay
# valid after the pipeline is gone.
p = shardflow.Pipeline(graph, epochs=1, output="numpy")
images, labels = p.next_batch()
check(not images.flags.owndata and not labels.flags.owndata, "NumPy views the engine's buffer")
first = images.copy()
p.close()
del p
check(np.array_equal(images, first), "a batch outlives its pipeline")

# The protocol both ways: NumPy 1.24 calls __dlpack__() without max_version; newer callers pass it.
p = shardflow.Pipeline(graph, epochs=1, output="numpy")
b = shardflow.library
field = None
import ctypes  # noqa: E402
raw = ctypes.c_void_p()
check(b.sf_pipeline_next(p._pipeline, ctypes.byref(raw), -1.0) == 0, "a raw batch")
managed = ctypes.c_void_p()
check(b.sf_batch_to_dlpack(raw, 0, ctypes.byref(managed)) == 0, "export")
field = shardflow._Field(managed.value)
cap = field.__dlpack__(stream=None, max_version=(1, 0))
check(type(cap).__name__ == "PyCapsule", "a capsule with max_version")
del cap  # never consumed: the buffer stays referenced (documented; from_dlpack always consumes)
b.sf_batch_destroy(ctypes.byref(raw))
p.close()

# output="dlpack": each field as a DLPack producer (what a GPU trainer hands to jax.dlpack / torch.from_dlpack),
# here on the CPU: __dlpack_device__ (kDLCPU, 0), exported once, the same values as the dict form.
with shardflow.Pipeline(graph, epochs=1, output="dlpack", device_sink__npy_dir="") as p:
    d = p.next_batch()
check(d["__key__"] == reference[0][2], f"dlpack output: the keys of the first batch: {d['__key__']}")
check(d["ppm"].__dlpack_device__() == (1, 0), f"a CPU field: {d['ppm'].__dlpack_device__()}")
img = np.from_dlpack(d["ppm"])
check(np.array_equal(img, reference[0][3]["ppm"]) and not img.flags.owndata, "dlpack output: the batch, no copy")
try:
    d["ppm"].__dlpack__()
    check(False, "a field exported twice")
except BufferError as e:
    check("once" in str(e), f"exported once: {e}")
try:
    d["cls"].__dlpack__(copy=True)
    check(False, "copy=True accepted")
except BufferError as e:
    check("without a copy" in str(e), f"copy=True: {e}")
check(np.array_equal(np.from_dlpack(d["cls"]), reference[0][3]["cls"]), "the labels after a refused export")

# Keyword arguments are stage options; an ambiguous or unknown one is refused with the reason.
with shardflow.Pipeline(graph, epochs=1, output="dict", batch_size=50, device_sink__npy_dir="") as p:
    sizes = [len(b["__key__"]) for b in p]
check(sizes == [50, 50], f"batch_size=50 reached the batch stage: {sizes}")
try:
    shardflow.Pipeline(graph, batch_sise=3)
    check(False, "an unknown option is refused")
except shardflow.ShardflowError as e:
    check("batch_sise" in str(e) and e.code == "SF_EOPTION", f"unknown option: {e}")
bad = os.path.join(tmp, "bad.yaml")
with open(bad, "w") as f:
    f.write("stages:\n  - type: shard_source\n    urls: x\n  - type: tar_splitt\n")
try:
    shardflow.Pipeline(bad)
    check(False, "a bad graph is refused")
except shardflow.ShardflowError as e:
    check(f"{bad}:4" in str(e) and "tar_split" in str(e), f"graph error names file:line: {e}")
# A string without a newline that names no file is a missing graph file, not YAML text.
for missing in ("nonexistent.yaml", os.path.join(tmp, "no-dir", "g.yaml"), pathlib.Path(tmp, "missing.yaml")):
    try:
        shardflow.Pipeline(missing)
        check(False, f"{missing}: a missing graph file is refused")
    except shardflow.ShardflowError as e:
        check(e.code == "SF_ENOENT" and f"{missing}: cannot open the graph file" in str(e),
              f"{missing}: the error names the missing file: {e.code} {e}")
check.done("python")

check_int = Checks()
# Ctrl-C reaches a trainer blocked in next_batch(): here on a shard from a server that accepts
# connections and never answers.
stalled = socket.socket()
stalled.bind(("127.0.0.1", 0))
stalled.listen(16)
stalled_graph = (f"stages: [{{type: shard_source, urls: 'http://127.0.0.1:{stalled.getsockname()[1]}/s.tar'}},\n"
                 "  {type: tar_split}, {type: batch}, {type: device_sink}]\n")
trainer = subprocess.Popen([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {os.path.join(os.environ["SF_SOURCE_ROOT"], "python")!r})
import shardflow
p = shardflow.Pipeline({stalled_graph!r})
print("waiting", flush=True)
try:
    p.next_batch()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
check_int(trainer.stdout.readline() == "waiting\n", "the trainer started")
time.sleep(1)  # well inside next_batch()
trainer.send_signal(signal.SIGINT)
start = time.monotonic()
line = [None]
reader = threading.Thread(target=lambda: line.__setitem__(0, trainer.stdout.readline()), daemon=True)
reader.start()
reader.join(5)
took = time.monotonic() - start
try:
    trainer.wait(30)
except subprocess.TimeoutExpired:
    trainer.kill()
    trainer.wait()
check_int(line[0] == "interrupted\n" and took < 2,
          f"KeyboardInterrupt in next_batch() after {took:.1f} s: {line[0]!r} {trainer.stderr.read()[-2000:]}")
check_int(trainer.returncode == 0, f"the interrupted trainer exits (status {trainer.returncode})")
stalled.close()
check_int.done("python interrupt")

# A pipeline used after close() raises shardflow.ClosedError naming the graph, never a crash: every public
# method and property, each in its own process so that a segfault shows as its status (-11).
check_closed = Checks()
PYDIR = os.path.join(os.environ["SF_SOURCE_ROOT"], "python")
CLOSED_CALLS = {
    "epoch": "p.epoch", "step": "p.step", "state_dict": "p.state_dict()", "set_epoch": "p.set_epoch(1)",
    "load_state_dict": "p.load_state_dict({'epoch': 0, 'step': 1, 'rank': 0, 'world_size': 1})",
    "stats": "p.stats()", "fileno": "p.fileno()", "next_batch": "p.next_batch()", "__iter__": "next(iter(p))",
    "metrics_port": "p.metrics_port", "bottleneck": "p.bottleneck()", "__len__": "len(p)",
    "__enter__": "p.__enter__()", "close": "p.close()",
}
public = {n for n in dir(shardflow.Pipeline) if not n.startswith("_")} | {"__iter__", "__len__", "__enter__"}
check_closed(public <= set(CLOSED_CALLS), f"every public name is tried after close(): {public - set(CLOSED_CALLS)}")
closed_runs = {name: subprocess.Popen([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {PYDIR!r})
import shardflow
p = shardflow.Pipeline({graph!r}, output="numpy", device_sink__npy_dir="", samples_per_epoch=40)
p.next_batch()
p.close()
try:
    value = {expr}
    print("returned", repr(value))
except Exception as e:
    print("raised", type(e).__name__, isinstance(e, shardflow.ShardflowError), e)
"""], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name, expr in CLOSED_CALLS.items()}
for name, proc in closed_runs.items():
    out, err = proc.communicate(timeout=60)
    want = "returned None\n" if name == "close" else f"raised ClosedError True pipeline '{graph}' is closed\n"
    check_closed(proc.returncode == 0 and out == want,
                 f"{name} after close(): status {proc.returncode}, {out!r} (want {want!r}) {err[-1500:]}")

# close() from another thread while this one iterates and three more read state_dict() in a loop: the
# iterator is woken and raises ClosedError (or ends), nothing is freed under either, and the readers do not
# keep close() waiting for ever (each call that starts once close() began raises at once). Blocked on a stalled server, and
# streaming batches (epochs: 0); three times each (before the fix 6 of 6 crashed).
stalled = socket.socket()
stalled.bind(("127.0.0.1", 0))
stalled.listen(16)
stalled_graph = (f"stages: [{{type: shard_source, urls: 'http://127.0.0.1:{stalled.getsockname()[1]}/s.tar'}},\n"
                 "  {type: tar_split}, {type: batch}, {type: device_sink}]\n")
for what, target, delay in [("stalled", stalled_graph, 0.5), ("streaming", graph, 0.3)] * 3:
    proc = subprocess.run([sys.executable, "-c", f"""
import sys, threading, time
sys.path.insert(0, {PYDIR!r})
import shardflow
p = shardflow.Pipeline({target!r}, output="numpy", epochs=0, device_sink__npy_dir="")
def closer():
    time.sleep({delay})
    p.close()
def checkpointer():  # a hook reading the position and the counters meanwhile, until the close
    try:
        while True:
            p.state_dict(), p.stats(), p.bottleneck()
    except shardflow.ClosedError:
        pass
threading.Thread(target=closer).start()
for _ in range(3):
    threading.Thread(target=checkpointer).start()
t0 = time.monotonic()
try:
    n = sum(1 for _ in iter(p.next_batch, "never"))
    print("ended", n)
except shardflow.ClosedError as e:
    print("raised ClosedError", e)
print("woken after", round(time.monotonic() - t0 - {delay}, 2), "s")
"""], capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    check_closed(proc.returncode == 0 and len(lines) == 2 and (lines[0].startswith("ended")
                 or lines[0].startswith("raised ClosedError pipeline ")),
                 f"{what}: close() from another thread: status {proc.returncode} {proc.stdout!r} {proc.stderr[-1500:]}")
    check_closed(len(lines) == 2 and float(lines[1].split()[2]) < 2.0,
                 f"{what}: the iterator was woken at once: {lines}")

# A run that failed with a timeout of its own (a stalled download under error_policy: fail) raises
# ShardflowError naming it, instead of next_batch() taking it for its own wait slice running out and spinning
# (process CPU time: the engine's threads idle meanwhile, a spin costs most of a core).
fail_graph = ("error_policy: fail\n"
              f"stages: [{{type: shard_source, urls: 'http://127.0.0.1:{stalled.getsockname()[1]}/s.tar'}},\n"
              "  {type: tar_split, stall_timeout: 1s, connect_timeout: 1s, retries: 0},\n"
              "  {type: batch}, {type: device_sink}]\n")
for timeout in (-1, 30):
    proc = subprocess.run([sys.executable, "-c", f"""
import os, sys, threading, time
sys.path.insert(0, {PYDIR!r})
import shardflow
p = shardflow.Pipeline({fail_graph!r}, output="numpy")
t0, c0 = time.monotonic(), time.process_time()
def watchdog():
    time.sleep(8)
    print("no exception after", round(time.monotonic() - t0, 1), "s, cpu", round(time.process_time() - c0, 1), "s",
          flush=True)
    os._exit(3)
threading.Thread(target=watchdog, daemon=True).start()
try:
    p.next_batch(timeout={timeout})
    print("returned")
except Exception as e:
    print(type(e).__name__, getattr(e, "code", None), round(time.monotonic() - t0, 2),
          round(time.process_time() - c0, 2))
    print(e)
"""], capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    ok = proc.returncode == 0 and len(lines) == 2 and lines[0].startswith("ShardflowError SF_ETIMEDOUT ")
    check_closed(ok and "stall_timeout" in lines[1] and float(lines[0].split()[2]) < 6,
                 f"timeout={timeout}: the run's own timeout raises: status {proc.returncode} {proc.stdout!r} "
                 f"{proc.stderr[-800:]}")
    check_closed(ok and float(lines[0].split()[3]) < 0.3 * float(lines[0].split()[2]),
                 f"timeout={timeout}: no spin while waiting (wall s, cpu s): {lines}")
stalled.close()
check_closed.done("python closed / timeout failure")

# state_dict / load_state_dict: a fresh pipeline continues with exactly the remaining batches.
check2 = Checks()
with shardflow.Pipeline(graph, output="dict", device_sink__npy_dir="") as p:
    whole = [b for b in p] + [b for b in p]
with shardflow.Pipeline(graph, output="dict", device_sink__npy_dir="") as p:
    for _ in range(5):
        p.next_batch()
    state = p.state_dict()
check2(state["epoch"] == 0 and state["step"] == 5, f"state after five batches: {state}")
with shardflow.Pipeline(graph, output="dict", device_sink__npy_dir="") as q:
    q.load_state_dict(state)
    rest = [b for b in q] + [b for b in q]
check2(len(rest) == len(whole) - 5, f"{len(rest)} batches remain of {len(whole)}")
for a, b in zip(whole[5:], rest):
    check2(a["__key__"] == b["__key__"] and np.array_equal(a["ppm"], b["ppm"]), "resumed batches are identical")
with shardflow.Pipeline(graph, output="dict", device_sink__npy_dir="", rank=1, world_size=2) as q:
    try:
        q.load_state_dict(state)
        check2(False, "another world size is refused")
    except ValueError as e:
        check2("world size" in str(e), f"refusal says why: {e}")
    q.set_epoch(1)
    check2(q.epoch == 1 and q.step == 0, "set_epoch starts an epoch")
# A state past the run's last epoch is refused when loaded, not a pipeline that silently yields nothing.
with shardflow.Pipeline(graph, output="dict", device_sink__npy_dir="", epochs=2) as q:
    try:
        q.load_state_dict(dict(state, epoch=2, step=0))
        check2(False, "a state past the last epoch is refused")
    except shardflow.ShardflowError as e:
        check2("epoch 2" in str(e) and "2 epochs" in str(e), f"the refusal names the epoch and the run's epochs: {e}")
check2.done("python resume")

# Epochs in Python: one epoch per `for`, each `for` after the first goes on with the next epoch (as a
# DataLoader with set_epoch). The graph's `epochs` is how many epochs a CLI run makes; it does not end a
# Pipeline (before: a second `for` over a graph with epochs: 1 yielded nothing, silently, while set_epoch(1)
# ran epoch 1 and load_state_dict() of a state at epoch 1 was refused). Pipeline(epochs=N) is a limit, kept
# alike by iteration, set_epoch and load_state_dict, with the same message.
check_epochs = Checks()
one_epoch = write_graph(os.path.join(tmp, "one-epoch.yaml"), [
    ("shard_source", dict(urls=urls)), ("tar_split", {}), ("decode", {}), ("shuffle", dict(buffer_size=30)),
    ("batch", dict(batch_size=16)), ("device_sink", {})], seed=5, epochs=1)
cli_out = os.path.join(tmp, "npy-three")
run(["run", one_epoch, "--quiet", "--no-summary", "--epochs", "3", "--set", f"device_sink.npy_dir={cli_out}"])
cli_epochs = [[keys for e, _, keys, _ in read_batches(cli_out) if e == epoch] for epoch in range(3)]
check_epochs(all(cli_epochs) and cli_epochs[0] != cli_epochs[1], "the CLI's three epochs differ")
with shardflow.Pipeline(one_epoch, output="dict") as p:
    loops = [[b["__key__"] for b in p] for _ in range(3)]
check_epochs(loops == cli_epochs, f"three `for` loops over a graph with epochs: 1 are epochs 0, 1, 2 as the CLI's "
             f"--epochs 3 makes them: {[len(x) for x in loops]} batches")
with shardflow.Pipeline(one_epoch, output="dict") as p:
    p.set_epoch(1)
    check_epochs([b["__key__"] for b in p] == cli_epochs[1], "set_epoch(1) on a graph with epochs: 1 is epoch 1")
with shardflow.Pipeline(one_epoch, output="dict") as p:
    p.load_state_dict(dict(p.state_dict(), epoch=1, step=2))
    check_epochs([b["__key__"] for b in p] == cli_epochs[1][2:], "a state at epoch 1 resumes on a graph with epochs: 1")
    check_epochs([b["__key__"] for b in p] == cli_epochs[2], "and the next `for` is epoch 2")
refusals = []
with shardflow.Pipeline(one_epoch, output="dict", epochs=2) as p:
    for call in (lambda: p.set_epoch(2), lambda: p.load_state_dict(dict(p.state_dict(), epoch=2, step=0))):
        try:
            call()
            refusals.append(None)
        except shardflow.ShardflowError as e:
            refusals.append(str(e))
    check_epochs(p.epoch == 0 and p.step == 0, "the refusals leave the pipeline as it was")
    check_epochs([b["__key__"] for b in p] == cli_epochs[0] and [b["__key__"] for b in p] == cli_epochs[1],
                 "epochs=2: two `for` loops, epochs 0 and 1")
    try:
        third = [b for b in p]
        refusals.append(f"yielded {len(third)} batches")
    except shardflow.ShardflowError as e:
        refusals.append(str(e))
check_epochs(len(set(refusals)) == 1 and refusals[0] and "epoch 2" in refusals[0] and "2 epochs" in refusals[0]
             and "set_epoch" in refusals[0], f"set_epoch, load_state_dict and a third `for` past epochs=2 are "
             f"refused alike, saying what to call: {refusals}")
check_epochs.done("python epochs")

# PyTorch: tensors without a copy (bfloat16 too), and DataLoader(batch_size=None) with two workers
# that split the shards between them.
try:
    import torch
    import torch.utils.data
except ImportError:
    torch = None
if torch is not None:
    check3 = Checks()
    with shardflow.Pipeline(graph, epochs=1, output="torch", augment__dtype="bfloat16") as p:
        images, labels = p.next_batch()
    check3(isinstance(images, torch.Tensor) and images.dtype == torch.bfloat16, f"bfloat16 tensor: {images.dtype}")
    check3(labels.dtype == torch.int64 and images.shape == (16, 3, 8, 8), f"shapes {tuple(images.shape)}")
    ref = [b["ppm"] for b in shardflow.Pipeline(graph, epochs=1, output="dict", device_sink__npy_dir="")]
    with shardflow.Pipeline(graph, epochs=1, output="torch") as p:
        first, _ = p.next_batch()
    check3(np.array_equal(first.numpy(), ref[0]), "torch sees the same values as NumPy")
    ds = shardflow.dataset(graph, epochs=1, device_sink__npy_dir="")
    seen = []
    for images, labels in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        seen.extend(int(v) for v in labels)
    check3(len(seen) == len(truth), f"two DataLoader workers together read every sample once ({len(seen)})")
    check3(sorted(seen) == sorted(v[1] for v in truth.values()), "their labels are the dataset's")
    check3.done("python torch")

# len() from samples_per_epoch and batch_size; the docstring lists every stage's options from the tables.
check4 = Checks()
with shardflow.Pipeline(graph, epochs=1, output="dict", device_sink__npy_dir="", samples_per_epoch=90,
                        batch_size=16) as p:
    check4(len(p) == 6, f"len: 90 samples in batches of 16 = 6 batches ({len(p)})")
    check4(len(list(p)) == 6, "and the epoch has that many")
with shardflow.Pipeline(graph, epochs=1, output="dict", device_sink__npy_dir="") as p:
    try:
        len(p)
        check4(False, "len() without samples_per_epoch is refused")
    except TypeError as e:
        check4("samples_per_epoch" in str(e), f"len() says why: {e}")
doc = shardflow.Pipeline.__doc__
for stage, option in (("shard_source", "samples_per_epoch"), ("augment", "padding"), ("batch", "partial")):
    check4(f"{stage}:" in doc and option in doc, f"the docstring documents {stage}.{option}")
check4.done("python len/doc")

# Log records reach the "shardflow" logger (not stderr): a bad sample's record with its level, its
# stage and the shard, byte offset and key in the message.
check_log = Checks()
bad_labels = os.path.join(tmp, "bad-labels.tar")
write_shard(bad_labels, [(f"{i:03d}", {"cls": b"seven" if i % 2 else b"3"}) for i in range(60)])
bad_graph = write_graph(os.path.join(tmp, "bad-labels.yaml"), [
    ("shard_source", dict(urls=bad_labels)), ("tar_split", {}), ("decode", {}), ("batch", dict(batch_size=10)),
    ("device_sink", {})], error_policy="skip", max_error_rate=1)


class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


keep = Keep()
logging.getLogger("shardflow").addHandler(keep)
with shardflow.Pipeline(bad_graph, output="dict") as p:
    keys = [k for b in p for k in b["__key__"]]
logging.getLogger("shardflow").removeHandler(keep)
check_log(len(keys) == 30, f"the 30 good samples arrive ({len(keys)})")
first = keep.records[0] if keep.records else None
check_log(first is not None and first.levelno == logging.ERROR and first.name == "shardflow"
          and first.stage == "decode" and f"{bad_labels} @ byte " in first.getMessage()
          and "(key 001)" in first.getMessage() and first.getMessage().startswith("decode: "),
          f"a bad sample's record: {first and (first.levelname, first.stage, first.getMessage())}")
check_log(len(keep.records) == 21 and keep.records[-1].levelno == logging.WARNING
          and keep.records[-1].stage is None and "further errors" in keep.records[-1].getMessage(),
          f"20 records, then the note that printing stops: {len(keep.records)}")
# The engine's text says nothing of the CLI (its summary, its --set): a trainer has neither.
cli_words = ("summary", "--set", "--start", "shardflow run")
check_log(not any(w in r.getMessage() for r in keep.records for w in cli_words),
          f"no CLI words in the records: {[r.getMessage() for r in keep.records if 'summary' in r.getMessage()]}")
try:
    shardflow.Pipeline(graph, output="dict", max_member_size="lots")
    check_log(False, "a keyword argument that does not parse is refused")
except shardflow.ShardflowError as e:
    check_log("max_member_size" in str(e) and "lots" in str(e) and not any(w in str(e) for w in cli_words),
              f"the refusal names the keyword argument, not --set: {e}")

# Interpreter exit while engine threads are inside the callback (a slow logging handler, a pipeline
# left running): the handler is uninstalled at exit (later records go to stderr), and the process
# neither hangs nor crashes nor reports a failed exit handler.
exiting = subprocess.run([sys.executable, "-c", f"""
import logging, sys, time
sys.path.insert(0, {os.path.join(os.environ["SF_SOURCE_ROOT"], "python")!r})
import shardflow

class Slow(logging.Handler):
    def emit(self, record):
        time.sleep(0.05)

logging.getLogger("shardflow").addHandler(Slow())
p = shardflow.Pipeline({bad_graph!r})
time.sleep(0.2)
print("exiting", flush=True)
"""], capture_output=True, text=True, timeout=60)
check_log(exiting.returncode == 0 and exiting.stdout == "exiting\n"
          and not any(word in exiting.stderr for word in ("Exception", "Traceback", "Fatal")),
          f"exit with records in flight: status {exiting.returncode} {exiting.stdout!r} {exiting.stderr[-2000:]}")
check_log.done("python logging")

# Batch buffers go back to the pool when the arrays are freed: memory stays flat over many epochs.
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


check5 = Checks()
# 64x64 float32 crops: 2.4 MiB a batch, so a leak of the 70 later batches would show as ~160 MiB
# (measured); allocator noise stays within a few MiB.
with shardflow.Pipeline(graph, epochs=40, output="numpy", device_sink__npy_dir="", batch_size=50,
                        augment__crop="center", augment__size=64) as p:
    marks = {}
    for epoch in range(40):
        for images, labels in p:
            pass
        del images, labels
        if epoch in (4, 39):
            marks[epoch] = rss_mib()
check5(marks[39] - marks[4] < 40, f"resident memory after 5 epochs {marks[4]:.1f} MiB, after 40 {marks[39]:.1f} MiB")
check5.done("python memory")

# A graph naming a plugin loads it in the trainer's process too: the plugin calls the library's SF_API
# functions, which the package makes visible to it (libshardflow.so loaded RTLD_GLOBAL).
check_plugin = Checks()
build_root = os.environ.get("SF_BUILD_ROOT", "build-test")
os.environ["SHARDFLOW_PLUGIN_PATH"] = os.path.join(build_root, "plugins", "example")
scaled = os.path.join(tmp, "scaled.yaml")
with open(scaled, "w") as f:
    f.write(f"plugins: [example]\nseed: 5\nepochs: 1\nstages:\n  - type: shard_source\n    urls: {urls}\n"
            "    shuffle: false\n  - type: tar_split\n  - type: decode\n  - type: scale\n    factor: 0.5\n"
            "  - type: batch\n    batch_size: 25\n  - type: device_sink\n")
with shardflow.Pipeline(scaled, output="dict") as p:
    first = p.next_batch()
keys = first["__key__"]
want = np.stack([np.clip(np.rint(truth[k][0].astype(np.float64) * 0.5), 0, 255).astype(np.uint8) for k in keys])
check_plugin(np.array_equal(first["ppm"], want), "the example plugin's scale stage ran in the trainer's process")
check_plugin.done("python plugins")

# /metrics from a trainer's pipeline: metrics="127.0.0.1:0" picks a free port, metrics_port says which, and
# the served counters are the pipeline's own (Pipeline.stats()).
import urllib.request  # noqa: E402

check_metrics = Checks()
with shardflow.Pipeline(scaled, output="dict", metrics="127.0.0.1:0", epochs=1) as p:  # one epoch: no read-ahead
    batches = list(p)
    port = p.metrics_port
    check_metrics(isinstance(port, int) and port > 0, f"metrics_port is the bound port: {port}")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    items = {n["name"]: n["items"] for n in p.stats()}
    counters = {n["name"]: n.get("counters") for n in p.stats()}
lines = [ln for ln in text.splitlines() if ln.startswith("shardflow_stage_items_total{") and 'stage="scale"' in ln]
check_metrics(lines and sum(float(ln.rsplit(" ", 1)[1]) for ln in lines) == items["scale"]
              == sum(len(b["__key__"]) for b in batches),
              f"/metrics counts the scale stage's items (summed over its replicas) as stats() does "
              f"({items.get('scale')}): {lines}")
# scale's own counter (sf_node_counter_add in its init): factor 0.5 clamps nothing, so stats() and /metrics say 0;
# stages without counters of their own have no "counters".
clamped = sum(int((np.rint(truth[k][0].astype(np.float64) * 0.5) > 255).sum()) for b in batches for k in b["__key__"])
check_metrics(counters.get("scale") == {"clamped": clamped} and counters.get("decode") is None,
              f"stats() has scale's own counter (numpy: {clamped} clamped): {counters}")
lines = [ln for ln in text.splitlines() if ln.startswith('shardflow_stage_counter_total{stage="scale"')]
check_metrics(lines and all('counter="clamped"}' in ln for ln in lines)
              and sum(int(ln.rsplit(" ", 1)[1]) for ln in lines) == clamped, f"/metrics has it: {lines}")
with shardflow.Pipeline(scaled, output="dict") as p:
    check_metrics(p.metrics_port is None, "no metrics setting: metrics_port is None")
check_metrics.done("python metrics")
