"""A real network fault: nginx in a network namespace joined to this one by a veth pair; while shardflow
reads shards from it, an nft rule inside the namespace drops every packet to nginx for a few seconds, then
goes. The epoch must complete with each sample exactly once (keys equal Python tarfile's, in shard order)
and the downloads must have been resumed. Needs root and `ip netns`; exits 77 (skip) otherwise. The
namespace is removed even when the test fails."""
import contextlib
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run, write_graph  # noqa: E402

if os.geteuid() != 0:
    print("skip: needs root (network namespaces, nft)")
    sys.exit(77)

NS = f"sfnf{os.getpid()}"
HOST_IF, NS_IF = f"sfh{os.getpid() % 100000}", f"sfn{os.getpid() % 100000}"
net = 10 + os.getpid() % 200
HOST_IP, NS_IP, PORT = f"10.231.{net}.1", f"10.231.{net}.2", 8080


def sh(*args, check=True):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30)


def in_ns(*args, check=True):
    return sh("ip", "netns", "exec", NS, *args, check=check)


try:
    sh("ip", "netns", "add", NS)
except (subprocess.CalledProcessError, FileNotFoundError) as e:
    print(f"skip: `ip netns add` failed: {getattr(e, 'stderr', e)}")
    sys.exit(77)

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-netns-")
root = os.path.join(tmp, "www")
os.makedirs(root)
nginx = None
try:
    sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
    sh("ip", "link", "set", NS_IF, "netns", NS)
    sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_IF)
    sh("ip", "link", "set", HOST_IF, "up")
    in_ns("ip", "addr", "add", f"{NS_IP}/30", "dev", NS_IF)
    in_ns("ip", "link", "set", NS_IF, "up")
    in_ns("ip", "link", "set", "lo", "up")
    if in_ns("nft", "list", "tables", check=False).returncode != 0:
        print("skip: nft does not work in the namespace")
        sys.exit(77)

    SHARDS = 12
    make_dataset(root, shards=SHARDS, per_shard=200, size=16)  # ~0.5 MB a shard
    names = [f"shard-{i:06d}.tar" for i in range(SHARDS)]
    truth = []
    for n in names:
        with tarfile.open(os.path.join(root, n)) as tf:
            for m in tf.getmembers():
                k = m.name.split(".")[0]
                if not truth or truth[-1] != k:
                    truth.append(k)

    # nginx inside the namespace, each connection held to 512 KB/s so the epoch lasts a few seconds.
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""user root;
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log {tmp}/access.log;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  server {{ listen {NS_IP}:{PORT}; root {root}; limit_rate 512k; }}
}}
""")
    nginx = subprocess.Popen(["ip", "netns", "exec", NS, "/usr/sbin/nginx", "-c", conf, "-p", tmp],
                             stderr=subprocess.PIPE)
    for _ in range(100):
        with contextlib.suppress(OSError), socket.create_connection((NS_IP, PORT), timeout=0.2):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("nginx did not start in the namespace: " + nginx.stderr.read().decode())

    base = f"http://{NS_IP}:{PORT}"
    out = os.path.join(tmp, "out")
    graph = write_graph(os.path.join(tmp, "g.yaml"), [
        ("shard_source", dict(urls=f"{base}/shard-{{000000..{SHARDS - 1:06d}}}.tar", shuffle=False)),
        ("tar_split", dict(prefetch=2, connect_timeout="1s", stall_timeout="1s", retries=30, retry_wait="100ms",
                           retry_max_wait="1s")),
        ("decode", {}),
        ("batch", dict(batch_size=64, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=1, error_policy="fail")

    DROP_FOR = 3.0
    dropped = {}

    def drop_for_a_while():
        # Once the first batch is out the downloads are under way (nginx sends 512 KB/s per connection).
        deadline = time.monotonic() + 30
        while not (os.path.isdir(out) and os.listdir(out)) and time.monotonic() < deadline:
            time.sleep(0.02)
        in_ns("nft", "add", "table", "inet", "sfdrop")
        in_ns("nft", "add", "chain", "inet", "sfdrop", "input",
              "{ type filter hook input priority 0; policy accept; }")
        in_ns("nft", "add", "rule", "inet", "sfdrop", "input", "tcp", "dport", str(PORT), "drop")
        dropped["from"] = time.monotonic()
        time.sleep(DROP_FOR)
        in_ns("nft", "delete", "table", "inet", "sfdrop")
        dropped["to"] = time.monotonic()

    dropper = threading.Thread(target=drop_for_a_while, daemon=True)
    t0 = time.monotonic()
    dropper.start()
    p = run(["run", graph, "--quiet"], check=False)
    took = time.monotonic() - t0
    dropper.join(10)
    check(p.returncode == 0, f"the epoch completes despite the drop (exit {p.returncode})\n{p.stderr}")
    check("to" in dropped and took > dropped["to"] - t0,
          f"the {DROP_FOR}s drop happened while shardflow read ({took:.1f}s, {dropped})")
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    check(keys == truth, f"every sample once, in shard order ({len(keys)} of {len(truth)}, "
                         f"{len(set(keys))} distinct)")
    m = re.search(r"downloaded (\d+) shard\(s\), [\d.]+ MiB; refetched (\d+) bytes; (\d+) retries "
                  r"\((\d+) resumed with Range\); (\d+) failed", p.stderr)
    check(m is not None, f"the download summary is printed\n{p.stderr}")
    retries, resumes = int(m.group(3)), int(m.group(4))
    check(retries >= 1 and resumes >= 1, f"downloads were retried and resumed ({m.group(0)})")
    print(f"netns: {took:.1f}s with a {DROP_FOR}s drop; {m.group(0)}")
finally:
    if nginx:
        nginx.kill()
        nginx.wait()
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "link", "del", HOST_IF, check=False)
check.done("test_netns_faults")
