"""`shardflow run`'s progress: under a pseudo-terminal (Python's pty module) a one-line bar redrawn in place with
carriage returns, carrying samples of the epoch length (samples_per_epoch), a rate and an ETA, and no rate log
lines, and with a group its live workers; off a terminal no bar and the reference `| Training` lines as before."""
import atexit
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, make_dataset, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-progress-")
atexit.register(shutil.rmtree, tmp, True)  # on failure too

urls, _ = make_dataset(tmp, shards=2, per_shard=100, size=8)
graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=urls, samples_per_epoch=320)),
    ("tar_split", {}), ("decode", {}), ("batch", dict(batch_size=8)), ("device_sink", {})], epochs=1)
args = ["run", graph, "--log-steps", "10", "--step-time", "0.04", "--no-summary"]  # 40 steps, about 1.6 s


def run_on_pty(args):
    """Runs the CLI with a pseudo-terminal as stdout and stderr; returns (exit status, all it wrote)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([SHARDFLOW] + args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=60), out.decode()


status, out = run_on_pty(args)
check(status == 0, f"run on a pty: {status}\n{out}")
bars = re.findall(r"\r\[[#.]+\] (\d+)/320 samples  ([\d.]+) samples/s  ETA (\d+):(\d\d)  epoch 1 step (\d+)", out)
check(len(bars) >= 3, f"the bar is redrawn in place at least 3 times: {bars}\n{out!r}")
check(all(float(rate) > 0 for _, rate, _, _, _ in bars), f"every bar has a rate: {bars}")
done = [int(n) for n, *_ in bars]
check(done == sorted(done) and done[-1] > done[0], f"samples grow: {done}")
etas = [int(m) * 60 + int(s) for _, _, m, s, _ in bars]
# The ETA is what is left at the bar's rate (the first bar's rate counts the start-up, slow under a sanitizer),
# and it counts down to a few seconds.
check(all(abs(e - (320 - int(n)) / float(r)) <= 1 for e, (n, r, *_) in zip(etas, bars)),
      f"the ETA is what is left at the bar's rate: {etas} {bars}")
check(etas[0] >= etas[-1] and etas[-1] <= 10, f"the ETA counts down to a few seconds: {etas}")
check("| Training" not in out, "no rate log lines on a terminal")
check(re.search(r"\| Epoch=1 Rank=0 Replica Train Samples=320 Steps=40", out), f"the epoch line stays: {out!r}")

p = run(args)
check("\r" not in p.stdout and "\033" not in p.stdout and "ETA" not in p.stdout, f"no bar off a terminal: {p.stdout!r}")
check(len(re.findall(r"^\| Training Rank=0 Epoch=1 Step=\d+ Rate=", p.stdout, re.M)) == 4, f"rate lines: {p.stdout}")

# With a group, the bar shows its live workers.
group = write_graph(os.path.join(tmp, "group.yaml"), [
    ("shard_source", dict(urls=urls, samples_per_epoch=320)), ("tar_split", {}), ("decode", dict(group="decoders")),
    ("batch", dict(batch_size=8)), ("device_sink", {})], groups={"decoders": {"processes": 2}}, epochs=1)
status, out = run_on_pty(["run", group] + args[2:])
check(status == 0 and re.search(r"\r\[[#.]+\] \d+/320 samples .* epoch 1 step \d+  workers 2", out),
      f"the group's 2 live workers in the bar: {out!r}")

check.done("progress")
