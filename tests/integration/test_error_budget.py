"""A run in which everything fails must not exit 0: an epoch that delivers no sample is an error (also with
`epochs: 0`, which used to spin through empty epochs for ever), the error budget (max_errors,
max_error_rate; by default a run where most samples fail stops) ends a run of bad input, and
configuration mistakes (pipe: without allow_pipe, mean/std that fit no image) are found when the graph
is loaded, with file:line. Counts come from Python's tarfile."""
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, nginx, ppm_bytes, tar_keys, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-budget-")
rng = np.random.default_rng(1)


def shard(name, n, bad):
    """A shard of n samples; the keys in bad have a label that is not a number."""
    samples = []
    for i in range(n):
        img = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        samples.append((f"{name}{i:05d}", {"ppm": ppm_bytes(img), "cls": b"x" if i in bad else b"1"}))
    return write_shard(os.path.join(tmp, name + ".tar"), samples)


def graph(name, urls, source=None, augment=None, **settings):
    stages = [("shard_source", dict(urls=urls, shuffle=False, **(source or {}))), ("tar_split", {}), ("decode", {})]
    if augment:
        stages.append(("augment", augment))
    stages += [("batch", dict(batch_size=8, partial=True)), ("device_sink", {})]
    return write_graph(os.path.join(tmp, name + ".yaml"), stages, **settings)


def run(path, timeout=30):
    """Runs the graph; a run that does not end within timeout seconds is a failed check, not a hung test."""
    try:
        return subprocess.run([SHARDFLOW, "run", path, "--no-summary", "--log-steps", "0"], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(f"{path}: still running after {timeout} s ({out.count(chr(10))} lines on stdout)")


def counted(stderr):
    m = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", stderr)
    return (int(m[1]), int(m[2])) if m else (0, 0)


# Every shard missing: epoch 0 delivered nothing. epochs: 1 exited 0; epochs: 0 never ended.
missing = os.path.join(tmp, "missing-{000000..000003}.tar")
for epochs in (1, 0):
    p = run(graph(f"missing{epochs}", missing, epochs=epochs))
    check(p.returncode == 1, f"epochs {epochs}, every shard missing: exit 1, got {p.returncode}\n{p.stderr}")
    check("epoch 0 delivered no sample" in p.stderr and "missing-000003.tar" in p.stderr,
          f"epochs {epochs}: the message says the epoch was empty and names a shard: {p.stderr}")
    check("Replica Train Samples" not in p.stdout, f"epochs {epochs}: no empty epoch line: {p.stdout}")

# One cause, said once: two missing shards are two error records, each printed once; the empty epoch they
# cause is the reason the run stopped, said once on the "stopped:" line, not a third record (before: 3
# records, and the epoch's message printed twice, as an error and as the stopped line).
gone = graph("gone", os.path.join(tmp, "gone-{0..1}.tar"), epochs=1)
p = run(gone)
lines = p.stderr.splitlines()
check(p.returncode == 1 and counted(p.stderr) == (2, 0), f"two missing shards: 2 error records: {p.stderr}")
for i in (0, 1):
    check(sum(f"gone-{i}.tar: cannot open shard" in line for line in lines) == 1,
          f"the record of gone-{i}.tar is printed once: {p.stderr}")
check(p.stderr.count("delivered no sample") == 1 and
      any(line.startswith("shardflow: stopped: epoch 0 delivered no sample") for line in lines),
      f"the empty epoch is said once, as why the run stopped: {p.stderr}")
check(not any("error: epoch" in line for line in lines), f"the empty epoch is not an error record: {p.stderr}")
check(re.search(r"the first: tar_split: \S*gone-0\.tar", p.stderr),
      f"the stopped line refers to the first cause: {p.stderr}")
# error_policy: fail: the record that stopped the run is printed once (the stopped line refers to it).
p = run(graph("gone-fail", os.path.join(tmp, "gone-{0..1}.tar"), epochs=1, error_policy="fail"))
check(p.returncode == 1 and p.stderr.count("cannot open shard") == 1 and "stopped" in p.stderr
      and counted(p.stderr) == (1, 0), f"fail policy: the record once, then the stop: {p.stderr}")

# A server that has none of the shards (HTTP 404 for each): the same.
with nginx(tmp) as base:
    p = run(graph("http404", base + "/nothing-{0..3}.tar", epochs=0))
    check(p.returncode == 1 and "delivered no sample" in p.stderr and "404" in p.stderr,
          f"epochs 0 over HTTP 404s: exit 1 naming the status: {p.returncode} {p.stderr}")

# Shards without a single sample (members without a key) are an empty epoch too, even without any error record.
empty = os.path.join(tmp, "nokeys.tar")
with tarfile.open(empty, "w") as tf:
    info = tarfile.TarInfo("README")
    info.size = 2
    tf.addfile(info, io.BytesIO(b"hi"))
check(tar_keys(empty) == ["README"], "the reference sees one member without an extension")
p = run(graph("nokeys", empty, epochs=0))
check(p.returncode == 1 and "delivered no sample" in p.stderr, f"a shard without samples, epochs 0: {p.returncode} {p.stderr}")

# Most samples bad: the default max_error_rate (0.5) stops the run with a message that says what to change.
n, bad = 40, set(range(0, 40, 4)) | set(range(1, 40, 4)) | set(range(2, 40, 4))  # 30 of 40
mostly_bad = shard("mostly", n, bad)
keys = tar_keys(mostly_bad)
check(len(keys) == n, "the reference reads 40 samples")
p = run(graph("rate", mostly_bad, epochs=1))
check(p.returncode == 1 and "max_error_rate" in p.stderr and f"30 of {n} samples" in p.stderr,
      f"30 of 40 samples bad: stopped by max_error_rate: {p.returncode}\n{p.stderr}")
check("stopped: stopping" not in p.stderr and "shardflow: stopped: error budget exceeded: 30 of 40" in p.stderr
      and "fix the input" in p.stderr, f"the budget's stop is said without a double prefix: {p.stderr}")
p = run(graph("rate-raised", mostly_bad, epochs=2, max_error_rate=0.8))
check(p.returncode == 0 and counted(p.stderr) == (60, 60) and p.stdout.count("Samples=10 ") == 2,
      f"max_error_rate 0.8 lets the same run through, counted: {p.returncode} {p.stdout} {p.stderr}")

# A long run of bad samples stops while running, not only at the epoch's end (epochs: 0 would never end).
all_bad = shard("allbad", 500, set(range(500)))
p = run(graph("allbad", all_bad, epochs=0))
errors, skipped = counted(p.stderr)
check(p.returncode == 1 and "max_error_rate" in p.stderr and 0 < skipped < 300,
      f"every sample bad, epochs 0: stops once 100 samples were read, long before the shard's end: "
      f"{p.returncode} {skipped}\n{p.stderr}")
check("fix the input" in p.stderr and "every sample failed" not in p.stderr,
      f"bad labels (decode, a built-in, fails on input): the input is to be fixed: {p.stderr}")

# A stage of the user's (a plugin) that fails on every sample with the same error: its code or options are
# wrong, not the input (the example plugin's scale with a field no sample has).
os.environ["SHARDFLOW_PLUGIN_PATH"] = os.path.join(os.environ["SF_BUILD_ROOT"], "plugins", "example")
fine = shard("fine", 40, set())
stages = [("shard_source", dict(urls=fine, shuffle=False)), ("tar_split", {}), ("decode", {}),
          ("scale", dict(field="nosuch")), ("batch", dict(batch_size=8)), ("device_sink", {})]
for rate in (0.5, 1):  # stopped by the budget, or by the empty epoch
    p = run(write_graph(os.path.join(tmp, f"scale-{rate}.yaml"), stages, plugins=["example"], seed=0, epochs=1,
                        max_error_rate=rate))
    check(p.returncode == 1 and "every sample failed in scale with the same error: field 'nosuch' is missing" in p.stderr
          and "the stage's code or options are wrong, not the input" in p.stderr and "fix the input" not in p.stderr,
          f"max_error_rate {rate}: a plugin failing on every sample is said to be wrong: {p.stderr}")
    check(counted(p.stderr) == (40, 40), f"max_error_rate {rate}: 40 records, 40 skipped: {p.stderr}")

# A few bad samples stay under the default budget; max_errors sets a count.
few = shard("few", 40, {5, 17, 33})
p = run(graph("few", few, epochs=2))
check(p.returncode == 0 and counted(p.stderr) == (6, 6), f"3 of 40 bad: the run goes on: {p.returncode} {p.stderr}")
p = run(graph("maxerrors", few, epochs=2, max_errors=4))
check(p.returncode == 1 and "more than max_errors 4" in p.stderr, f"max_errors 4: the fifth record stops: {p.stderr}")
p = run(write_graph(os.path.join(tmp, "badsetting.yaml"), [("shard_source", dict(urls=few))], max_error_rate=2))
check(p.returncode != 0 and "badsetting.yaml:1" in p.stderr, f"max_error_rate 2 is refused with its line: {p.stderr}")

# Configuration mistakes are found when the graph is loaded, with the file and line, before any epoch.
pipe_graph = graph("pipe", f"pipe:cat {few}", epochs=1)
p = run(pipe_graph)
check(p.returncode == 1 and "pipe.yaml:3" in p.stderr and "allow_pipe" in p.stderr and "Epoch=" not in p.stdout,
      f"pipe: without allow_pipe: refused at load with file:line: {p.stderr}")
p = run(graph("pipe-ok", f"pipe:cat {few}", source=dict(allow_pipe=True), epochs=1))
check(p.returncode == 0 and "Samples=37 " in p.stdout, f"with allow_pipe the same list runs: {p.stdout} {p.stderr}")
p = run(graph("mean2", few, augment=dict(mean=[0.5, 0.5], std=[0.5, 0.5], dtype="float32"), epochs=1))
check(p.returncode == 1 and "mean2.yaml:" in p.stderr and "channels" in p.stderr and "Epoch=" not in p.stdout,
      f"augment.mean with 2 values: refused at load with file:line: {p.stderr}")

check.done("error_budget")
