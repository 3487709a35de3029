"""`metrics: HOST:PORT` serves /metrics in Prometheus' text format 0.0.4: Debian's real `prometheus` server
scrapes a slowly consumed pipeline every second, and the series read back through its HTTP API
(/api/v1/query) must equal the pipeline's own end-of-run table and the shards' sample count by tarfile;
/metrics itself must pass a strict line-by-line check of the format and prometheus_client's parser."""
import atexit
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
from sfutil import SHARDFLOW, Checks, free_port, make_dataset, tar_keys, wait_for, write_graph  # noqa: E402

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
    check(all(s.labels["replica"] == "0" for s in families["shardflow_stage_items"].samples), "replica label")
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
    # The pipeline's own stats: the end-of-run table (node, stage, reps, items, MiB, busy s, ...).
    table = {m.group(1): m.groups() for m in re.finditer(
        r"^(\w+)\s+(\w+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)$", err_rest[0], re.M)}
    check(int(table["tar_split"][3]) == samples, f"the table's tar_split items = {samples}: {table['tar_split']}")
    check(float(table["decode"][5]) + 0.005 >= busy["decode"],
          f"Prometheus' decode busy seconds {busy} do not exceed the final table's {table['decode'][5]}")
    check(int(table["device_sink"][3]) == samples // BATCH, "the run delivered every batch")
finally:
    for proc in (run, prom):
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()

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
check.done("metrics")
