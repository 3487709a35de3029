"""`shardflow dot` with groups and rates, and `shardflow run --stats-json`: a graph whose decode and augment run in
a group of 2 processes is run with --stats-json; the JSON lines parse with Python's json, the last record's counts
equal the end-of-run stage table and tarfile's sample count; the DOT output, read back by Graphviz itself
(`dot -Tjson`), has the group as a cluster holding its stages, the graph file's edges, and edge labels equal to
the record's numbers (recomputed here as items / elapsed seconds), a mix's per-input counts; node labels with each
stage's busy share and replicas (recomputed from the record's busy seconds), and the node (or group) that the
record's bottleneck line names drawn red with "bottleneck" in its label, on runs built to be decode-bound (large
noisy JPEGs, one decode replica; then the same decode in a group of one worker); -T svg renders an SVG; without
Graphviz on PATH the message says to install it."""
import atexit
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, group_graph, make_dataset, run, stage_table, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-dot-")
atexit.register(shutil.rmtree, tmp, True)  # on failure too

urls, _ = make_dataset(tmp, shards=4, per_shard=100, size=16)
graph, _ = group_graph(tmp, "g", urls, group={"processes": 2}, batch_size=16, epochs=1)
stats = os.path.join(tmp, "stats.jsonl")
p = run(["run", graph, "--log-steps", "5", "--stats-json", stats], timeout=120)

# 1. JSON lines: one record per 5 batches and a final one; the last equals the stage table and the tar files.
with open(stats) as f:
    records = [json.loads(line) for line in f]
samples = sum(1 for s in range(4) for m in tarfile.open(os.path.join(tmp, f"shard-{s:06d}.tar"))
              if m.name.endswith(".ppm"))
steps = -(-samples // 16)
check(len(records) == steps // 5 + 1, f"{steps // 5} interval records and a final one, got {len(records)}")
check([r["final"] for r in records] == [False] * (len(records) - 1) + [True], "only the last record is final")
check([r["step"] for r in records[:-1]] == list(range(5, steps + 1, 5)), f"steps: {[r['step'] for r in records]}")
last = records[-1]
check(last["total_samples"] == samples and last["samples"] == samples and last["epoch"] == 1,
      f"final record counts {samples} samples of epoch 1: {last['total_samples']}, {last['samples']}")
table = stage_table(p.stderr)
nodes = {n["name"]: n for n in last["nodes"]}
check(set(nodes) == set(table), f"record's nodes {sorted(nodes)} = the table's {sorted(table)}")
for name, row in table.items():
    for k in ("items", "errors", "skipped", "filtered"):
        check(nodes[name][k] == row[k], f"{name}.{k}: record {nodes[name][k]}, table {row[k]}")
    check(abs(nodes[name]["bytes"] / 1048576 - row["mib"]) <= 0.051, f"{name} MiB: {nodes[name]['bytes']} vs {row}")
check(nodes["tar_split"]["items"] == samples, f"tar_split read every sample: {nodes['tar_split']['items']}")
group = last["groups"][0]
# Two local worker processes; one may end the short run before the other joins, so count what the record lists.
live = sum(1 for w in group["workers"] if w["live"])
check(group["name"] == "decoders" and 1 <= group["live_workers"] == live <= 2, f"group and live workers: {group}")
decoded = sum(s["items"] for w in group["workers"] for s in w["stages"] if s["name"] == "decode")
check(decoded == samples, f"the workers' decode stages made {decoded} of {samples} samples")
check(last["bottleneck"].startswith("bottleneck: "), f"bottleneck line: {last['bottleneck']}")


# A mix's record counts what each input gave, as the table's "<-" lines; dot labels its ports and rates.
mix = os.path.join(tmp, "mix.yaml")
with open(mix, "w") as f:
    f.write("epochs: 1\nstages:\n"
            f"  - {{name: src_a, type: shard_source, urls: \"{urls}\"}}\n  - {{name: split_a, type: tar_split}}\n"
            f"  - {{name: src_b, type: shard_source, urls: \"{urls}\"}}\n  - {{name: split_b, type: tar_split}}\n"
            "  - {name: mix, type: mix, inputs: [split_a, split_b], weights: [0.5, 0.5]}\n"
            "  - {type: batch, batch_size: 50, partial: true}\n  - {type: device_sink}\n")
mix_stats = os.path.join(tmp, "mix.jsonl")
q = run(["run", mix, "--stats-json", mix_stats])
mix_last = [json.loads(line) for line in open(mix_stats)][-1]
mixed = next(n for n in mix_last["nodes"] if n["name"] == "mix")
table_inputs = stage_table(q.stderr)["mix"]["inputs"]
check(mixed.get("inputs") == table_inputs and sum(table_inputs.values()) == mixed["items"],
      f"the mix's inputs {mixed.get('inputs')} = the table's {table_inputs}")
mix_dot = run(["dot", mix, "--stats", mix_stats]).stdout
check(re.search(r'"split_b" -> "mix" \[label="in1\\n[\d.]+ items/s\\n[\d.]+ MiB/s"\]', mix_dot),
      f"mix ports: {mix_dot}")

# 2. The DOT text as Graphviz reads it: clusters, edges and labels.
def bottleneck_name(record):
    """The node or group the record's bottleneck line names ("bottleneck: NAME (..."), or None (the consumer, none
    saturated)."""
    m = re.match(r"bottleneck: (\S+) \((?!busiest)", record["bottleneck"])
    return m.group(1) if m and not record["bottleneck"].startswith("bottleneck: the consumer") else None


def busy_label(record, name, replicas):
    """The busy line dot should print for node name: its busy share over its replicas (and a group's workers),
    recomputed from the record's busy seconds."""
    t = record["elapsed_seconds"]
    for n in record["nodes"]:
        if n["name"] == name:
            check(n["replicas"] == replicas, f"{name}: the record's replicas {n['replicas']}, the graph's {replicas}")
            return f"busy {100 * n['busy_seconds'] / (t * replicas):.0f}% of {replicas} replica(s)"
    stages = [s for g in record["groups"] for w in g["workers"] for s in w["stages"] if s["name"] == name]
    busy = sum(s["busy_seconds"] for s in stages)
    return f"busy {100 * busy / (t * replicas * len(stages)):.0f}% of {replicas} replica(s) x {len(stages)} worker(s)"


def check_nodes(gv, record, replicas):
    """Each drawn node's label: name, (type), busy share and replicas, and "bottleneck" with a red border on the one
    node the record's line names, on no other."""
    named = bottleneck_name(record)
    types = {n["name"]: n["type"] for n in record["nodes"]}
    drawn = [o for o in gv["objects"] if not o["name"].startswith("cluster")]
    check(sorted(o["name"] for o in drawn) == sorted(replicas), f"nodes drawn: {[o['name'] for o in drawn]}")
    for o in drawn:
        name = o["name"]
        want = f"{name}\\n({types.get(name, name)})\\n{busy_label(record, name, replicas[name])}"
        if name.endswith("_normalize"):  # the augment the plan added on the head (a group sends uint8 crops)
            want += "\\nplanned: normalises the group's crops"
        marked = name == named
        check(o["label"] == want + ("\\nbottleneck" if marked else ""), f"{name}'s label {o['label']!r}, want {want!r}"
              + (" + bottleneck" if marked else ""))
        check((o.get("color") == "red" and o.get("penwidth") == "3") == marked,
              f"{name}: red border {o.get('color')} {o.get('penwidth')}, bottleneck {named}")
    for c in gv["objects"]:
        if c["name"].startswith("cluster"):
            marked = c["name"] == f"cluster_{named}"
            check((c.get("color") == "red") == marked and c["label"].endswith("\\nbottleneck") == marked,
                  f"cluster {c['name']}: {c.get('color')} {c['label']!r}, bottleneck {named}")


def gv_json(text):
    return json.loads(subprocess.run(["dot", "-Tjson"], input=text, capture_output=True, text=True, check=True).stdout)


def rates(name):
    """items/s and MiB/s name sent over the run, from the record's raw counts."""
    items = bytes_ = 0
    if name in nodes:
        items, bytes_ = nodes[name]["items"], nodes[name]["bytes"]
    for w in group["workers"]:
        for s in w["stages"]:
            if s["name"] == name:
                items, bytes_ = items + s["items"], bytes_ + s["bytes"]
    t = last["elapsed_seconds"]
    return f"{items / t:.1f} items/s\\n{bytes_ / 1048576 / t:.2f} MiB/s"


text = run(["dot", graph, "--stats", stats]).stdout
gv = gv_json(text)
objects = gv["objects"]
by_id = {o["_gvid"]: o for o in objects}
clusters = [o for o in objects if o["name"].startswith("cluster")]
check([c["name"] for c in clusters] == ["cluster_decoders"], f"one cluster per group: {[c['name'] for c in clusters]}")
check(sorted(by_id[i]["name"] for i in clusters[0].get("nodes", [])) == ["augment", "decode"],
      f"the group's stages inside its cluster: {clusters[0].get('nodes')}")
named = bottleneck_name(last)
check(clusters[0]["label"] == f"group decoders\\nprocesses: 2\\nlive workers: {live}"
      + ("\\nbottleneck" if named == "decoders" else ""), f"label: {clusters[0]['label']}")
# The group's augment makes float32: the plan sends uint8 crops and normalises them on the head (augment_normalize).
chain = ["shard_source", "tar_split", "decode", "augment", "augment_normalize", "batch", "device_sink"]
edges = {(by_id[e["tail"]]["name"], by_id[e["head"]]["name"]): e.get("label") for e in gv["edges"]}
check(set(edges) == set(zip(chain, chain[1:])), f"the graph file's edges: {sorted(edges)}")
for (tail, _), label in edges.items():  # decode -> augment, in one group's workers, may carry deferred fields (the plan)
    want = {"decode": "deferred fields\\n", "augment": "uint8 HWC crops (planned)\\n"}.get(tail, "") + rates(tail)
    check(label == want, f"edge from {tail}: label {label!r}, the record says {rates(tail)!r}")
cpus = len(os.sched_getaffinity(0))  # the group's workers plan one replica per CPU for decode and augment
check_nodes(gv, last, {"shard_source": 1, "tar_split": 1, "decode": cpus, "augment": cpus, "augment_normalize": cpus,
                       "batch": 1, "device_sink": 1})
plain = run(["dot", graph]).stdout
check("items/s" not in plain and plain.split("cluster_decoders")[1].split("}")[1].count("label=") == 2,
      "no rates without --stats (the two labels: the plan's deferred edge and uint8 crops)")

# 3. A decode-bound chain: 1280x960 noisy JPEGs take libjpeg-turbo ~15 ms each with one decode replica, while
# augment (two replicas) only crops 16 pixels out of each (decode's defer_jpeg false: else augment would decode
# them): decode is the bottleneck, and marked so.
rng = np.random.default_rng(1)
jpegs = []
for i in range(32):
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (960, 1280, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
    jpegs.append((f"{i:07d}", {"jpg": buf.getvalue(), "cls": b"1"}))
big = write_shard(os.path.join(tmp, "big-000000.tar"), jpegs)
heavy = write_graph(os.path.join(tmp, "heavy.yaml"), [
    ("shard_source", dict(urls=big, shuffle=False)), ("tar_split", {}), ("decode", dict(replicas=1, defer_jpeg=False)),
    ("augment", dict(crop="center", size=16, dtype="uint8", layout="hwc", replicas=2)),
    ("batch", dict(batch_size=4)), ("device_sink", {})], epochs=1)
heavy_stats = os.path.join(tmp, "heavy.jsonl")
run(["run", heavy, "--log-steps", "0", "--stats-json", heavy_stats], timeout=120)
heavy_last = [json.loads(line) for line in open(heavy_stats)][-1]
check(bottleneck_name(heavy_last) == "decode", f"the run is decode-bound: {heavy_last['bottleneck']}")
heavy_gv = gv_json(run(["dot", heavy, "--stats", heavy_stats]).stdout)
print("decode-bound:", heavy_last["bottleneck"], "|",
      [o["label"] for o in heavy_gv["objects"] if o["name"] in ("decode", "augment")])
check_nodes(heavy_gv, heavy_last, {"shard_source": 1, "tar_split": 1, "decode": 1, "augment": 2, "batch": 1,
                                   "device_sink": 1})
# Without --stats no busy line and no mark.
bare = gv_json(run(["dot", heavy]).stdout)
check(all("busy" not in o.get("label", "") and "color" not in o for o in bare["objects"]), f"no stats: {bare}")

# The same decode in a group of one worker: the group is the bottleneck, its cluster marked.
grouped, _ = group_graph(tmp, "heavy-group", big, group={"processes": 1}, batch_size=4, epochs=1)
with open(grouped) as f:  # one decode replica that decodes whole images, as above: else the worker keeps up
    text = f.read().replace("  - type: decode\n", "  - type: decode\n    replicas: 1\n    defer_jpeg: false\n", 1)
with open(grouped, "w") as f:
    f.write(text)
grouped_stats = os.path.join(tmp, "heavy-group.jsonl")
run(["run", grouped, "--log-steps", "0", "--stats-json", grouped_stats], timeout=120)
grouped_last = [json.loads(line) for line in open(grouped_stats)][-1]
check(bottleneck_name(grouped_last) == "decoders", f"the group is the bottleneck: {grouped_last['bottleneck']}")
check_nodes(gv_json(run(["dot", grouped, "--stats", grouped_stats]).stdout), grouped_last,
            {"shard_source": 1, "tar_split": 1, "decode": 1, "augment": cpus, "augment_normalize": cpus, "batch": 1,
             "device_sink": 1})

# 4. Rendering: an SVG Graphviz drew, with the cluster; without Graphviz a clear message.
svg = os.path.join(tmp, "g.svg")
run(["dot", graph, "--stats", stats, "-T", "svg", "-o", svg])
root = ET.parse(svg).getroot()
titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
check(root.tag.endswith("svg") and "cluster_decoders" in titles and "decode" in titles, f"SVG titles: {titles}")
q = subprocess.run([os.path.abspath(SHARDFLOW), "dot", graph, "-T", "png", "-o", os.path.join(tmp, "g.png")],
                   capture_output=True, text=True, env={"PATH": tmp})
check(q.returncode != 0 and "apt-get install graphviz" in q.stderr and not os.path.exists(os.path.join(tmp, "g.png")),
      f"no Graphviz on PATH: {q.returncode} {q.stderr}")
q = run(["dot", graph, "--stats", graph], check=False)
check(q.returncode == 1 and re.search(r"--stats .*g\.yaml:\d+: not a stats record", q.stderr), f"bad stats: {q.stderr}")

check.done("dot")
