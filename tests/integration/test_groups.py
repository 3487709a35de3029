"""Groups over real processes and sockets: the batches equal one process's, whatever the workers do.

Each run's batches (device_sink npy dumps) are compared with the same graph run without groups in one
process: same keys in the same order, same pixels.  Workers over ipc:// (started by the head, or by
the test) and tcp://127.0.0.1 (plaintext); workers killed with SIGKILL at several points, stopped with
SIGTERM, joining late; a head with no workers; corrupt samples decoded on a worker; graph errors.
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import (SHARDFLOW, Checks, free_port, group_graph, make_dataset, read_batches, run, wait_for,  # noqa: E402
                    write_shard)

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-groups-")
urls, truth = make_dataset(tmp, shards=8, per_shard=250, size=16)


def graph(name, group=None, batch_size=16, source_urls=urls, epochs=1):
    """The reference graph; with group (a dict of group options) decode and augment run in group `decoders`."""
    return group_graph(tmp, name, source_urls, group, shuffle_buffer=300, batch_size=batch_size, seed=5, epochs=epochs)


def same_batches(a, b, what):
    check(len(a) == len(b), f"{what}: {len(a)} batches, one process made {len(b)}")
    for (ea, ba, ka, fa), (eb, bb, kb, fb) in zip(a, b):
        check((ea, ba) == (eb, bb), f"{what}: batch order")
        check(ka == kb, f"{what}: epoch {ea} batch {ba} keys differ from one process's")
        for name in fb:
            check(np.array_equal(fa[name], fb[name]), f"{what}: epoch {ea} batch {ba} field {name} differs")


def every_key_once(batches, what):
    keys = [k for _, _, ks, _ in batches for k in ks]
    check(len(keys) == len(truth), f"{what}: {len(keys)} samples, want {len(truth)} (none lost, none twice)")
    check(set(keys) == set(truth), f"{what}: every key exactly once")


def start_worker(endpoint, *extra):
    return subprocess.Popen([SHARDFLOW, "worker", "--connect", endpoint, "--quiet", "--connect-timeout", "20", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def head(path, *extra, **kw):
    return subprocess.Popen([SHARDFLOW, "run", path, "--log-steps", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


class Head:
    """A head whose stderr is read as it comes, to act when its workers have joined."""

    def __init__(self, path, *extra, **kw):
        self.proc = head(path, *extra, **kw)
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self.reader.start()

    def wait_joined(self, n, timeout=30):
        deadline = time.time() + timeout
        while sum(" joined" in line for line in list(self.lines)) < n:
            check(time.time() < deadline, f"{n} workers join within {timeout} s: {''.join(self.lines)}")
            time.sleep(0.02)

    def finish(self, what, timeout=120):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"{what}: timed out\n{''.join(self.lines)}")
        self.reader.join(timeout=10)
        return self.proc.returncode, "".join(self.lines)


def finish(proc, what, timeout=120):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{what}: timed out\n{err}")
    return proc.returncode, out, err


# The reference: one process, no groups.
ref_path, ref_out = graph("reference")
run(["run", ref_path, "--quiet", "--no-summary"])
reference = read_batches(ref_out)
every_key_once(reference, "one process")

# 1, 2 and 4 local processes over ipc:// started by the head itself: the same batches.
for n in (1, 2, 4):
    path, out = graph(f"local-{n}", {"processes": n, "unit_samples": 16})
    # a slow trainer (20 ms a step, 2.5 s an epoch), so the second process has joined before the progress lines end
    p = run(["run", path, "--log-steps", "10", "--step-time", "0.02"])
    same_batches(read_batches(out), reference, f"processes: {n}")
    if n == 2:
        check("Workers=2" in p.stdout, "the progress line counts live workers")
        check("worker decoders-local-0" in p.stderr and "worker decoders-local-1" in p.stderr,
              "the summary has a table for each worker process")

# Remote workers over tcp:// on loopback, plaintext explicitly allowed.
port = free_port()
path, out = graph("tcp", {"listen": f"tcp://127.0.0.1:{port}", "plaintext": "true", "worker_timeout": "60s"})
h = Head(path, "--step-time", "0.02")  # long enough for both workers to join before the epoch ends
workers = [start_worker(f"tcp://127.0.0.1:{port}", "--plaintext") for _ in range(2)]
h.wait_joined(2)
rc, err = h.finish("tcp head")
check(rc == 0, f"tcp head failed:\n{err}")
for w in workers:
    check(w.wait(timeout=30) == 0, f"a worker leaves with status 0 when the run ends: {w.stderr.read()}")
same_batches(read_batches(out), reference, "tcp://127.0.0.1, 2 workers")

# tcp:// without keys and without plaintext fails closed, naming the option.
path, _ = graph("closed", {"listen": f"tcp://127.0.0.1:{free_port()}"})
p = run(["run", path], check=False)
check(p.returncode != 0, "a tcp:// group without keys refuses to start")
check("allowed_keys" in p.stderr or "keygen" in p.stderr, f"...and says how to fix it: {p.stderr}")

# Rendezvous files: the file tells a worker where its head is, never how secure to be. A file saying
# plaintext is refused unless the worker was started with --plaintext (and no --key); a file (or its
# directory) others could have written is refused as ssh refuses loose key files; a FIFO never blocks.
rdir = os.path.join(tmp, "rendezvous")
os.mkdir(rdir, 0o700)
rkeys = os.path.join(tmp, "rendezvous-keys")
run(["keygen", "w", "--dir", rkeys])
rfile = os.path.join(rdir, "head.rendezvous")
path, out = graph("rendezvous-run", {"listen": "tcp://127.0.0.1:0", "plaintext": "true", "rendezvous": rfile,
                                 "worker_timeout": "60s"})
h = Head(path, preexec_fn=lambda: os.umask(0))
wait_for(lambda: os.path.exists(rfile), 20, "the rendezvous file")
check(os.stat(rfile).st_mode & 0o777 == 0o644, f"the head writes it 0644 whatever its umask: {os.stat(rfile)}")


def rendezvous_refused(what, *extra, needles=("plaintext", "--plaintext"), file=rfile):
    t0 = time.time()
    p = run(["worker", "--rendezvous", file, "--connect-timeout", "3", "--quiet", *extra], check=False, timeout=15)
    check(p.returncode != 0 and file in p.stderr and all(n in p.stderr for n in needles),
          f"rendezvous, {what}: the worker refuses, naming the file and {needles}: {p.returncode} {p.stderr}")
    check(time.time() - t0 < 10, f"rendezvous, {what}: ...at once")


rendezvous_refused("a worker with --key, the file says plaintext", "--key", os.path.join(rkeys, "w.key"))
rendezvous_refused("a worker without --plaintext, the file says plaintext")
p = run(["worker", "--rendezvous", rfile, "--plaintext", "--key", os.path.join(rkeys, "w.key")], check=False)
check(p.returncode == 2 and "--plaintext or --key" in p.stderr, f"--plaintext with --key is a usage error: {p.stderr}")
os.chmod(rfile, 0o666)
rendezvous_refused("a file others may write", "--plaintext", needles=("chmod go-w",))
os.chmod(rfile, 0o644)
os.chmod(rdir, 0o777)
rendezvous_refused("a directory others may write", "--plaintext", needles=(rdir, "chmod go-w"))
os.chmod(rdir, 0o700)
if os.geteuid() == 0:
    os.chown(rfile, 65534, 65534)
    rendezvous_refused("a file another user owns", "--plaintext", needles=("owned by",))
    os.chown(rfile, 0, 0)
fifo = os.path.join(rdir, "fifo.rendezvous")
os.mkfifo(fifo, 0o600)
try:
    rendezvous_refused("a FIFO", "--plaintext", needles=("regular file",), file=fifo)
except subprocess.TimeoutExpired:
    check(False, "rendezvous, a FIFO: the worker blocked in open past --connect-timeout")
w = subprocess.Popen([SHARDFLOW, "worker", "--rendezvous", rfile, "--plaintext", "--quiet", "--connect-timeout", "20"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
rc, err = h.finish("rendezvous head")
check(rc == 0 and w.wait(timeout=30) == 0, f"a worker started with --plaintext joins a plaintext head:\n{err}")
same_batches(read_batches(out), reference, "a worker found through a rendezvous file")

# Workers killed with SIGKILL in the middle of the epoch, at several points: nothing lost, nothing twice.
# SIGSTOP first, so the victim surely holds units (the head keeps sending it work while it has credits).
for kill_at in (0.3, 0.9, 1.6):
    ipc = os.path.join(tmp, f"kill-{kill_at}.ipc")
    path, out = graph(f"kill-{kill_at}", {"listen": f"ipc://{ipc}", "heartbeat_interval": "100ms",
                                           "heartbeat_timeout": "1s", "worker_timeout": "60s", "unit_samples": 8})
    # The latest kill comes 1.6 s after the third join: a slower trainer leaves units waiting then, however
    # late that join was on a loaded machine.
    h = Head(path, "--step-time", "0.06" if kill_at > 1 else "0.03")
    workers = [start_worker(f"ipc://{ipc}") for _ in range(3)]
    h.wait_joined(3)
    time.sleep(kill_at)
    workers[0].send_signal(signal.SIGSTOP)
    time.sleep(0.3)
    workers[0].send_signal(signal.SIGKILL)
    rc, err = h.finish(f"kill at {kill_at}s")
    check(rc == 0, f"kill at {kill_at}s: the head finished the epoch:\n{err}")
    check("missed heartbeats" in err or "cannot be reached" in err, f"kill at {kill_at}s: the head noticed:\n{err}")
    reassigned = int(err.split(" units reassigned")[0].rsplit(" ", 1)[1])
    check(reassigned > 0, f"kill at {kill_at}s: the dead worker's units went to others:\n{err}")
    batches = read_batches(out)
    every_key_once(batches, f"kill at {kill_at}s")
    same_batches(batches, reference, f"kill at {kill_at}s")
    for w in workers:
        w.wait(timeout=30)

# SIGTERM: the worker leaves cleanly, says so, and its units go to the other worker at once.
ipc = os.path.join(tmp, "term.ipc")
path, out = graph("term", {"listen": f"ipc://{ipc}", "heartbeat_timeout": "30s", "worker_timeout": "60s",
                           "unit_samples": 8})
h = Head(path, "--step-time", "0.02")
workers = [start_worker(f"ipc://{ipc}") for _ in range(2)]
h.wait_joined(2)
time.sleep(0.8)
workers[0].send_signal(signal.SIGTERM)
check(workers[0].wait(timeout=10) == 0, "a worker stopped by SIGTERM exits with status 0")
rc, err = h.finish("SIGTERM")
check(rc == 0 and " left;" in err, f"the head saw the worker leave (no 30 s heartbeat wait):\n{err}")
same_batches(read_batches(out), reference, "a worker stopped by SIGTERM")

# A worker that joins late receives work; until then the head waits.
ipc = os.path.join(tmp, "late.ipc")
path, out = graph("late", {"listen": f"ipc://{ipc}", "worker_timeout": "60s"})
h = head(path)
# A worker of another wire version is told why it gets no work: a BYE, readable across versions.
import zmq  # Debian's python3-zmq
zctx = zmq.Context()
old = zctx.socket(zmq.DEALER)
old.connect(f"ipc://{ipc}")
old.send(bytes([0x08, 0x01, 0x10, 0x01]))  # Header{version: 1, type: HELLO}: before WELCOME carried the graph's nodes
check(old.poll(10000), "the head answers a worker of another version")
reply = old.recv_multipart()
check(len(reply) == 1 and b"wire version 1" in reply[0] and b"2" in reply[0] and reply[0][:2] == b"\x08\x02",
      f"...with a version-2 BYE naming both versions: {reply}")
old.close(0)
zctx.term()
time.sleep(1.0)
check(h.poll() is None, "the head waits for workers")
late = start_worker(f"ipc://{ipc}")
rc, _, err = finish(h, "late worker")
check(rc == 0, f"a late worker completes the epoch:\n{err}")
late.wait(timeout=30)
same_batches(read_batches(out), reference, "a late worker")

# No worker at all: the head fails after worker_timeout with a message saying what to start.
ipc = os.path.join(tmp, "none.ipc")
path, _ = graph("none", {"listen": f"ipc://{ipc}", "worker_timeout": "2s"})
t0 = time.time()
rc, _, err = finish(head(path), "no workers", timeout=60)
check(rc != 0 and "no live worker" in err and "shardflow worker --connect" in err,
      f"a head without workers fails after worker_timeout with a clear message:\n{err}")
check(time.time() - t0 < 30, "...soon after the timeout")

# Local workers that keep dying: once the restarts are used up and nothing can join (no listen:), the run
# fails and says how each worker ended, instead of waiting for ever (worker_timeout is 0).
for body, how in (("kill -9 $$", "killed by signal 9"), ("exit 3", "exited with status 3")):
    script = os.path.join(tmp, "dying-worker.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\n{body}\n")
    os.chmod(script, 0o755)
    path, _ = graph("dying", {"processes": 2, "worker_command": script})
    t0 = time.time()
    rc, _, err = finish(head(path), f"local workers that {how}", timeout=60)
    check(rc == 1 and how in err, f"local workers that {how}: the run fails and says how they ended:\n{err}")
    check("not restarted" in err and "worker_command" in err, f"...that they are not restarted, and what to check:\n{err}")
    check(time.time() - t0 < 30, "...soon")

# Errors on a worker travel to the head: a corrupt image is counted and reported there, as in one process.
bad = os.path.join(tmp, "bad")
os.makedirs(bad)
good = np.zeros((16, 16, 3), np.uint8).tobytes()
write_shard(os.path.join(bad, "bad-000000.tar"), [
    (f"{i:07d}", {"ppm": (b"P6\n16 16\n255\n" + good) if i != 3 else b"P6\n16 16\n255\nshort", "cls": b"1"})
    for i in range(20)])
bad_url = os.path.join(bad, "bad-000000.tar")
path1, _ = graph("bad-one", source_urls=bad_url)
one = run(["run", path1, "--no-summary", "--log-steps", "0"])
path2, _ = graph("bad-group", {"processes": 1}, source_urls=bad_url)
two = run(["run", path2, "--no-summary", "--log-steps", "0"])
check("1 error record(s), 1 sample(s) skipped" in one.stderr, f"one process counts the corrupt sample: {one.stderr}")
check("1 error record(s), 1 sample(s) skipped" in two.stderr, f"the head counts the worker's record: {two.stderr}")
check("0000003" in two.stderr and "bad-000000.tar" in two.stderr, "the record names the key and the shard")

# Graph errors name the line.
for text, want in [
    ("groups:\n  decoders:\n    processes: 1\nstages:\n  - type: shard_source\n    urls: x.tar\n"
     "  - type: tar_split\n  - type: shuffle\n    group: decoders\n  - type: batch\n  - type: device_sink\n",
     ":9:"),
    ("stages:\n  - type: shard_source\n    urls: x.tar\n  - type: tar_split\n  - type: decode\n    group: nope\n"
     "  - type: batch\n  - type: device_sink\n", ":6:"),
    ("groups:\n  decoders:\n    procesess: 1\nstages:\n  - type: shard_source\n    urls: x.tar\n  - type: tar_split\n"
     "  - type: decode\n    group: decoders\n  - type: batch\n  - type: device_sink\n", ":3:"),
]:
    gp = os.path.join(tmp, "err.yaml")
    with open(gp, "w") as f:
        f.write(text)
    p = run(["run", gp], check=False)
    check(p.returncode != 0 and want in p.stderr, f"graph error at line {want}: {p.stderr}")

# A stage that only a worker starts names the head's graph file and the stage's line there: the worker builds its
# stages from the graph's nodes sent in WELCOME (before, from YAML printed by the head, whose lines were its own).
gp = os.path.join(tmp, "worker-err.yaml")
with open(gp, "w") as f:
    f.write(f"groups:\n  decoders:\n    processes: 1\nstages:\n  - type: shard_source\n    urls: {urls}\n"
            "  - type: tar_split\n  - type: decode\n    group: decoders\n  - type: augment\n    group: decoders\n"
            "    crop: random_resized\n    size: 8\n    padding: 2\n  - type: batch\n  - type: device_sink\n")
p = run(["run", gp, "--log-steps", "0"], check=False, timeout=60)
check(p.returncode != 0 and f"{gp}:10: worker decoders-local-0: node 'augment'" in p.stderr,
      f"a worker's graph error names the head's file and line 10: {p.stderr}")

check.done("groups")
