"""The bottleneck report (docs/bottleneck.md) names the stage whose limit a graph was built to have:
decode-bound (large JPEGs made with PIL, one decode replica; then in a group of one worker; then on a budget of one
CPU), consumer-bound (a trainer sleeping per batch), network-bound (shards behind nginx's per-connection
`limit_rate`), storage-bound (a shard read from a named pipe a writer fills slowly) and tar_split CPU-bound (a gzip
shard to inflate), and advises only what the engine accepts: no replicas for tar_split, no group after a run of
well under 5 s, no more replicas than the CPU budget. The line comes at the end of `shardflow run`, on SIGUSR1
mid-run, and from Python's Pipeline.bottleneck(). tests/unit/test_bottleneck_rule.c judges made-up counters."""
import atexit
import base64
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, group_graph, make_dataset, nginx, run, wait_for, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-bottleneck-")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # also when a check fails


def bottleneck_lines(stderr):
    return re.findall(r"^bottleneck: .*$", stderr, re.M)


def final_line(graph, *args):
    p = run(["run", graph, "--log-steps", "0", *args], timeout=60)
    lines = bottleneck_lines(p.stderr)
    check(len(lines) == 1, f"one bottleneck line at the end of the run, got {lines}\n{p.stderr}")
    print(os.path.basename(graph), "->", lines[0])
    return lines[0]


def chain(urls, **decode):
    return [("shard_source", dict(urls=urls, shuffle=False)), ("tar_split", {}), ("decode", decode),
            ("batch", dict(batch_size=4)), ("device_sink", {})]


# Decode-bound: 1280x960 noisy JPEGs take libjpeg-turbo ~15 ms each; everything else is a copy.
rng = np.random.default_rng(1)
jpegs = []
for i in range(32):
    img = rng.integers(0, 256, (960, 1280, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=95)
    jpegs.append((f"{i:07d}", {"jpg": buf.getvalue(), "cls": b"1"}))
write_shard(os.path.join(tmp, "big-000000.tar"), jpegs)
graph = write_graph(os.path.join(tmp, "decode.yaml"), chain(os.path.join(tmp, "big-000000.tar")), epochs=1)
line = final_line(graph)
check(line.startswith("bottleneck: decode (decode, busy") and "CPU-bound" in line
      and ("decode.replicas:" in line or "already runs one replica per CPU" in line), f"decode-bound graph: {line}")
check("group" not in line, f"decode-bound graph: no group after a run well under 5 s: {line}")

# The same decode in a group of one local worker process: the group is named, with more workers.
graph, _ = group_graph(tmp, "group", os.path.join(tmp, "big-000000.tar"), group={"processes": 1}, batch_size=4,
                       epochs=1)
line = final_line(graph)
check(line.startswith("bottleneck: decoders (a group with 1 worker(s)") and "more `shardflow worker`" in line,
      f"decode-bound group: {line}")

# Consumer-bound: small PPMs, a trainer that sleeps 50 ms a batch; SIGUSR1 asks for the line mid-run.
# The signal goes after the 40th batch (the run is then surely past its start, where the handler is set, and 2 s
# of steps outweigh the wait for the first batch, however slow the start), of the ~3 s the 60 batches take.
pattern, _ = make_dataset(tmp, 2, 120, size=8)
graph = write_graph(os.path.join(tmp, "consumer.yaml"), chain(pattern), epochs=1)
proc = subprocess.Popen([SHARDFLOW, "run", graph, "--log-steps", "10", "--step-time", "0.05"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
for out_line in proc.stdout:
    if " Step=40 " in out_line:
        break
proc.send_signal(signal.SIGUSR1)
_, err = proc.communicate(timeout=60)
check(proc.returncode == 0, f"the consumer-bound run failed: {err}")
lines = bottleneck_lines(err)
print("consumer.yaml ->", lines)
check(len(lines) == 2, f"a line on SIGUSR1 and one at the end, got {lines}")
for line in lines:
    check(line.startswith("bottleneck: the consumer") and "faster" in line, f"consumer-bound graph: {line}")

# Network-bound: 6 shards of 150 KB behind nginx capped at 200 KB/s a connection; decoding 8x8 PPMs is free.
net = os.path.join(tmp, "net")
os.mkdir(net)
make_dataset(net, 6, 30, size=40)
with nginx(net, "location / { limit_rate 200k; }") as base:
    graph = write_graph(os.path.join(tmp, "net.yaml"), chain(base + "/shard-{000000..000005}.tar"), epochs=1)
    line = final_line(graph)
check(line.startswith("bottleneck: tar_split (tar_split, network-bound") and "tar_split.prefetch" in line,
      f"network-bound graph: {line}")

# Storage-bound: the shard is a named pipe a writer fills 4 KiB every 10 ms, as slow storage would: tar_split spends
# the run blocked in read(). That wait is the storage's, not tar_split's CPU, and tar_split takes no replicas.
fifo_dir = os.path.join(tmp, "fifo")
os.mkdir(fifo_dir)
make_dataset(fifo_dir, 1, 30, size=40)
with open(os.path.join(fifo_dir, "shard-000000.tar"), "rb") as f:
    tar_bytes = f.read()
fifo = os.path.join(fifo_dir, "slow.tar")
os.mkfifo(fifo)


def trickle():
    with open(fifo, "wb", buffering=0) as f:
        for at in range(0, len(tar_bytes), 4096):
            f.write(tar_bytes[at:at + 4096])
            time.sleep(0.01)


writer = threading.Thread(target=trickle, daemon=True)
writer.start()
graph = write_graph(os.path.join(tmp, "fifo.yaml"), chain(fifo), epochs=1)
line = final_line(graph)
writer.join(timeout=30)
check(line.startswith("bottleneck: tar_split (tar_split, busy") and "I/O-bound" in line and "in reads" in line
      and "storage" in line, f"storage-bound reader: its read waits are I/O: {line}")
check(".replicas:" not in line and "group" not in line and "CPU-bound" not in line,
      f"storage-bound reader: no replicas for tar_split, not CPU-bound: {line}")

# CPU-bound tar_split: a gzip shard of 8 members of 1.5 MiB of base64 text, which tar_split inflates on its one thread
# (a literal per byte) while rename drops them. tar_split keeps state between samples: no replicas for it.
gz = os.path.join(tmp, "text.tar.gz")
with tarfile.open(gz, "w:gz", compresslevel=1) as tf:
    for i in range(8):
        for name, data in ((f"{i:07d}.txt", base64.b64encode(rng.bytes(3 << 19))), (f"{i:07d}.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
stages = chain(gz)
stages.insert(2, ("rename", dict(names="cls")))
graph = write_graph(os.path.join(tmp, "inflate.yaml"), stages, epochs=1)
line = final_line(graph)
check(line.startswith("bottleneck: tar_split (tar_split, busy") and "of its one thread" in line
      and "CPU-bound" in line and "cannot run as replicas" in line, f"CPU-bound tar_split: {line}")
check("replicas:" not in line and "group" not in line, f"CPU-bound tar_split: no replicas, no group: {line}")


def budget_one():
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


# The decode-bound graph again, on one CPU (affinity): its one decode replica is already one per CPU of the budget,
# and the run (well under a second) is too short to judge decode workers elsewhere: neither is advised.
p = run(["run", os.path.join(tmp, "decode.yaml"), "--log-steps", "0"], timeout=60, preexec_fn=budget_one)
lines = bottleneck_lines(p.stderr)
print("decode.yaml on one CPU ->", lines)
check(len(lines) == 1 and lines[0].startswith("bottleneck: decode (decode, busy") and "CPU-bound" in lines[0]
      and "already runs one replica per CPU" in lines[0] and "too short" in lines[0],
      f"decode-bound on a budget of one CPU: {lines}")
check(lines and "decode.replicas:" not in lines[0] and "group" not in lines[0],
      f"decode-bound on one CPU, a short run: no replicas, no group: {lines}")

# Python: the same line from Pipeline.bottleneck() while a slow consumer iterates.
if os.environ.get("SF_SANITIZE", "none") == "none":  # Debian's python cannot host a sanitizer runtime
    sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
    os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
    import shardflow  # noqa: E402

    with shardflow.Pipeline(os.path.join(tmp, "consumer.yaml")) as p:
        for i, _ in enumerate(p):
            time.sleep(0.05)
            if i == 20:
                break
        line = p.bottleneck()
    check(line.startswith("bottleneck: the consumer"), f"Python Pipeline.bottleneck() on a slow consumer: {line}")
check.done("bottleneck")
