"""The bottleneck report (docs/bottleneck.md) names the stage whose limit a graph was built to have:
decode-bound (large JPEGs made with PIL, one decode replica; then in a group of one worker), consumer-bound (a trainer sleeping per batch),
network-bound (shards behind nginx's per-connection `limit_rate`). The line comes at the end of
`shardflow run`, on SIGUSR1 mid-run, and from Python's Pipeline.bottleneck()."""
import atexit
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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
      and ("decode.replicas:" in line or "group" in line), f"decode-bound graph: {line}")

# The same decode in a group of one local worker process: the group is named, with more workers.
graph, _ = group_graph(tmp, "group", os.path.join(tmp, "big-000000.tar"), group={"processes": 1}, batch_size=4,
                       epochs=1)
line = final_line(graph)
check(line.startswith("bottleneck: decoders (a group with 1 worker(s)") and "more `shardflow worker`" in line,
      f"decode-bound group: {line}")

# Consumer-bound: small PPMs, a trainer that sleeps 50 ms a batch; SIGUSR1 asks for the line mid-run.
pattern, _ = make_dataset(tmp, 2, 60, size=8)
graph = write_graph(os.path.join(tmp, "consumer.yaml"), chain(pattern), epochs=1)
proc = subprocess.Popen([SHARDFLOW, "run", graph, "--log-steps", "0", "--step-time", "0.05"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
time.sleep(1.0)  # of the ~1.5 s the 30 batches take
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
