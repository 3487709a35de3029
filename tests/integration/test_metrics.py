"""`metrics: HOST:PORT` serves /metrics in Prometheus' text format 0.0.4: Debian's real `prometheus` server
scrapes a slowly consumed pipeline every second, and the series read back through its HTTP API
(/api/v1/query) must equal the pipeline's own end-of-run table and the shards' sample count by tarfile;
/metrics itself must pass a strict line-by-line check of the format and prometheus_client's parser.
The server must not be a way to starve the pipeline: a client holding hundreds of connections (under a low
RLIMIT_NOFILE) must not make shards fail to open; a process already holding more than 1,024 descriptors
(select()'s FD_SETSIZE) still serves /metrics; node names are escaped in label values."""
import atexit
import resource
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, free_port, make_dataset, stage_table, tar_keys, wait_for, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-metrics-")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # also when a check fails
SHARDS, PER_SHARD, BATCH = 4, 100, 10
pattern, _ = make_dataset(tmp, SHARDS, PER_SHARD)
samples = len(tar_keys(*[os.path.join(tmp, f"shard-{s:06d}.tar") for s in range(SHARDS)]))

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABELS = r'\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)?\}'
VALUE = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN)"


def strict_check(text):
    """The exposition format 0.0.4, strictly: every line a HELP, a TYPE or a sample; one TYPE per family,
    before its samples, which are contiguous; counters named *_total, nothing with a unit missing.
    Returns {family: type}."""
    types, seen_samples, current = {}, set(), None
    check(text.endswith("\n"), "the exposition must end with a newline")
    for line in text[:-1].split("\n"):
        if m := re.fullmatch(rf"# HELP ({NAME}) (.+)", line):
            current = m.group(1)
            continue
        if m := re.fullmatch(rf"# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)", line):
            check(m.group(1) not in types, f"two TYPE lines for {m.group(1)}")
            check(m.group(1) == current, f"TYPE {m.group(1)} does not follow its HELP")
            types[m.group(1)] = m.group(2)
            continue
        m = re.fullmatch(rf"({NAME})({LABELS})? ({VALUE})", line)
        check(m is not None, f"not a valid exposition line: {line!r}")
        check(m.group(1) == current and m.group(1) in types,
              f"sample {m.group(1)} is not under its own HELP/TYPE block (samples of a family are contiguous)")
        seen_samples.add(m.group(1))
    for name, kind in types.items():
        check(name.startswith("shardflow_"), f"{name}: metric names carry the shardflow_ prefix")
        check((kind == "counter") == name.endswith("_total"), f"{name}: counters, and only counters, end in _total")
    return types


with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
    f.write("global: {scrape_interval: 1s, scrape_timeout: 900ms}\n")  # the target is added below

graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=pattern, shuffle=False)),
    ("tar_split", {}),
    ("decode", {}),
    ("batch", dict(batch_size=BATCH)),
    ("device_sink", {}),
], epochs=1, metrics="127.0.0.1:0")
# A slow consumer (0.25 s a batch: 40 batches, 10 s): the reader is done after ~20 batches (the queues hold the
# rest), so its counter stays at its final value for several scrapes.
run = subprocess.Popen([SHARDFLOW, "run", graph, "--step-time", "0.25", "--log-steps", "0"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
prom = None
try:
    line = run.stderr.readline()
    m = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
    check(m is not None, f"port 0: the chosen port is logged, got {line!r}")
    port = int(m.group(1))
    check(port > 0, "port 0 picked a real port")
    err_rest = []
    drain = threading.Thread(target=lambda: err_rest.append(run.stderr.read()))
    drain.start()

    # Prometheus: its own config, storage and port, scraping the pipeline every second.
    prom_port = free_port()
    with open(os.path.join(tmp, "prometheus.yml"), "a") as f:
        f.write(f"scrape_configs:\n  - job_name: shardflow\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))

    # /metrics directly, while the run goes on.
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    check(body.headers["Content-Type"].startswith("text/plain; version=0.0.4"), "Content-Type names format 0.0.4")
    text = body.read().decode()
    types = strict_check(text)
    for name in ("shardflow_stage_items_total", "shardflow_stage_bytes_total", "shardflow_stage_busy_seconds_total",
                 "shardflow_stage_wait_seconds_total", "shardflow_stage_errors_total", "shardflow_stage_skipped_total",
                 "shardflow_stage_input_queue_items", "shardflow_stage_output_queue_items"):
        check(name in types, f"/metrics has {name}")
    families = {f.name: f for f in text_string_to_metric_families(text)}  # prometheus_client strips _total
    items = {s.labels["stage"]: s.value for s in families["shardflow_stage_items"].samples if s.name.endswith("_total")}
    check(set(items) == {"shard_source", "tar_split", "decode", "batch", "device_sink"},
          f"one items series per stage, got {sorted(items)}")
    labels = {}  # stage -> its replica labels: 0..N-1 (decode has as many as the plan gave it, the others one)
    for s in families["shardflow_stage_items"].samples:
        labels.setdefault(s.labels["stage"], set()).add(s.labels["replica"])
    check(all(v == {str(i) for i in range(len(v))} for v in labels.values()) and
          all(len(v) == 1 for k, v in labels.items() if k != "decode"), f"replica labels {labels}")
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=5)
        check(False, "a path other than /metrics is 404")
    except urllib.error.HTTPError as e:
        check(e.code == 404, f"a path other than /metrics is 404, got {e.code}")

    def query(q):
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            reply = json.load(urllib.request.urlopen(url, timeout=5))
        except OSError:
            return None  # Prometheus not up yet
        return {r["metric"].get("stage", ""): float(r["value"][1]) for r in reply["data"]["result"]}

    # The reader's counter, as Prometheus stored it, reaches the shards' sample count while the run goes on.
    reader = 'max_over_time(shardflow_stage_items_total{job="shardflow",stage="tar_split"}[5m])'
    wait_for(lambda: (query(reader) or {}).get("tar_split") == samples, 25,
             f"Prometheus to store tar_split's items = {samples} (last: {query(reader)})")
    check(query('max_over_time(up{job="shardflow"}[5m])') == {"": 1.0}, "Prometheus scraped the target (up = 1)")
    sink = query('max_over_time(shardflow_stage_items_total{job="shardflow",stage="device_sink"}[5m])')
    check(0 < sink["device_sink"] <= samples / BATCH, f"device_sink's series is live and bounded: {sink}")
    busy = query('max_over_time(shardflow_stage_busy_seconds_total{job="shardflow",stage="decode"}[5m])')
    run.wait(timeout=60)
    drain.join()
    check(run.returncode == 0, f"the run failed ({run.returncode}): {err_rest}")
    table = stage_table(err_rest[0])  # the pipeline's own end-of-run table
    check(table["tar_split"]["items"] == samples, f"the table's tar_split items = {samples}: {table['tar_split']}")
    check(table["decode"]["busy"] + 0.005 >= busy["decode"],
          f"Prometheus' decode busy seconds {busy} do not exceed the final table's {table['decode']['busy']}")
    check(table["device_sink"]["items"] == samples // BATCH, "the run delivered every batch")
finally:
    for proc in (run, prom):
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()

# libmicrohttpd is opened when a run first serves metrics, not at start-up (the loader's own log, LD_DEBUG=libs,
# says which libraries it initialised).
plain = write_graph(os.path.join(tmp, "plain.yaml"), [
    ("shard_source", dict(urls=pattern, shuffle=False)), ("tar_split", {}), ("decode", {}),
    ("batch", dict(batch_size=BATCH)), ("device_sink", {})], epochs=1)


def mhd_loaded(*args):
    p = subprocess.run([SHARDFLOW, "run", plain, "--log-steps", "0", *args], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "LD_DEBUG": "libs"})
    check(p.returncode == 0, f"run {args}: {p.stderr[-500:]}")
    inits = [line for line in p.stderr.splitlines() if "calling init:" in line]
    check(any("libc.so" in line for line in inits), f"the loader's log is there ({len(inits)} inits)")
    return any("libmicrohttpd" in line for line in inits)


check(not mhd_loaded(), "a run without metrics does not load libmicrohttpd")
check(mhd_loaded("--metrics", "127.0.0.1:0"), "a run serving metrics loads libmicrohttpd")

# Mistakes a user can make name the setting and say what to do.
bad = subprocess.run([SHARDFLOW, "run", graph, "--metrics", "localhost"], capture_output=True, text=True, timeout=30)
check(bad.returncode != 0 and "metrics: 'localhost' is not HOST:PORT" in bad.stderr, f"no port: {bad.stderr}")
with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy_port = taken.getsockname()[1]
    bad = subprocess.run([SHARDFLOW, "run", graph, "--metrics", f"127.0.0.1:{busy_port}"], capture_output=True,
                         text=True, timeout=30)
check(bad.returncode != 0 and f"metrics: cannot listen on 127.0.0.1:{busy_port}" in bad.stderr
      and "port 0" in bad.stderr, f"port in use: {bad.stderr}")

def run_with(graph_path, *args, preexec_fn=None, wrapper=None, **kw):
    """Starts `shardflow run graph args` (optionally under a Python wrapper's argv); returns (Popen, metrics port)
    after the `serving metrics` line, or (Popen, None) with that line missing (the process then has ended)."""
    argv = [SHARDFLOW, "run", graph_path, "--log-steps", "0", *args]
    # errors="replace": the log and the end-of-run table print node names as cut to 31 bytes.
    proc = subprocess.Popen((wrapper or []) + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            errors="replace", preexec_fn=preexec_fn, **kw)
    first = proc.stderr.readline()
    m = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", first)
    if not m:
        rest = proc.stderr.read()
        proc.wait(timeout=60)
        proc.first_lines = first + rest
        return proc, None
    return proc, int(m.group(1))


def finish(proc, timeout=60):
    """Waits for proc; returns (exit status, the rest of its stderr)."""
    try:
        rest = proc.stderr.read()
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, rest


# Many shards opened one after the other while a client holds every connection it can get: with the
# process limited to 256 descriptors, an unbounded server takes them all, and shards failed to open with
# "check the path" and were skipped: exit 0 with samples lost. Every sample must arrive, or the run must fail
# naming the descriptor limit.
FLOOD_SHARDS, FLOOD_PER_SHARD, FLOOD_LIMIT = 24, 10, 256
flood_dir = os.path.join(tmp, "flood")
os.makedirs(flood_dir)
flood_pattern, _ = make_dataset(flood_dir, FLOOD_SHARDS, FLOOD_PER_SHARD)
flood_samples = FLOOD_SHARDS * FLOOD_PER_SHARD
flood_graph = write_graph(os.path.join(tmp, "flood.yaml"), [
    ("shard_source", dict(urls=flood_pattern, shuffle=False)),
    ("tar_split", {}),
    ("batch", dict(batch_size=BATCH)),
    ("device_sink", {}),
], epochs=1, queue_size=2, metrics="127.0.0.1:0")


def lower_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (FLOOD_LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


proc, port = run_with(flood_graph, "--step-time", "0.08", preexec_fn=lower_fd_limit)
check(port is not None, f"the flood run serves metrics: {getattr(proc, 'first_lines', '')}")
held = []
try:
    for _ in range(FLOOD_LIMIT + 64):  # more than the process may hold: the kernel's backlog keeps the rest
        c = socket.socket()
        c.settimeout(2)
        try:
            c.connect(("127.0.0.1", port))
        except OSError:
            c.close()
            break
        held.append(c)
    time.sleep(0.3)  # the server accepts what it will

    def sockets():
        n = 0
        for fd in os.listdir(f"/proc/{proc.pid}/fd"):
            try:
                n += os.readlink(f"/proc/{proc.pid}/fd/{fd}").startswith("socket:")
            except OSError:
                pass  # closed meanwhile
        return n
    held_by_server = sockets() if proc.poll() is None else 0
    code, err = finish(proc)
finally:
    for c in held:
        c.close()
table = stage_table(err)
# The listening socket and min(64, 256 / 16) connections: the rest wait in the kernel's backlog.
check(held_by_server <= 1 + FLOOD_LIMIT // 16, f"the server holds {held_by_server} sockets of {len(held)} connections")
check("check the path" not in err, f"running out of descriptors is not a bad path: {err[-2000:]}")
if code == 0:
    check(table.get("tar_split", {}).get("items") == flood_samples and table["tar_split"]["errors"] == 0,
          f"exit 0 under a connection flood: tar_split must read all {flood_samples} samples: {err[-2000:]}")
    check(table["device_sink"]["items"] == flood_samples // BATCH, f"exit 0: every batch delivered: {err[-2000:]}")
else:
    check(f"too many open files (the process's limit is {FLOOD_LIMIT}: raise ulimit -n)" in err,
          f"a run that failed under the flood names the descriptor limit: {err[-2000:]}")

# select() cannot watch a descriptor numbered 1,024 or more: a trainer that already holds that many must still
# serve /metrics (the wrapper raises the soft limit, opens 1,100 descriptors and execs shardflow).
HIGH_FDS = 1100
wrapper = [sys.executable, "-c", f"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({HIGH_FDS + 900}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
null = os.open("/dev/null", os.O_RDONLY)
for _ in range({HIGH_FDS}):
    os.set_inheritable(os.dup(null), True)
os.execv(sys.argv[1], sys.argv[1:])
"""]
# `--metrics 0`, a port without a host, listens on loopback only (the kernel's table of listening sockets says).
proc, port = run_with(graph, "--step-time", "0.03", "--metrics", "0", wrapper=wrapper, close_fds=False)
check(port is not None, f"a process holding {HIGH_FDS} descriptors serves metrics: {getattr(proc, 'first_lines', '')}")
try:
    with open("/proc/net/tcp") as f:
        listening = {(r[1].split(":")[0], int(r[1].split(":")[1], 16)) for r in (line.split() for line in f)
                     if r[3] == "0A"}  # TCP_LISTEN
    with open("/proc/net/tcp6") as f:
        listening |= {(r[1].split(":")[0], int(r[1].split(":")[1], 16)) for r in (line.split() for line in f)
                      if r[3] == "0A"}
    check({a for a, p in listening if p == port} == {"0100007F"}, f"a PORT alone binds 127.0.0.1 only: {listening}")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    check("shardflow_stage_items_total" in strict_check(text), "/metrics answers with its series above fd 1,024")
finally:
    code, err = finish(proc)
check(code == 0, f"the run above fd 1,024 succeeded: {err[-2000:]}")

# Node names are whatever a graph file quotes: label values escape backslash, double quote and newline, so a
# name cannot end its label or start a line of its own (a series of the name's choosing). Node names keep 31
# bytes: 17 two-byte characters are cut inside the 16th, and the stray byte must not spoil the scrape's UTF-8.
hostile = {"shard_source": 'src"} 1\nevil_total 1', "tar_split": "split\\n\\", "batch": 'b"\\\n"',
           "device_sink": "\u00e9" * 17}
label = dict(hostile, device_sink="\u00e9" * 15 + "\ufffd")
with open(os.path.join(tmp, "hostile.yaml"), "w") as f:
    f.write(f"epochs: 1\nmetrics: 127.0.0.1:0\nstages:\n")
    for stype, opts in [("shard_source", {"urls": pattern, "shuffle": "false"}), ("tar_split", {}),
                        ("batch", {"batch_size": BATCH}), ("device_sink", {})]:
        f.write(f"  - type: {stype}\n")
        if stype in hostile:
            f.write(f"    name: {json.dumps(hostile[stype])}\n")  # a JSON string is a YAML double-quoted scalar
        for k, v in opts.items():
            f.write(f"    {k}: {v}\n")
proc, port = run_with(os.path.join(tmp, "hostile.yaml"), "--step-time", "0.03")
check(port is not None, f"a graph with quoted node names serves metrics: {getattr(proc, 'first_lines', '')}")
try:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
finally:
    finish(proc)
types = strict_check(text)
check(all(n.startswith("shardflow_") for n in types), f"no family of a node name's making: {sorted(types)}")
families = {f.name: f for f in text_string_to_metric_families(text)}
check(set(families) == {n[:-len("_total")] if n.endswith("_total") else n for n in types},
      f"prometheus_client reads the same families as the strict check: {sorted(families)}")
got = [(s.name, s.labels["stage"], s.labels["type"]) for s in families["shardflow_stage_items"].samples]
check(sorted((stage, stype) for _, stage, stype in got) == sorted((name, stype) for stype, name in label.items()),
      f"exactly one items series per node, named as the graph names it, with its own type: {got}")
check.done("metrics")
