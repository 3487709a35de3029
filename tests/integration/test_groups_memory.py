"""Memory stays bounded with a slow consumer: a group of 2 local worker processes, a trainer that sleeps.

The graph: shard_source -> tar_split -> [decode -> augment in group `decoders`, processes: 2]
-> shuffle -> batch -> device_sink, on 64x64 RGB images (PPM, 12,288 bytes a sample in; augment
makes float32 CHW, 49,152 bytes a sample out).  The group produces 1,000-4,000 samples a second here
(2 cores; measured by the fast run below); `shardflow run --step-time 0.1` makes the consumer take
0.1 s per batch of 32, 320 samples a second, so without flow control the head (results waiting to
be passed on) or the workers (units queued at them) would fill with the whole input.

While the run goes on, VmRSS and VmHWM of the head and of both workers (the head's children
running `shardflow worker`) are sampled from /proc/PID/status every 20 ms.  The bound for every
process is

    bound = base + window x unit_samples x (bytes in + bytes out a sample) + QUEUES + SLACK

- base: the same process's VmHWM in a run of the same graph with a fast consumer (no --step-time):
  code, libraries, thread stacks, allocator arenas;
- window x unit_samples samples (8 x 16 x 61,455 bytes = 7.5 MiB): what the group's flow control
  lets pile up at the head behind a slow consumer (units waiting, at workers, or done but not yet
  passed on, each held as its input until the result arrives and then as its result); for a
  worker, credits x unit_samples (4 x 16 x 61,455 bytes = 3.8 MiB: a worker holds at most its
  --credits units, 4 by default);
- QUEUES: what the graph's counts allow once everything behind the consumer is full, whichever
  the consumer.  Head (15.8 MiB): queue_size (64) results on the edge out of the group, the
  shuffle buffer (64 results), six batches of 32 results (4 on the batch edge, one being filled,
  one at the consumer) and queue_size inputs on the edge into the group.  Worker (4.5 MiB): its
  three edges of queue_size items (inputs, decoded images, results).  The fast run fills only
  part of this, so it is added in full;
- SLACK (8 MiB): allocator and ZeroMQ buffer noise between runs.

An unbounded pipeline would hold the whole input behind the consumer: 2,000 results x 49,152 bytes
= 94 MiB for the short input, 940 MiB for the long one, both well over the bound.  The same bound
must hold for an input 10x longer (the shards listed ten times over through symlinks), sampled for
the same time: memory does not grow with input length.  In the second half of each sampled span
no process's RSS may climb by more than SLACK (a steady state, not a slow leak).  Each slow run is
stopped with SIGTERM after SAMPLE_SECONDS.  Skipped (77) in sanitizer builds.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import sfutil

SHARDS, PER_SHARD, SIZE = 10, 200, 64
WINDOW, UNIT, BATCH = 8, 16, 32
STEP = 0.1                   # seconds per batch: 320 samples/s
SAMPLE_SECONDS = 5.0
SLACK = 8 << 20
BYTES_IN = SIZE * SIZE * 3 + 15          # the PPM member (header included)
BYTES_OUT = SIZE * SIZE * 3 * 4 + 8      # float32 CHW image and the int64 label
MiB = 1 << 20
CREDITS = 4                              # shardflow worker's default --credits
QUEUES = {"head": (64 + 64 + 6 * BATCH) * BYTES_OUT + 64 * BYTES_IN,
          "worker": 64 * (BYTES_IN + SIZE * SIZE * 3 + BYTES_OUT)}


def write_graph(path, url):
    with open(path, "w") as f:
        f.write(f"""seed: 1
epochs: 1
groups:
  decoders:
    processes: 2
    unit_samples: {UNIT}
    window: {WINDOW}
    worker_threads: 1
stages:
  - type: shard_source
    urls: {url}
  - type: tar_split
  - type: decode
    group: decoders
  - type: augment
    group: decoders
    crop: random
    size: {SIZE}
    padding: 4
    flip: 0.5
  - type: shuffle
    buffer_size: 64
  - type: batch
    batch_size: {BATCH}
  - type: device_sink
""")
    return path


def status(pid):
    """(VmRSS, VmHWM) in bytes, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    vals = {}
    for line in text.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":")
            vals[k] = int(v.split()[0]) * 1024
    if "VmHWM" not in vals:
        return None  # a zombie
    return vals["VmRSS"], vals["VmHWM"]


def workers_of(head):
    """The pids of the head's children that run `shardflow worker`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != head:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if b"\0worker\0" in f.read():
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return sorted(out)


def run_sampled(graph, step, seconds, log_path):
    """Runs the graph; samples memory every 20 ms until it ends or `seconds` pass (then SIGTERM).

    Returns ({'head': hwm, 'worker<pid>': hwm, ...}, [(t, {role: rss})], finished, log text)."""
    args = [sfutil.SHARDFLOW, "run", graph, "--log-steps", "5", "--no-summary"]
    if step:
        args += ["--step-time", str(step)]
    with open(log_path, "w") as log:
        head = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    hwm, timeline, pids = {}, [], {}
    t0 = time.monotonic()
    finished = False
    try:
        while True:
            t = time.monotonic() - t0
            if head.poll() is not None:
                finished = True
                break
            if t > seconds:
                break
            for w in workers_of(head.pid):
                pids.setdefault(f"worker{len(pids)}", w) if w not in pids.values() else None
            rss = {}
            for role, pid in [("head", head.pid)] + list(pids.items()):
                s = status(pid)
                if s:
                    rss[role] = s[0]
                    hwm[role] = max(hwm.get(role, 0), s[1])
            timeline.append((t, rss))
            time.sleep(0.02)
    finally:
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(timeout=15)
            except subprocess.TimeoutExpired:
                head.kill()
                head.wait()
        for pid in pids.values():  # local workers end with their head; make sure
            for _ in range(100):
                if status(pid) is None:
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, signal.SIGKILL)
    with open(log_path) as f:
        text = f.read()
    return hwm, timeline, finished, text


def main():
    if os.environ.get("SF_SANITIZE", "none") != "none":
        print("skip: under a sanitizer RSS measures its shadow memory and quarantine, not the engine's")
        return 77
    check = sfutil.Checks()
    tmp = tempfile.mkdtemp(prefix="sf-memory-")
    try:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        url, _ = sfutil.make_dataset(data, SHARDS, PER_SHARD, size=SIZE, seed=2)
        # The 10x longer input: the same shard files under ten times as many names.
        long_dir = os.path.join(tmp, "long")
        os.makedirs(long_dir)
        for i in range(10 * SHARDS):
            os.symlink(os.path.join(data, f"shard-{i % SHARDS:06d}.tar"), os.path.join(long_dir, f"shard-{i:06d}.tar"))
        long_url = os.path.join(long_dir, "shard-{%06d..%06d}.tar" % (0, 10 * SHARDS - 1))
        short_graph = write_graph(os.path.join(tmp, "short.yaml"), url)
        long_graph = write_graph(os.path.join(tmp, "long.yaml"), long_url)

        base, _, finished, log = run_sampled(short_graph, 0, 60, os.path.join(tmp, "fast.log"))
        check(finished and f"Replica Train Samples={SHARDS * PER_SHARD} " in log, f"the fast run completes:\n{log}")
        check(set(base) == {"head", "worker0", "worker1"}, f"sampled the head and two workers: {sorted(base)}")
        print("fast consumer:", [line for line in log.splitlines() if "Replica Train Samples=" in line][0].strip())
        term = {"head": WINDOW * UNIT * (BYTES_IN + BYTES_OUT) + QUEUES["head"],
                "worker": CREDITS * UNIT * (BYTES_IN + BYTES_OUT) + QUEUES["worker"]}
        bound = {role: b + term[role.rstrip("01")] + SLACK for role, b in base.items()}
        print("base (fast consumer) VmHWM MiB: " + ", ".join(f"{r} {b / MiB:.1f}" for r, b in sorted(base.items())))
        print(f"above the base: head {term['head'] / MiB:.1f} MiB (window + queues), worker "
              f"{term['worker'] / MiB:.1f} MiB (credits + queues), slack {SLACK / MiB:.0f} MiB")

        for name, graph in [("short", short_graph), ("long (10x)", long_graph)]:
            hwm, timeline, finished, log = run_sampled(graph, STEP, SAMPLE_SECONDS, os.path.join(tmp, f"{name[:4]}.log"))
            check(not finished, f"{name}: the slow run is still going after {SAMPLE_SECONDS} s:\n{log}")
            check(set(hwm) == {"head", "worker0", "worker1"}, f"{name}: sampled the head and two workers: {sorted(hwm)}")
            rates = [line for line in log.splitlines() if "Rate=" in line and "Step=" in line]
            check(len(rates) >= 3, f"{name}: the consumer took batches while sampled:\n{log}")
            print(f"{name}: peak VmHWM MiB: " + ", ".join(
                f"{r} {h / MiB:.1f} (bound {bound[r] / MiB:.1f})" for r, h in sorted(hwm.items())))
            mid = [rss for t, rss in timeline if t > SAMPLE_SECONDS / 2]
            last = timeline[-1][1]
            print(f"{name}: VmRSS MiB after {timeline[-1][0]:.1f} s: " +
                  ", ".join(f"{r} {v / MiB:.1f}" for r, v in sorted(last.items())) +
                  f"; last rate line: {rates[-1].strip() if rates else '-'}")
            for role, h in hwm.items():
                check(h <= bound[role], f"{name}: {role} peaked at {h / MiB:.1f} MiB, over its bound {bound[role] / MiB:.1f} MiB")
            # Steady state: in the second half nothing climbs by more than the slack.
            for role in hwm:
                vals = [rss[role] for rss in mid if role in rss]
                check(vals and max(vals) - vals[0] <= SLACK,
                      f"{name}: {role} RSS still climbing in the second half: {vals[0] / MiB:.1f} -> {max(vals) / MiB:.1f} MiB")
        check.done("groups_memory")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
