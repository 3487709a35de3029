"""Workers that answer twice, late, or never: each sample still reaches the trainer exactly once.

A real `shardflow worker` runs behind a proxy written with Debian's python3-zmq that the head takes
for the worker: the proxy forwards every message both ways (docs/protocol.md: a ROUTER toward the
worker, a DEALER toward the head) and reads only the type in each header, to tamper with RESULTs:

  - twice: every RESULT is forwarded, then sent again.  The head must drop each copy (counted as
    "duplicate results dropped", exactly as many as were sent) and pass every sample on once;
  - late: RESULTs are held for 2 s.  A second worker connected directly must get the late
    units (a deadline derived from observed unit times) and the held RESULTs, arriving afterwards
    while their units may still wait in the head's window, are duplicates;
  - never: RESULTs are swallowed while the worker keeps sending heartbeats (so the head never
    declares it dead; heartbeat_timeout is long).  The epoch must not stall: its units go to the
    other worker after their deadline.

Every run's batches must equal a one-process run of the same graph (same keys in the same order,
same pixels), and every epoch holds each key exactly once.
"""
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, group_graph, make_dataset, read_batches, run  # noqa: E402

try:
    import zmq
except ImportError:
    print("skip: python3-zmq is not installed (tools/setup-debian.sh installs it)")
    sys.exit(77)

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-groups-peers-")
EPOCHS = 2
urls, truth = make_dataset(tmp, shards=6, per_shard=100, size=16)
RESULT = 5  # sf_wire.MessageType


def header_type(frame):
    """Field 2 (type) of a Header frame: the fields before it are varints (version) or absent."""
    pos = 0
    while pos < len(frame):
        tag, pos = varint(frame, pos)
        if tag & 7 != 0:
            return None
        value, pos = varint(frame, pos)
        if tag >> 3 == 2:
            return value
    return None


def varint(data, pos):
    n = shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, pos


class Proxy:
    """Stands between one worker and the head; mode: 'twice', 'late' (hold RESULTs hold_s) or 'never'."""

    def __init__(self, ctx, head_endpoint, endpoint, mode, hold_s=2.0):
        self.mode, self.hold_s = mode, hold_s
        self.front = ctx.socket(zmq.ROUTER)  # the worker connects here
        self.front.linger = 0
        self.front.bind(endpoint)
        self.back = ctx.socket(zmq.DEALER)   # the head sees this as the worker
        self.back.linger = 0
        self.back.connect(head_endpoint)
        self.results = self.extra = self.swallowed = 0
        self.held = []  # (release time, frames)
        self.stop = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def to_head(self, frames):
        if header_type(frames[0]) != RESULT:
            self.back.send_multipart(frames)
            return
        self.results += 1
        if self.mode == "twice":
            self.back.send_multipart(frames)
            self.back.send_multipart(frames)
            self.extra += 1
        elif self.mode == "late":
            self.held.append((time.monotonic() + self.hold_s, frames))
        else:
            self.swallowed += 1

    def loop(self):
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        worker_id = None
        while not self.stop:
            ready = dict(poller.poll(20))
            if self.front in ready:
                frames = self.front.recv_multipart(copy=True)
                worker_id = frames[0]
                self.to_head(frames[1:])
            if self.back in ready and worker_id is not None:
                self.front.send_multipart([worker_id] + self.back.recv_multipart(copy=True))
            while self.held and self.held[0][0] <= time.monotonic():
                self.back.send_multipart(self.held.pop(0)[1])

    def close(self):
        self.stop = True
        self.thread.join(timeout=10)
        self.front.close(0)
        self.back.close(0)


def graph(name, group=None):
    return group_graph(tmp, name, urls, group, shuffle_buffer=200, seed=21, epochs=EPOCHS)


def worker(endpoint, name):
    return subprocess.Popen([SHARDFLOW, "worker", "--connect", endpoint, "--name", name, "--connect-timeout", "20",
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def same_as_reference(out, what):
    got = read_batches(out)
    check(len(got) == len(reference), f"{what}: {len(got)} batches, one process made {len(reference)}")
    for (e, b, keys, fields), (re_, rb, rkeys, rfields) in zip(got, reference):
        check((e, b) == (re_, rb) and keys == rkeys, f"{what}: epoch {e} batch {b}: keys differ from one process's")
        for name in rfields:
            check(np.array_equal(fields[name], rfields[name]), f"{what}: epoch {e} batch {b}: {name} differs")
    for e in range(EPOCHS):
        seen = sorted(k for ee, _, ks, _ in got if ee == e for k in ks)
        check(seen == sorted(truth), f"{what}: epoch {e} holds each key exactly once ({len(seen)} keys)")


def summary_count(err, label):
    line = next((x for x in err.splitlines() if x.startswith("group decoders:")), "")
    check(line, f"the head prints the group's summary:\n{err[-3000:]}")
    return int(line.split(" " + label)[0].rsplit(" ", 1)[1])


def scenario(mode, timeout, step_time):
    """Runs the group with one worker behind a proxy in `mode` and (but for 'twice') one worker connected directly."""
    head_ipc = os.path.join(tmp, f"{mode}-head.ipc")
    proxy_ipc = os.path.join(tmp, f"{mode}-proxy.ipc")
    path, out = graph(mode, {"listen": f"ipc://{head_ipc}", "unit_samples": 8, "heartbeat_interval": "200ms",
                             "heartbeat_timeout": "120s", "worker_timeout": "60s"})
    t0 = time.monotonic()
    head = subprocess.Popen([SHARDFLOW, "run", path, "--log-steps", "0", "--step-time", str(step_time)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    proxy = Proxy(ctx, f"ipc://{head_ipc}", f"ipc://{proxy_ipc}", mode)
    workers = [worker(f"ipc://{proxy_ipc}", f"{mode}-behind-proxy")]
    if mode != "twice":
        # The proxied worker joins first and holds units from the start: the direct one starts once a result of
        # the proxied one has come through the proxy (however slow its start on a loaded machine).
        deadline = time.monotonic() + 30
        while proxy.results == 0 and head.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        workers.append(worker(f"ipc://{head_ipc}", "direct"))
    try:
        _, err = head.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        head.kill()
        _, err = head.communicate()
        raise AssertionError(f"{mode}: the run did not finish within {timeout} s:\n{err[-3000:]}")
    took = time.monotonic() - t0
    for w in workers:
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.kill()
    proxy.close()
    ctx.term()
    check(head.returncode == 0, f"{mode}: the run succeeds:\n{err[-3000:]}")
    same_as_reference(out, mode)
    print(f"{mode}: {took:.1f} s; proxy saw {proxy.results} results; "
          + next((x for x in err.splitlines() if x.startswith("group decoders:")), "(no summary)"))
    return proxy, err, took


ref_path, reference_out = graph("reference")
run(["run", ref_path, "--quiet", "--no-summary"])
reference = read_batches(reference_out)

# Every RESULT twice: each copy is dropped and counted; the window is kept full of finished units
# (a slow trainer), so most copies find their unit still there.
proxy, err, _ = scenario("twice", timeout=120, step_time=0.01)
check(proxy.extra > 0, "the proxy sent copies")
check(summary_count(err, "duplicate results dropped") == proxy.extra,
      f"every copy is counted as a duplicate ({proxy.extra} sent):\n{err[-2000:]}")

# RESULTs held for 2 s: the late units go to the other worker; the held copies arrive as duplicates (the
# trainer's steps make the run last longer than that).
proxy, err, _ = scenario("late", timeout=120, step_time=0.05)
check(proxy.results > 0, "the proxied worker had units")
check(summary_count(err, "units reassigned") > 0, f"late units were handed to the other worker:\n{err[-2000:]}")
check(summary_count(err, "duplicate results dropped") > 0, f"the held results were dropped:\n{err[-2000:]}")

# RESULTs never come, heartbeats do (heartbeat_timeout 120 s): the epoch goes on without waiting for them.
proxy, err, took = scenario("never", timeout=90, step_time=0)
check(proxy.swallowed > 0, "the proxied worker had units")
check(took < 60, f"the run did not wait for the heartbeat timeout ({took:.1f} s)")
check("late" in err and summary_count(err, "units reassigned") > 0, f"the head says it handed late units on:\n{err[-2000:]}")
check.done("groups_peers")
