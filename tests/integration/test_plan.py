"""shard_source's resume plan through the CLI (so it also runs under the sanitizers): the first epoch
yields exactly the planned (shard, sample index) samples - the reference is the shards' key lists by
tarfile - the next epoch every sample; a malformed plan is refused naming the file, the line and the fix."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run, tar_keys, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-plan-")
try:
    urls, truth = make_dataset(tmp, shards=3, per_shard=10)
    shard_keys = [tar_keys(os.path.join(tmp, "shard-%06d.tar" % i)) for i in range(3)]
    out = os.path.join(tmp, "npy")

    def graph(plan_text, **source):
        path = os.path.join(tmp, "plan.txt")
        with open(path, "w") as f:
            f.write(plan_text)
        return write_graph(os.path.join(tmp, "g.yaml"), [
            ("shard_source", dict(urls=urls, plan=path, **source)),
            ("tar_split", {}),
            ("decode", {}),
            ("shuffle", dict(buffer_size=4)),
            ("batch", dict(batch_size=2, partial=True)),
            ("device_sink", dict(npy_dir=out)),
        ], seed=3, epochs=2), path

    planned = [(2, 1), (2, 4), (2, 9), (0, 0), (0, 5)]
    g, _ = graph("# a comment\n" + "".join(f"{s} {i}\n" for s, i in planned))
    for start in ("0", "1"):  # the plan replaces the pipeline's first epoch, whichever it is
        shutil.rmtree(out, ignore_errors=True)
        run(["run", g, "--quiet", "--no-summary", "--start-epoch", start])
        epochs = {}
        for e, _, keys, _ in read_batches(out):
            epochs.setdefault(e, []).extend(keys)
        first = int(start)
        check(sorted(epochs[first]) == sorted(shard_keys[s][i] for s, i in planned),
              f"from epoch {start}: the planned samples exactly ({epochs[first]})")
        if first == 0:
            check(sorted(epochs[1]) == sorted(truth), "epoch 1: every sample, as without a plan")

    for text, source, words in [
        ("0 1\nzero 2\n", {}, ["line 2", "SHARD_INDEX SAMPLE_INDEX"]),
        ("3 0\n", {}, ["line 1", "below 3"]),
        ("0 1\n1 1\n0 2\n", {}, ["line 3", "shard 0 appears again"]),
        ("0 1\n", dict(samples_per_epoch=20), ["samples_per_epoch"]),
    ]:
        g, path = graph(text, **source)
        p = run(["run", g, "--quiet", "--no-summary"], check=False)
        check(p.returncode != 0 and all(w in p.stderr for w in words), f"plan {text!r} refused: {p.stderr.strip()}")
    g, path = graph("0 1\n")
    os.remove(path)
    p = run(["run", g, "--quiet", "--no-summary"], check=False)
    check(p.returncode != 0 and path in p.stderr and "No such file" in p.stderr, f"a missing plan: {p.stderr.strip()}")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.done("plan")
