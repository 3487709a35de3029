"""The Python package in a PyTorch trainer's hands: set_epoch for any epoch (Pipeline and DataLoader),
set_epoch reaching persistent DataLoader workers, samples_per_epoch shared among DataLoader workers
with len(), and Pipeline.stats() against the CLI's summary table for the same graph."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
from sfutil import Checks, make_dataset, read_batches, run, write_graph  # noqa: E402

try:
    import torch
    import torch.utils.data
except ImportError:
    print("dataloader: python3-torch is not installed (tools/setup-debian.sh installs it); skipped")
    sys.exit(77)
import shardflow  # noqa: E402

tmp = tempfile.mkdtemp(prefix="sf-dataloader-")
urls, truth = make_dataset(tmp, shards=8, per_shard=25)
out = os.path.join(tmp, "npy")
graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=urls)),
    ("tar_split", {}),
    ("decode", {}),
    ("shuffle", dict(buffer_size=20)),
    ("batch", dict(batch_size=16)),
    ("device_sink", {}),
], seed=7, epochs=1)


def keys_of(batches):
    return [k for b in batches for k in b["__key__"]]


def loader(ds, **kw):
    return torch.utils.data.DataLoader(ds, batch_size=None, **kw)


# The reference: the CLI runs epochs 0..3 of the same graph (its `epochs` bounds a CLI run only).
run(["run", graph, "--quiet", "--no-summary", "--epochs", "4", "--set", f"device_sink.npy_dir={out}"])
cli_epochs = {e: [k for e2, _, keys, _ in read_batches(out) if e2 == e for k in keys] for e in range(4)}

# 1. An epoch past the graph's `epochs: 1` is the epoch the CLI gives, not an empty one.
check = Checks()
for epoch in (1, 2):
    with shardflow.Pipeline(graph, output="dict") as p:
        p.set_epoch(epoch)
        got = keys_of(p)
        check(got == cli_epochs[epoch], f"Pipeline.set_epoch({epoch}) on epochs: 1 yields the CLI's epoch {epoch} "
                                       f"({len(got)} of {len(cli_epochs[epoch])} samples)")
        check(keys_of(p) == cli_epochs[epoch + 1], "the next iteration is the next epoch")
ds = shardflow.dataset(graph, output="torch_dict")
for epoch in range(3):
    ds.set_epoch(epoch)
    got = keys_of(loader(ds))
    check(got == cli_epochs[epoch], f"DataLoader epoch {epoch}: {len(got)} samples, the CLI's epoch in its order")
check.done("set_epoch past the graph's epochs")

# 2. Persistent workers see set_epoch: each epoch is the one a fresh DataLoader gives for it.
check = Checks()
ds = shardflow.dataset(graph, output="torch_dict")
persistent = loader(ds, num_workers=2, persistent_workers=True)
fresh = {}
for epoch in range(3):
    ds.set_epoch(epoch)
    fresh[epoch] = keys_of(loader(ds, num_workers=2))
for epoch in range(3):
    ds.set_epoch(epoch)
    got = keys_of(persistent)
    check(got == fresh[epoch], f"persistent workers, epoch {epoch}: the order of a fresh DataLoader's epoch {epoch}")
    check(sorted(got) == sorted(truth), f"epoch {epoch}: every sample once")
check(fresh[0] != fresh[1] != fresh[2], "the three epochs have different orders")
del persistent
check.done("set_epoch reaches persistent workers")

# 3. samples_per_epoch is the rank's, whatever num_workers: the workers share it; len() says how many batches.
check = Checks()
for workers, samples, partial in ((0, 90, True), (2, 90, True), (3, 90, True), (2, 150, False), (2, 250, True)):
    ds = shardflow.dataset(graph, output="torch_dict", samples_per_epoch=samples, partial=partial)
    expect = samples // 16 + (1 if partial and samples % 16 else 0)
    dl = loader(ds, num_workers=workers)
    batches = list(dl)
    got = keys_of(batches)
    what = f"{workers} workers, samples_per_epoch {samples}, partial {partial}"
    check(len(ds) == expect and len(dl) == expect, f"{what}: len {len(ds)}, DataLoader len {len(dl)}, want {expect}")
    check(len(batches) == expect, f"{what}: {len(batches)} batches, want {expect}")
    check(len(got) == (samples if partial else samples // 16 * 16), f"{what}: {len(got)} samples")
    if samples <= len(truth):
        check(len(set(got)) == len(got), f"{what}: no sample twice within the epoch")
try:
    len(shardflow.dataset(graph))
    check(False, "len() without samples_per_epoch is refused")
except TypeError as e:
    check("samples_per_epoch" in str(e), f"len() says why: {e}")
check.done("samples_per_epoch shared among DataLoader workers")

# 4. Pipeline.stats(): the items per node the CLI's summary table prints for the same graph and epochs.
check = Checks()
summary = run(["run", graph, "--quiet", "--epochs", "2"]).stderr.splitlines()
header = next(i for i, line in enumerate(summary) if line.startswith("node "))
cli_items = {}
for line in summary[header + 1:]:
    cols = line.split()
    if len(cols) != 10:  # node stage reps items MiB busy wait errors skipped filtered
        break
    cli_items[cols[0]] = (cols[1], int(cols[2]), int(cols[3]))
with shardflow.Pipeline(graph, epochs=2, output="dict") as p:
    for _ in range(2):
        list(p)
    stats = p.stats()
check([s["name"] for s in stats] == list(cli_items), f"the nodes in order: {[s['name'] for s in stats]}")
for s in stats:
    check((s["type"], s["replicas"], s["items"]) == cli_items[s["name"]],
          f"{s['name']}: type, replicas, items {s['type'], s['replicas'], s['items']}, CLI {cli_items[s['name']]}")
    check(s["items_per_second"] > 0 and s["busy_seconds"] >= 0 and s["errors"] == 0, f"{s['name']}: rates {s}")
check(stats[-1]["items"] == 2 * 13, f"the sink counted 13 batches per epoch: {stats[-1]['items']}")
check.done("Pipeline.stats")
