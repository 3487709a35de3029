"""tar_split never waits inside its step for a remote shard's bytes: with a server that trickles the shard
out over ~3 s, the stage table shows that time as tar_split's wait, not its busy time, and every sample
still arrives once, whole and in order (the same samples as the local file)."""
import http.server
import os
import re
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-tar-split-wait-")
urls, truth = make_dataset(tmp, shards=1, per_shard=600, size=24)  # ~1.3 MB
path = os.path.join(tmp, "shard-000000.tar")
body = open(path, "rb").read()
SECONDS = 3.0  # the whole body, at an even rate


class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        step = 16384
        for i in range(0, len(body), step):
            self.wfile.write(body[i:i + step])
            self.wfile.flush()
            time.sleep(SECONDS * step / len(body))

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
threading.Thread(target=server.serve_forever, daemon=True).start()
out = os.path.join(tmp, "out")
graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=f"http://127.0.0.1:{server.server_address[1]}/shard-000000.tar", shuffle=False)),
    ("tar_split", {}),
    ("decode", {}),
    ("batch", dict(batch_size=50)),
    ("device_sink", dict(npy_dir=out)),
], seed=1, epochs=1, error_policy="fail")
t0 = time.monotonic()
p = run(["run", graph, "--quiet"])
wall = time.monotonic() - t0
server.shutdown()

keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
check(keys == sorted(truth), f"every sample once, in shard order ({len(keys)} of {len(truth)})")
labels = [int(v) for _, _, _, f in read_batches(out) for v in f["cls"]]
check(labels == [truth[k][1] for k in keys], "labels travel with their samples")
row = re.search(r"^tar_split\s+tar_split\s+\d+\s+(\d+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)", p.stderr, re.M)
check(row is not None, f"the stage table has a tar_split row:\n{p.stderr}")
if row:
    items, busy, wait = int(row.group(1)), float(row.group(2)), float(row.group(3))
    check(items == len(truth), f"tar_split counts {items} samples")
    check(wall > SECONDS * 0.8, f"the server was slow ({wall:.1f} s for the run)")
    check(busy < 0.25 * SECONDS, f"tar_split's busy time ({busy:.2f} s) is not the download's time")
    check(wait > 0.5 * SECONDS, f"the download shows as tar_split's wait ({wait:.2f} s of {wall:.1f} s)")
shutil.rmtree(tmp, ignore_errors=True)
check.done("tar_split_wait")
