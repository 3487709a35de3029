"""The memory budget of a pipeline (docs/graph-files.md, "Memory"): queues are bounded in bytes
(queue_bytes) as well as items, so large images held between stages stay within the stated budget
however many a shard has. Measures the peak RSS of `shardflow run` (wait4) on 4-megapixel PNGs with
replicas: 2 and a slow consumer (VmHWM), against the budget computed from the documented formula plus the
RSS of the same run on tiny images (code, libraries, allocator); and with 8 replicas, whose queues share an
edge's budget."""
import io
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, read_batches, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-memory-")
MiB = 1 << 20
IMAGES = 48
REPLICAS = 2
sanitized = os.environ.get("SF_SANITIZE", "none") not in ("", "none")


def png(side):
    y, x = np.mgrid[0:side, 0:side]
    img = np.stack([(x * 255 // side), (y * 255 // side), ((x + y) % 256)], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def dataset(name, side):
    blob = png(side)
    samples = [(f"{i:06d}", {"png": blob, "cls": str(i % 10).encode()}) for i in range(IMAGES)]
    return write_shard(os.path.join(tmp, name + ".tar"), samples), len(blob)


def peak_rss(name, shard, batch_size, step_time, replicas=REPLICAS, **settings):
    out = os.path.join(tmp, "out-" + name)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=shard, shuffle=False)),
        ("tar_split", {}),
        ("decode", dict(replicas=replicas)),
        ("batch", dict(batch_size=batch_size, partial=True)),
        ("device_sink", dict(npy_dir=out) if name == "small" else {}),
    ], epochs=1, threads=4, **settings)
    proc = subprocess.Popen([SHARDFLOW, "run", graph, "--no-summary", "--log-steps", "0", "--step-time", str(step_time)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # VmHWM: the peak RSS of the process since its exec (a child's rusage would count the test's own memory,
    # which the child shares until exec). It only grows, so the last reading before exit is the peak.
    hwm = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                hwm = max([hwm] + [int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")])
        except OSError:
            pass
        time.sleep(0.01)
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    check(proc.returncode == 0 and f"Samples={IMAGES} " in stdout,
          f"{name}: the run delivers {IMAGES} samples: {stdout} {stderr}")
    return hwm, out


def budget(s_enc, s_dec, batch_size, queue_bytes, queue_size=64, replicas=REPLICAS):
    """docs/graph-files.md, "Memory": the tensor bytes a pipeline holds at most, from its settings and the
    largest sample (the allocator adds up to about a quarter). An edge's N queues (one per replica) share its
    queue_size (at least 4 items each) and queue_bytes."""
    b = batch_size * s_dec

    def edge(queues, item, items):  # a queue takes an item while it holds fewer than items and < queue_bytes
        each_items = max(items // queues, 4) if queues > 1 else items
        return queues * min(each_items * item, queue_bytes // queues + item)

    return (edge(replicas, s_enc, queue_size)      # tar_split -> decode (one queue per replica)
            + edge(replicas, s_dec, queue_size)    # decode -> batch
            + 2 * edge(1, b, 4)                     # batch -> device_sink, and the output to the trainer
            + replicas * (s_enc + s_dec)            # the sample each replica has in hand
            + b + batch_size * s_dec                # the batch being filled and its samples
            + b                                     # the batch the trainer holds
            + s_enc)                                # the member tar_split is reading


small, _ = dataset("small", 8)
base, out = peak_rss("small", small, 1, 0)
check(len(read_batches(out)) == IMAGES, "the tiny run's batches are all there")

SIDE = 2000
big, s_enc = dataset("big", SIDE)
s_dec = SIDE * SIDE * 3
total = IMAGES * s_dec
for queue_bytes in (None, 16 * MiB):
    settings = {} if queue_bytes is None else {"queue_bytes": "16MiB"}
    for batch_size in (1, 4):
        rss, _ = peak_rss(f"big-{queue_bytes}-{batch_size}", big, batch_size, 0.1, **settings)
        allowed = base + budget(s_enc, s_dec, batch_size, queue_bytes or 64 * MiB)
        print(f"queue_bytes {queue_bytes or '64MiB (default)'}, batch {batch_size}: peak RSS {rss / MiB:.0f} MiB, "
              f"budget {allowed / MiB:.0f} MiB (base {base / MiB:.0f}), all images decoded {total / MiB:.0f} MiB")
        if not sanitized:  # ASan's shadow memory and quarantine are not the engine's
            check(rss <= base + 1.25 * (allowed - base),
                  f"peak RSS {rss / MiB:.0f} MiB within the stated budget {allowed / MiB:.0f} MiB (+25% allocator)")

# Replicas add parallelism, not memory: 8 decode replicas (as the plan gives a stage on an 8-CPU machine) share
# each edge's queue_bytes; before, every replica's queue had the whole of it (8 x 64 MiB an edge).
rss, _ = peak_rss("big-replicas-8", big, 1, 0.1, replicas=8)
allowed = base + budget(s_enc, s_dec, 1, 64 * MiB, replicas=8)
print(f"replicas 8, batch 1: peak RSS {rss / MiB:.0f} MiB, budget {allowed / MiB:.0f} MiB")
if not sanitized:
    check(rss <= base + 1.25 * (allowed - base),
          f"replicas 8: peak RSS {rss / MiB:.0f} MiB within the stated budget {allowed / MiB:.0f} MiB (+25% allocator)")

check.done("memory_budget")
