"""A group's local processes hand results to the head through shared-memory rings (engine/group/shm_ring.c).

Every run's batches (device_sink npy dumps) must equal the same graph run in one process, key for key and
byte for byte, while the head's closing line says how many result bytes came through shared memory and how
many through the socket: the default ring carries (nearly) every tensor; small rings are released and written
again; a ring smaller than one tensor carries none
(all through the socket: the fallback); a ring that fills up carries some; a worker killed with SIGKILL in
the middle of the epoch is restarted with a fresh ring and nothing is lost or repeated.
"""
import os
import re
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
tmp = tempfile.mkdtemp(prefix="sf-groups-shm-")
SIZE = 64
urls, truth = make_dataset(tmp, shards=6, per_shard=100, size=SIZE)
# The group's augment makes float32 CHW; the plan sends it as uint8 HWC crops, normalised on the head
# (docs/groups.md): what crosses the ring is one uint8 image of 12 KiB a sample.
TENSOR = SIZE * SIZE * 3
EXPECTED = len(truth) * TENSOR


def graph(name, group=None):
    """decode + augment (random crop SIZE with padding 4, flip, float32 CHW) in group `decoders` when group is given."""
    return group_graph(tmp, name, urls, group, size=SIZE, padding=4, seed=7)


def same_batches(a, b, what):
    check(len(a) == len(b), f"{what}: {len(a)} batches, one process made {len(b)}")
    for (ea, ba, ka, fa), (eb, bb, kb, fb) in zip(a, b):
        check((ea, ba) == (eb, bb) and ka == kb, f"{what}: epoch {ea} batch {ba}: keys or order differ")
        for name in fb:
            check(fa[name].dtype == fb[name].dtype and fa[name].tobytes() == fb[name].tobytes(),
                  f"{what}: epoch {ea} batch {ba} field {name} is not byte-identical")


def ring_counts(err, what):
    m = re.search(r"results: (\d+) bytes through shared memory, (\d+) through the socket", err)
    check(m is not None, f"{what}: the head reports shared-memory and socket bytes:\n{err}")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


ref_path, ref_out = graph("reference")
run(["run", ref_path, "--quiet", "--no-summary"])
reference = read_batches(ref_out)
check(sum(len(k) for _, _, k, _ in reference) == len(truth), "one process: every sample once")

# The default ring (64 MiB): (nearly) every image tensor through shared memory; the labels go through the socket.
path, out = graph("ring", {"processes": 2, "unit_samples": 8})
p = run(["run", path, "--no-summary"])
same_batches(read_batches(out), reference, "processes: 2 with rings")
shm, sock = ring_counts(p.stderr, "default ring")
check(shm >= 0.8 * EXPECTED and shm + sock >= EXPECTED,
      f"default ring: {shm} of {EXPECTED} bytes through shared memory ({sock} through the socket), want most")

# Rings of 512 KiB (42 tensors) for 3.5 MiB per process: their space is released and written again, several times.
path, out = graph("reuse", {"processes": 2, "unit_samples": 8, "window": 4, "shm_ring": "512KiB"})
p = run(["run", path, "--no-summary"])
same_batches(read_batches(out), reference, "rings reused")
shm, sock = ring_counts(p.stderr, "rings reused")
# How much fits depends on how soon the head's releases reach the worker (scheduling): the test asks for
# reuse, more than twice what the two rings hold at once, not for a share.
RINGS = 2 * (512 << 10)
print(f"rings reused: {shm} bytes through shared memory, {sock} through the socket")
check(shm > 2 * RINGS and shm + sock >= EXPECTED,
      f"rings reused: {shm} bytes through shared memory ({sock} through the socket), want over {2 * RINGS}: "
      f"each ring's space written again")

# A ring smaller than one tensor: every result through the socket, nothing lost or changed.
path, out = graph("tiny", {"processes": 2, "unit_samples": 8, "shm_ring": "4KiB"})
p = run(["run", path, "--no-summary"])
same_batches(read_batches(out), reference, "a ring smaller than one tensor")
shm, sock = ring_counts(p.stderr, "tiny ring")
check(shm == 0 and sock >= EXPECTED, f"tiny ring: {shm} bytes through shared memory, {sock} through the socket")

# A ring of 5 tensors and a slow trainer: the ring fills up, the rest goes through the socket.
path, out = graph("full", {"processes": 2, "unit_samples": 8, "shm_ring": "60KiB"})
p = run(["run", path, "--no-summary", "--step-time", "0.005"])
same_batches(read_batches(out), reference, "a ring that fills up")
shm, sock = ring_counts(p.stderr, "full ring")
check(shm > 0 and sock > TENSOR and shm + sock >= EXPECTED,
      f"full ring: {shm} bytes through shared memory and {sock} through the socket, want both")

# SIGKILL of a local worker mid-epoch (stopped first, so it surely holds units and ring extents): the head keeps
# the dead ring's views, restarts the process with a fresh ring, and the batches are the same.
path, out = graph("kill", {"processes": 2, "unit_samples": 8, "heartbeat_interval": "100ms",
                           "heartbeat_timeout": "1s"})
# A trainer slow enough (~3 s an epoch) that units still wait when the stop comes, however late the second
# worker joined on a loaded machine.
head = subprocess.Popen([SHARDFLOW, "run", path, "--step-time", "0.08"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE, text=True)
lines = []
reader = threading.Thread(target=lambda: lines.extend(head.stderr), daemon=True)
reader.start()
deadline = time.time() + 30
pids = []
while len(pids) < 2 and time.time() < deadline:
    pids = [int(m) for m in re.findall(r"decoders-local-\d+ \(pid (\d+),", "".join(list(lines)))]
    time.sleep(0.02)
check(len(pids) == 2, f"both local workers joined: {''.join(lines)}")
time.sleep(0.05)
os.kill(pids[0], signal.SIGSTOP)
time.sleep(0.2)
os.kill(pids[0], signal.SIGKILL)
try:
    rc = head.wait(timeout=120)
except subprocess.TimeoutExpired:
    head.kill()
    rc = None
reader.join(timeout=10)
err = "".join(lines)
check(rc == 0, f"kill -9: the head finished the epoch:\n{err}")
check("starting another" in err, f"kill -9: the head restarted the process:\n{err}")
reassigned = re.search(r"(\d+) units reassigned", err)
check(reassigned and int(reassigned.group(1)) > 0, f"kill -9: the dead worker held units (mid-epoch):\n{err}")
batches = read_batches(out)
check(sum(len(k) for _, _, k, _ in batches) == len(truth), "kill -9: every sample exactly once")
same_batches(batches, reference, "kill -9 of a local worker")
shm, sock = ring_counts(err, "kill -9")
check(shm > 0, f"kill -9: results went through shared memory ({shm} bytes)")

check.done("groups_shm")
