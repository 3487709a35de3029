"""Graph-file and option mistakes: file:line, the valid names, non-zero exit, never a crash."""
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, run  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-graph-errors-")
urls, _ = make_dataset(tmp, shards=1, per_shard=3)

GOOD = f"""seed: 1
stages:
  - type: shard_source
    urls: {urls}
  - type: tar_split
  - type: decode
  - type: batch
    batch_size: 2
  - type: device_sink
"""


def run_text(text, *extra):
    path = os.path.join(tmp, "g.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path, run(["run", path, "--quiet", "--no-summary", *extra], check=False)


def expect_error(text, line, *needles, extra=()):
    path, p = run_text(text, *extra)
    check(p.returncode == 1, f"exit status 1 for a bad graph, got {p.returncode}: {p.stderr}")
    where = f"{path}:{line}" if line else path
    check(where in p.stderr, f"message names {where}: {p.stderr!r}")
    for n in needles:
        check(n in p.stderr, f"message mentions {n!r}: {p.stderr!r}")


path, p = run_text(GOOD)
check(p.returncode == 0 and "Replica Train Samples=3" in p.stdout, f"the good graph runs: {p.stdout} {p.stderr}")
expect_error(GOOD.replace("type: decode", "type: decoder"), 6, "unknown stage type 'decoder'", "decode, augment")
expect_error(GOOD.replace("batch_size: 2", "batch_sise: 2"), 8, "no option 'batch_sise'", "batch_size, partial")
expect_error(GOOD.replace("batch_size: 2", "batch_size: 0"), 8, "batch_size", "out of range")
expect_error(GOOD.replace("batch_size: 2", "batch_size: lots"), 8, "not a count")
expect_error(GOOD.replace("seed: 1", "seed: 1\nerror_policy: sometimes"), 2, "skip|fail")
expect_error(GOOD.replace("  - type: tar_split\n", ""), 5, "outputs shards", "takes samples")
expect_error(GOOD + "  - type: batch\n", 10, "two nodes are named 'batch'")
expect_error(GOOD.replace("    batch_size: 2\n", "    batch_size: 2\n    replicas: 2\n"), 9, "cannot run as replicas")
expect_error("stages:\n  - type: shard_source\n    urls: [unclosed\n", 4, "YAML")
expect_error(GOOD, None, "no option 'shufle'", "shuffle", extra=["--set", "shard_source.shufle=false"])
expect_error(GOOD, None, "no node named 'sauce'", "shard_source, tar_split", extra=["--set", "sauce.urls=x"])
# List options (SF_OPT_NAME_LIST): more items than a list holds is the line's error; a stage's own limit on a
# list is an option error that stops the run under error_policy skip too.
many = "[" + ", ".join(f"f{i}" for i in range(65)) + "]"
expect_error(GOOD.replace("  - type: batch\n", f"  - type: augment\n    fields: {many}\n  - type: batch\n"), 8,
             "node 'augment': fields lists more than 64 items")
expect_error(GOOD.replace("seed: 1", "seed: 1\nerror_policy: skip").replace(
    "  - type: batch\n", "  - type: augment\n    fields: [" + ", ".join(f"f{i}" for i in range(17)) + "]\n  - type: batch\n"),
    8, "node 'augment' (augment) cannot start: option fields: lists too many or too long names (at most 16 names")
p = run(["run", os.path.join(tmp, "missing.yaml")], check=False)
check(p.returncode == 1 and "missing.yaml" in p.stderr and "cannot open" in p.stderr, f"missing file: {p.stderr}")
p = run(["run"], check=False)
check(p.returncode == 2 and "usage" in p.stderr, "usage error exits 2")
# An empty shard list is refused at start with the option named.
expect_error(GOOD.replace(f"urls: {urls}", "urls: ''"), None, "urls")
# --set fixes a graph: point it at other shards.
path, p = run_text(GOOD.replace(urls, "/nonexistent/x.tar"), "--set", f"shard_source.urls={urls}")
check(p.returncode == 0 and "Replica Train Samples=3" in p.stdout, "--set shard_source.urls overrides the graph")
# Hostile graph files (issue 16): each refused at once, with the line that says what is wrong.
expect_error(GOOD.replace("seed: 1", "seed: 0\nseed: 1"), 2, "'seed' appears twice (lines 1 and 2)")
expect_error(GOOD.replace("batch_size: 2", "batch_size: 2\n    batch_size: 3"), 9, "'batch_size' appears twice")
expect_error(GOOD + "---\nseed: 2\n", 10, "second YAML document")
expect_error("seed: 1\nstages: []\n", 2, "`stages` is empty")
expect_error(GOOD.replace("seed: 1", "sead: 1"), 1, "unknown graph setting 'sead'", "stages, groups, plugins")
start = time.monotonic()
expect_error("seed: 1\nstages: " + "[" * 100000 + "]" * 100000 + "\n", 2, "nested deeper than")
check(time.monotonic() - start < 5, f"deep nesting refused in {time.monotonic() - start:.1f} s")


def limited():
    """Caps the address space of an unfixed reader at 2 GiB (not under ASan, which reserves terabytes)."""
    if os.environ.get("SF_SANITIZE", "none") == "none":
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


# A list file is read with bounded memory: /dev/zero is not text, and endless pipes have no line
# end or no file end.
for i, (feed, needle) in enumerate(((None, "a NUL byte"), ("yes x | tr -d '\\n'", "a line is longer than"),
                                    ("yes '# a comment'", "larger than 256 MiB"))):
    source, feeder = "/dev/zero", None
    if feed:
        source = os.path.join(tmp, f"endless-{i}.fifo")
        os.mkfifo(source)
        feeder = subprocess.Popen(f"{feed} > {source}", shell=True, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
    path = os.path.join(tmp, "list.yaml")
    with open(path, "w") as f:
        f.write(GOOD.replace(f"urls: {urls}", f'urls: "@{source}"'))
    start = time.monotonic()
    p = run(["run", path, "--quiet", "--no-summary"], check=False, preexec_fn=limited)
    if feeder:
        os.killpg(feeder.pid, signal.SIGKILL)
        feeder.wait()
    check(p.returncode == 1 and f"@{source}" in p.stderr and needle in p.stderr,
          f"@{source}: {p.returncode} {p.stderr!r}")
    check(time.monotonic() - start < 60, f"@{source} refused in {time.monotonic() - start:.1f} s")
# help lists stages and options from the tables
p = run(["help", "augment"])
check("padding" in p.stdout and "flip" in p.stdout and "default" in p.stdout, "help augment lists options")
p = run(["help", "nosuch"], check=False)
check(p.returncode == 2 and "shard_source" in p.stderr, "help of an unknown stage lists the stages")
# The embedding example (public API only) counts the same samples.
example = os.path.join(os.environ.get("SF_BUILD_ROOT", "build"), "examples", "count_batches")
if os.path.exists(example):
    path, _ = run_text(GOOD)
    p = subprocess.run([example, path, "2"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and p.stdout.count("2 batches, 3 samples") == 2, f"count_batches: {p.stdout} {p.stderr}")
check.done("graph_errors")
