"""Shards larger than the HTTP reader's ring (4 x 512 KiB) arrive whole over nginx: the fetcher
wraps around its blocks and pauses when the consumer falls behind, and nothing is lost or repeated.
Prefetch, measured: with a slow trainer, the next shards' requests reach a logging server before the shard
ahead of them was read, and the bytes downloaded minus the bytes tar_split consumed (from /metrics, against
Python tarfile's offsets) never exceed prefetch_bytes plus the documented slack."""
import http.server
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, make_dataset, nginx, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-http-stream-")
# 3 shards of 1,500 samples of 24x24 RGB (~1,728 + header bytes each): about 5.5 MB a shard
urls, truth = make_dataset(tmp, shards=3, per_shard=1500, size=24)
local = [os.path.join(tmp, f"shard-{i:06d}.tar") for i in range(3)]
check(all(os.path.getsize(p) > 4 * 512 * 1024 for p in local), "shards are larger than the reader's ring")


def listing(args):
    p = run(["ls", "--json"] + args)
    return [{k: v for k, v in json.loads(line).items() if k != "__url__"} for line in p.stdout.splitlines()]


with nginx(tmp) as base:
    remote = [f"{base}/shard-{i:06d}.tar" for i in range(3)]
    check(listing(remote) == listing(local), "ls over http equals ls of the files (keys, fields, sizes, offsets)")
    # Through a pipeline whose consumer is slower than loopback, so the fetcher has to pause.
    out = os.path.join(tmp, "out")
    graph = write_graph(os.path.join(tmp, "g.yaml"), [
        ("shard_source", dict(urls="::".join(remote), shuffle=False)),
        ("tar_split", {}),
        ("decode", {}),
        ("augment", dict(crop="random", size=24, padding=4, flip=0.5, mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2])),
        ("batch", dict(batch_size=50)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=3, epochs=1, error_policy="fail")
    p = run(["run", graph, "--quiet", "--no-summary"])
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    check(keys == sorted(truth), f"every sample once, in shard order ({len(keys)} of {len(truth)})")
    labels = [int(v) for _, _, _, f in read_batches(out) for v in f["cls"]]
    check(labels == [truth[k][1] for k in keys], "labels travel with their samples")

# Prefetch ahead, within prefetch_bytes. 4 shards of 100 images of 128x128 (~5 MB each), served at full speed
# by a server that logs when each request arrives; a trainer that takes 0.05 s a batch of 5 (~4 s), so
# tar_split waits on its output queue (short queues: the edges hold ~35 samples, a third of a shard) and the
# downloads ahead fill their budget and pause.
MiB = 1 << 20
PREFETCH_BYTES = 1 * MiB
ahead_dir = os.path.join(tmp, "ahead")
os.makedirs(ahead_dir)
make_dataset(ahead_dir, shards=4, per_shard=100, size=128, seed=5)
names = [f"shard-{i:06d}.tar" for i in range(4)]
bodies = {"/" + n: open(os.path.join(ahead_dir, n), "rb").read() for n in names}
check(all(len(b) > 4 * PREFETCH_BYTES for b in bodies.values()), "each shard is larger than the budget")
requests = []  # (path, monotonic time the request arrived)


class Logging(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        requests.append((self.path, time.monotonic()))
        body = bodies.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *args):
        pass


# Consumption, by tarfile: the byte at which sample n (in shard order) ends, counting whole earlier shards.
ends, before = [], 0
for n in names:
    with tarfile.open(os.path.join(ahead_dir, n)) as tf:
        last = {}
        for m in tf.getmembers():
            last[m.name.split(".")[0]] = m.offset_data + m.size
    ends += [before + e for e in last.values()]
    before += len(bodies["/" + n])
shard_samples = 100

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Logging)
threading.Thread(target=server.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{server.server_address[1]}"
out = os.path.join(tmp, "ahead-out")
graph = write_graph(os.path.join(tmp, "ahead.yaml"), [
    ("shard_source", dict(urls="::".join(f"{base}/{n}" for n in names), shuffle=False)),
    ("tar_split", dict(prefetch=2, prefetch_bytes=PREFETCH_BYTES)),
    ("decode", {}),
    ("batch", dict(batch_size=5)),
    ("device_sink", dict(npy_dir=out)),
], seed=1, epochs=1, error_policy="fail", metrics="127.0.0.1:0", queue_size=4)
t0 = time.monotonic()
proc = subprocess.Popen([SHARDFLOW, "run", graph, "--step-time", "0.05", "--log-steps", "0"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
line = proc.stderr.readline()
m = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
check(m is not None, f"the metrics port is logged: {line!r}")
rest = []
drain = threading.Thread(target=lambda: rest.append(proc.stderr.read()))
drain.start()
samples = []  # (time, downloaded bytes, samples tar_split produced)
while proc.poll() is None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=2).read().decode()
    except OSError:
        break  # the run ended between poll() and the request
    at = time.monotonic()
    got = re.search(r'^shardflow_reader_downloaded_bytes_total\{[^}]*\} (\S+)$', text, re.M)
    items = re.search(r'^shardflow_stage_items_total\{[^}]*stage="tar_split"[^}]*\} (\S+)$', text, re.M)
    if got and items:
        samples.append((at, int(float(got.group(1))), int(float(items.group(1)))))
    time.sleep(0.02)
proc.wait(timeout=60)
drain.join(30)
server.shutdown()
check(proc.returncode == 0, f"the run succeeds: {''.join(rest)[-2000:]}")
keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
check(keys == [f"{i:07d}" for i in range(400)], f"every sample once, in order ({len(keys)})")
check(len(samples) > 20, f"/metrics was read while the run went on ({len(samples)} times)")

# Each shard's request arrived while the shard ahead of it still had samples to produce (the last reading of
# /metrics before its last sample came out), and bytes of later shards arrived while one was being read.
start = {path: t for path, t in reversed(requests)}  # the first request of each
for k in range(3):
    pending = max((t for t, _, n in samples if n < (k + 1) * shard_samples), default=None)
    nxt = start.get("/" + names[k + 1])
    check(nxt is not None and pending is not None and nxt < pending,
          f"shard {k + 1} was requested ({nxt and nxt - t0:.2f}s) while shard {k} was still being read "
          f"(until {pending and pending - t0:.2f}s)")
    print(f"prefetch: shard {k + 1} requested at {nxt - t0:.2f}s, shard {k} read until {pending - t0:.2f}s")
sizes = [len(bodies["/" + n]) for n in names]
ahead = [d - sum(sizes[:n // shard_samples + 1]) for _, d, n in samples if n < 4 * shard_samples]
check(max(ahead) > 0, f"bytes of the next shards arrived while one was read (at most {max(ahead)} ahead)")

# Unread bytes: downloaded minus consumed (tarfile's end of the last sample produced) stays within
# prefetch_bytes + the 2 MiB the shard being read may always hold + one 512 KiB block (the member being
# parsed, and the two counters being read a moment apart). A budget that did not hold would show here: the
# downloads run far ahead of a trainer this slow (each shard is 5 MB).
SLACK = 2 * MiB + 512 * 1024
held = [(t - t0, d - (ends[n - 1] if n else 0)) for t, d, n in samples]
worst = max(h for _, h in held)
print(f"prefetch: most unread bytes {worst / MiB:.2f} MiB (budget {PREFETCH_BYTES / MiB:.0f} MiB + "
      f"{SLACK / MiB:.1f} MiB slack) over {len(held)} readings")
check(worst <= PREFETCH_BYTES + SLACK, f"unread bytes stay within prefetch_bytes + slack (at most {worst} bytes)")
check.done("http_stream")
