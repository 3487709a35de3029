"""Golden batches: the reference graphs' per-batch checksums for a fixed seed, rank and world size.

Runs graphs/cifar10_train.yaml, cifar10_val.yaml and fashion_mnist_train.yaml on shards written from
the real data (../shared's CIFAR-10, Debian's Fashion-MNIST), plus the training graph with decode and
augment replicated (2, and 1 without deferral: the plan undone) and in a group of two worker processes, and compares the SHA-256 of every dumped
batch (fields and keys) with tests/golden/NAME.txt. Any change in what the trainer gets fails here;
a deliberate one is regenerated with SF_GOLDEN_UPDATE=1 and reviewed in the diff.
"""
import hashlib
import os
import shutil
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, run  # noqa: E402

SRC = os.environ.get("SF_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(SRC, "tests", "golden")
UPDATE = os.environ.get("SF_GOLDEN_UPDATE") == "1"
CIFAR = os.path.join(SRC, "..", "shared", "data", "cifar10-jpg.tar.zst")
FMNIST = "/usr/share/datasets/fashion-mnist"
BATCHES = 6  # dumped per epoch: enough to cover the shuffle buffer's first drain
check = Checks()


def checksums(npy_dir):
    """One line per batch: e<epoch>_b<batch> then name=sha256 for each dumped file of it, sorted."""
    batches = {}
    for name in sorted(os.listdir(npy_dir)):
        m = re.match(r"(e\d+_b\d+)_(.+)$", name)
        with open(os.path.join(npy_dir, name), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        batches.setdefault(m.group(1), []).append(f"{m.group(2)}={digest}")
    return [f"{b} {' '.join(v)}" for b, v in sorted(batches.items(), key=lambda kv: tuple(
        int(x) for x in re.findall(r"\d+", kv[0])))]


def run_graph(tmp, name, graph_text, urls, epochs):
    graph = os.path.join(tmp, f"{name}.yaml")
    with open(graph, "w") as f:
        f.write(graph_text)
    out = os.path.join(tmp, f"out-{name}")
    p = run(["run", graph, "--quiet", "--no-summary", "--epochs", str(epochs), "--set", f"shard_source.urls={urls}",
             "--set", f"device_sink.npy_dir={out}", "--set", f"device_sink.npy_batches={BATCHES}"])
    counts = re.findall(r"Replica Train Samples=(\d+)", p.stdout)
    return [f"samples per epoch: {' '.join(counts)}"] + checksums(out)


def compare(name, lines, golden_name=None):
    path = os.path.join(GOLDEN, f"{golden_name or name}.txt")
    if UPDATE and golden_name is None:
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: wrote {path} ({len(lines) - 1} batches)")
        return
    with open(path) as f:
        want = f.read().split("\n")[:-1]
    diff = [f"  want {w}\n  got  {g}" for w, g in zip(want, lines) if w != g]
    check(len(want) == len(lines) and not diff,
          f"{name}: batches differ from {path} ({len(lines)} lines, {len(want)} expected)\n" + "\n".join(diff[:4]) +
          "\n(a deliberate change: regenerate with SF_GOLDEN_UPDATE=1 and review the diff)")
    print(f"{name}: {len(lines) - 1} batches as in {os.path.basename(path)}")


def grouped(text):
    """The same graph with decode and augment in a group of two local worker processes."""
    text = text.replace("stages:\n", "groups:\n  decoders:\n    processes: 2\nstages:\n", 1)
    for stage in ("decode", "augment"):
        text = re.sub(rf"(  - type: {stage}\b[^\n]*\n)", rf"\1    group: decoders\n", text, count=1)
    return text


def replicated(text, n=2, decode=""):
    """decode and augment with `replicas: n` written (and decode's extra option lines)."""
    for stage in ("decode", "augment"):
        extra = decode if stage == "decode" else ""
        text = re.sub(rf"(  - type: {stage}\b[^\n]*\n)", rf"\1    replicas: {n}\n{extra}", text, count=1)
    return text


def main():
    tmp = tempfile.mkdtemp(prefix="sf_golden_")
    read = lambda name: open(os.path.join(SRC, "graphs", name)).read()  # noqa: E731
    ran = 0
    if os.path.exists(CIFAR):
        train_dir, test_dir = os.path.join(tmp, "train"), os.path.join(tmp, "test")
        os.makedirs(train_dir)
        os.makedirs(test_dir)
        run(["write", "--quiet", "--subdir", "train", CIFAR, os.path.join(train_dir, "cifar-train-%06d.tar")])
        run(["write", "--quiet", "--subdir", "test", CIFAR, os.path.join(test_dir, "cifar-test-%06d.tar")])
        train = os.path.join(train_dir, "cifar-train-{000000..000004}.tar")  # 10,000 of the 50,000 images
        text = read("cifar10_train.yaml")
        compare("cifar10_train", run_graph(tmp, "cifar10_train", text, train, 2))
        compare("cifar10_train replicas 2", run_graph(tmp, "replicas", replicated(text), train, 2), "cifar10_train")
        # The plan undone: one replica each and no deferral, as the graph ran before there was a plan.
        compare("cifar10_train replicas 1, defer_jpeg false",
                run_graph(tmp, "unplanned", replicated(text, 1, "    defer_jpeg: false\n"), train, 2), "cifar10_train")
        compare("cifar10_train in a group", run_graph(tmp, "group", grouped(text), train, 2), "cifar10_train")
        val = os.path.join(test_dir, "cifar-test-{000000..000004}.tar")
        compare("cifar10_val", run_graph(tmp, "cifar10_val", read("cifar10_val.yaml"), val, 1))
        ran += 1
    else:
        print(f"no {CIFAR}: the CIFAR-10 graphs are not checked")
    if os.path.isdir(FMNIST):
        fm_dir = os.path.join(tmp, "fm")
        os.makedirs(fm_dir)
        run(["write", "--quiet", f"idx:{FMNIST}/train-images-idx3-ubyte.gz,{FMNIST}/train-labels-idx1-ubyte.gz",
             os.path.join(fm_dir, "fmnist-train-%06d.tar")])
        fm = os.path.join(fm_dir, "fmnist-train-{000000..000004}.tar")
        compare("fashion_mnist_train", run_graph(tmp, "fashion_mnist_train", read("fashion_mnist_train.yaml"), fm, 2))
        ran += 1
    check(ran > 0, "at least one reference data set is installed")
    check.done("golden")
    shutil.rmtree(tmp, ignore_errors=True)  # half a GB of shards; a failure above keeps them to look at


main()
