"""augment's exact: true against exact: false on CIFAR-10's JPEGs: the pixels, then a ResNet-8's accuracy.
Run by bench/exact_accuracy.sh, which writes the shards and says what is measured."""
import argparse
import glob
import importlib.util
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import shardflow  # the installed package
except ImportError:  # the source tree's, with SHARDFLOW_LIB (bench/exact_accuracy.sh sets it)
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import shardflow  # noqa: E402
spec = importlib.util.spec_from_file_location("train_cifar10", os.path.join(HERE, "..", "examples", "train_cifar10.py"))
trainer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trainer)

MEAN, STD = [0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]


def urls(shards, part):
    """The brace pattern naming every shard of a part (shardflow write numbers them from 0)."""
    n = len(glob.glob(os.path.join(shards, f"cifar-{part}-*.tar")))
    if n == 0:
        raise SystemExit(f"exact_accuracy: no cifar-{part}-*.tar in {shards}")
    return os.path.join(shards, f"cifar-{part}-{{000000..{n - 1:06d}}}.tar")


def graph(shards, part, exact, seed, train, size, dtype="float32"):
    """The reference workload's graph over the JPEG shards, or the test set's (no shuffle, no flip). A size
    under 32 resizes first (the shorter side to size), which exact: false does with DCT scaling."""
    random = f"crop: random\n    padding: {size // 8}\n    flip: 0.5" if train else "crop: center"
    if size < 32:
        random += f"\n    resize: {size}"
    values = f"mean: {MEAN}\n    std: {STD}\n    " if dtype == "float32" else ""
    shuffle = "  - {type: shuffle, buffer_size: 10000}\n" if train else ""
    return f"""seed: {seed}
stages:
  - {{type: shard_source, urls: "{urls(shards, part)}", shuffle: {str(train).lower()}}}
  - {{type: tar_split}}
  - {{type: decode}}
  - type: augment
    {random}
    size: {size}
    {values}layout: chw
    dtype: {dtype}
    exact: {str(exact).lower()}
{shuffle}  - {{type: batch, batch_size: {128 if train else 500}, partial: true}}
  - {{type: device_sink}}
"""


def pixels(shards, part, train, size):
    """The same samples through both settings as uint8: mean and largest absolute difference, share differing."""
    outs, labels = [], []
    for exact in (True, False):
        with shardflow.Pipeline(graph(shards, part, exact, 0, train, size, "uint8"), epochs=1, output="numpy") as p:
            batches = list(p)
        outs.append(np.concatenate([images for images, _ in batches]))
        labels.append(np.concatenate([cls for _, cls in batches]))
    a, b = (o.astype(np.int16) for o in outs)
    if a.shape != b.shape or not np.array_equal(*labels):  # the same samples in the same order, or nothing to compare
        raise SystemExit(f"exact_accuracy: the two runs gave other samples ({a.shape} against {b.shape})")
    d = np.abs(a - b)
    return d.mean(), int(d.max()), float((d > 0).mean()), a.shape[0]


def evaluate(model, shards, exact, size):
    """Top-1 accuracy (%) on the 10,000 test images, decoded with the given exact."""
    model.eval()
    correct = total = 0
    test = graph(shards, "test", exact, 0, False, size)
    with torch.no_grad(), shardflow.Pipeline(test, epochs=1, output="torch") as p:
        for images, labels in p:
            correct += (model(images).argmax(1) == labels).sum().item()
            total += labels.numel()
    model.train()
    return 100.0 * correct / total


def train(shards, exact, seed, epochs, size, lr=0.2):
    """examples/train_cifar10.py's ResNet-8, optimiser and schedule on one process."""
    torch.manual_seed(seed)
    model = trainer.ResNet(16, 1)
    data = shardflow.Pipeline(graph(shards, "train", exact, seed, True, size), epochs=epochs, output="torch",
                             samples_per_epoch=trainer.TRAIN_SAMPLES)
    steps = len(data)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * steps)
    with data:
        for _ in range(epochs):
            for images, labels in data:
                optimizer.zero_grad()
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
                scheduler.step()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", required=True)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=32, help="output side; under 32 the images are resized first")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for part, train_ in (("test", False), ("train", True)):
        mean, most, share, n = pixels(args.shards, part, train_, args.size)
        what = "random crop + flip" if train_ else "center crop"
        print(f"pixels, {part} set ({n} samples, {what}, {args.size} px), exact: false against true: "
              f"mean |difference| {mean:.3f} of 255, largest {most}, {100 * share:.1f}% of values differ", flush=True)
    scores = {}
    for seed in range(args.seeds):
        for exact in (True, False):
            start = time.time()
            model = train(args.shards, exact, seed, args.epochs, args.size)
            acc = {e: evaluate(model, args.shards, e, args.size) for e in (True, False)}
            scores[(seed, exact)] = acc
            print(f"seed {seed}, trained with exact: {str(exact).lower():5s}: test accuracy {acc[True]:.2f}% on "
                  f"exact pixels, {acc[False]:.2f}% on exact: false pixels ({time.time() - start:.0f} s)", flush=True)
    for exact in (True, False):
        own = [scores[(s, exact)][exact] for s in range(args.seeds)]
        print(f"trained and tested with exact: {str(exact).lower():5s}: mean test accuracy {statistics.mean(own):.2f}% "
              f"over {args.seeds} seed(s) ({', '.join(f'{a:.2f}' for a in own)})")
    deltas = [scores[(s, False)][False] - scores[(s, True)][True] for s in range(args.seeds)]
    print(f"exact: false minus exact: true, same seed: {', '.join(f'{d:+.2f}' for d in deltas)} points "
          f"(mean {statistics.mean(deltas):+.2f})")


if __name__ == "__main__":
    main()
