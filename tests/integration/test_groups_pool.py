"""One pool of decode workers for every rank: 3 `shardflow worker`s each serve both heads of a 2-rank job.

Both heads run the same graph as rank 0 and rank 1 of world size 2 (`shardflow run --rank R --world-size 2`),
each with its own group endpoint; every worker is started with `--connect` once per head.  One worker is killed
with SIGKILL in the middle of the epoch.  Each rank's batches must equal that rank's run in one process without
groups (keys in order, pixels).  Fairness: each surviving worker reports, per head, the units and samples it
served and the units it started while the other head had units waiting too (printed); both heads have work
for the whole epoch (equal epochs, started together), so neither may get under 30% of a worker's samples.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, group_graph, make_dataset, read_batches, run  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-groups-pool-")
procs = []


def start(args):
    p = subprocess.Popen([SHARDFLOW, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    procs.append(p)
    lines = []
    threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True).start()
    return p, lines


def same_batches(a, b, what):
    check(len(a) == len(b) and len(a) > 0, f"{what}: {len(a)} batches, one process made {len(b)}")
    for (ea, ba, ka, fa), (eb, bb, kb, fb) in zip(a, b):
        check((ea, ba) == (eb, bb), f"{what}: batch order")
        check(ka == kb, f"{what}: epoch {ea} batch {ba} keys differ from one process's")
        for name in fb:
            check(np.array_equal(fa[name], fb[name]), f"{what}: epoch {ea} batch {ba} field {name} differs")


try:
    urls, truth = make_dataset(tmp, shards=8, per_shard=500, size=32)
    ranks = (0, 1)
    rank_args = {r: ["--rank", str(r), "--world-size", "2"] for r in ranks}

    # The references: each rank alone in one process, no groups.
    reference = {}
    for r in ranks:
        path, out = group_graph(tmp, f"ref-{r}", urls, shuffle_buffer=100, seed=11)
        run(["run", path, "--quiet", "--no-summary", *rank_args[r]])
        reference[r] = read_batches(out)

    endpoints = {r: f"ipc://{tmp}/rank-{r}.ipc" for r in ranks}
    graphs = {r: group_graph(tmp, f"pool-{r}", urls, {"listen": endpoints[r], "heartbeat_interval": "100ms",
                                                      "heartbeat_timeout": "1s", "worker_timeout": "60s",
                                                      "unit_samples": 8}, shuffle_buffer=100, seed=11)
              for r in ranks}
    # Workers first: they wait for heads that appear later.  One thread and two slots each; trainers of 20 ms a
    # step make the epoch last long enough (2.5 s or more) to kill a worker in its middle.
    connect = [a for r in ranks for a in ("--connect", endpoints[r])]
    workers = [start(["worker", *connect, "--threads", "1", "--credits", "2", "--connect-timeout", "30",
                      "--name", f"w{i}"]) for i in range(3)]
    heads = {r: start(["run", graphs[r][0], "--log-steps", "0", "--step-time", "0.02",
                                *rank_args[r]]) for r in ranks}
    deadline = time.time() + 30
    while sum(" joined" in line for _, lines in workers for line in list(lines)) < 6:
        check(time.time() < deadline, "3 workers join both heads within 30 s: "
              + "".join(line for _, lines in workers for line in lines))
        time.sleep(0.02)
    time.sleep(0.3)
    victim = workers[0][0]
    victim.send_signal(signal.SIGSTOP)  # stopped first, so it likely holds units of both heads when it dies
    time.sleep(0.3)
    victim.send_signal(signal.SIGKILL)
    reassigned = {}
    for r in ranks:
        p, lines = heads[r]
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rank {r}: timed out\n{''.join(lines)}")
        time.sleep(0.2)
        err = "".join(lines)
        check(p.returncode == 0, f"rank {r}: the head finished the epoch:\n{err}")
        check("cannot be reached" in err or "missed heartbeats" in err, f"rank {r}: the head noticed:\n{err}")
        # The victim may hold no unit of one rank when it dies (units go where credits and the window allow),
        # so each rank's count is reported and their sum required; exactly-once is what the batches check.
        reassigned[r] = int(err.split(" units reassigned")[0].rsplit(" ", 1)[1])
        print(f"rank {r}: {reassigned[r]} units of the killed worker reassigned")
        batches = read_batches(graphs[r][1])
        keys = [k for _, _, ks, _ in batches for k in ks]
        check(len(keys) == len(set(keys)), f"rank {r}: no sample twice")
        same_batches(batches, reference[r], f"rank {r}, 3 shared workers, one killed")
    check(sum(reassigned.values()) > 0, "the killed worker's units went to other workers")
    check(set(k for r in ranks for _, _, ks, _ in read_batches(graphs[r][1]) for k in ks) == set(truth),
          "the two ranks together have every key")

    # Fairness: per surviving worker, each head's share of the samples it served.
    for i, (p, lines) in enumerate(workers[1:], 1):
        check(p.wait(timeout=30) == 0, f"worker w{i} leaves with status 0 when both heads end:\n{''.join(lines)}")
        time.sleep(0.1)
        served = {}
        for line in lines:
            m = re.search(r"left ipc://.*rank-(\d)\.ipc: served (\d+) units, (\d+) samples \((\d+) units while", line)
            if m:
                served[int(m.group(1))] = tuple(int(g) for g in m.groups()[1:])
        check(set(served) == set(ranks), f"worker w{i} reports what it served each head:\n{''.join(lines)}")
        samples = sum(s for _, s, _ in served.values())
        contended = sum(c for _, _, c in served.values())
        print(f"worker w{i}: " + ", ".join(
            f"rank {r}: {u} units, {s} samples ({100 * s / max(samples, 1):.0f}%), {c} of {contended} contended "
            f"units ({100 * c / max(contended, 1):.0f}%)" for r, (u, s, c) in sorted(served.items())))
        for r, (_, s, _) in served.items():
            check(s >= 0.3 * samples, f"worker w{i}: rank {r} got {s} of its {samples} samples (want >= 30%)")

    # Each head runs its own stages: a worker serving two heads whose groups differ (crop 16 with flips, crop 8
    # without) gives each head what its own graph makes in one process.
    def sized(name, crop, flip, group=None):
        path, out = group_graph(tmp, name, urls, group, seed=11)
        with open(path) as f:
            text = f.read().replace("size: 16", f"size: {crop}").replace("flip: 0.5", f"flip: {flip}")
        with open(path, "w") as f:
            f.write(text)
        return path, out

    variants = {"a": (16, 0.5), "b": (8, 0.0)}
    for v, (crop, flip) in variants.items():
        path, out = sized(f"ref-{v}", crop, flip)
        run(["run", path, "--quiet", "--no-summary"])
        reference[v] = read_batches(out)
    check(reference["a"][0][3]["ppm"].shape[-1] == 16 and reference["b"][0][3]["ppm"].shape[-1] == 8,
          "the two graphs differ")
    # This worker finds the heads through their rendezvous files (one --rendezvous per head, as under Slurm).
    own = {v: sized(f"own-{v}", *variants[v], {"listen": f"ipc://{tmp}/own-{v}.ipc", "worker_timeout": "60s",
                                                "rendezvous": f"{tmp}/own-{v}.rendezvous"})
           for v in variants}
    w, w_lines = start(["worker", "--rendezvous", f"{tmp}/own-a.rendezvous", "--rendezvous", f"{tmp}/own-b.rendezvous",
                        "--connect-timeout", "30"])
    own_heads = {v: start(["run", own[v][0], "--log-steps", "0"]) for v in variants}
    for v, (p, lines) in own_heads.items():
        check(p.wait(timeout=60) == 0, f"head {v} with its own stages finished:\n{''.join(lines)}")
        same_batches(read_batches(own[v][1]), reference[v], f"head {v}'s own stages on a shared worker")
    check(w.wait(timeout=30) == 0, f"the shared worker ends when both heads have:\n{''.join(w_lines)}")
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    shutil.rmtree(tmp, ignore_errors=True)

check.done("groups_pool")
