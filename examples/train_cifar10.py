"""The reference trainer: a ResNet-style network on CIFAR-10, data-parallel over processes with
torch.distributed (gloo, CPU), fed by shardflow pipelines over HTTP, checkpoints in object storage.

    python3 examples/train_cifar10.py --shards http://127.0.0.1:8750/cifar10 \\
        --checkpoint-url http://127.0.0.1:8750/checkpoints/resnet.pt --epochs 8 --nprocs 2
    # after an interruption, go on from the last checkpoint:
    python3 examples/train_cifar10.py ... --load-checkpoint http://127.0.0.1:8750/checkpoints/resnet.pt
    # or one process per rank, started by torchrun (RANK / WORLD_SIZE / MASTER_ADDR from it):
    torchrun --standalone --nproc_per_node 2 examples/train_cifar10.py --shards ...

Each rank reads its own shards (shard_source splits by RANK / WORLD_SIZE) and yields exactly
50,000 / world_size samples per epoch. Log lines follow torch_xla's test_train_mp_imagenet:
Rate= (moving average) and GlobalRate= per rank, Replica Train Samples= and Reduced GlobalRate=
(summed over ranks) per epoch, then the validation accuracy on the 10,000 real test images.
A checkpoint (model, optimizer, scheduler, epoch, best accuracy, pipeline state) is uploaded
whenever the accuracy improves.
"""
import argparse
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import shardflow  # pip install --no-build-isolation . (README)
except ImportError:  # the source tree's package, with SHARDFLOW_LIB=build/libshardflow.so
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import shardflow  # noqa: E402

TRAIN_SAMPLES, CLASSES = 50_000, 10


class Block(nn.Module):
    """A basic residual block (He et al. 2016, "Deep Residual Learning", section 4.2)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """A small CIFAR ResNet: a 3x3 stem and three stages of `depth` blocks (16, 32, 64 channels x width)."""

    def __init__(self, width=16, depth=1):
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        stages, cin = [], w
        for cout, stride in ((w, 1), (2 * w, 2), (4 * w, 2)):
            for i in range(depth):
                stages.append(Block(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1))


def log(rank, text):
    print(f"| {text} Rank={rank} Time={time.strftime('%H:%M:%S')}", flush=True)


def save_checkpoint(url, state):
    """torch.save to a local file, then an atomic upload next to the shards."""
    with tempfile.NamedTemporaryFile(suffix=".pt") as f:
        torch.save(state, f.name)
        shardflow.copy(f.name, url)


def load_checkpoint(url):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "checkpoint.pt")
        shardflow.copy(url, path)
        return torch.load(path)


def evaluate(model, args, rank, world):
    """Accuracy on the 10,000 test images: each rank scores its share, the counts are summed."""
    model.eval()
    correct = total = 0
    val = shardflow.Pipeline(os.path.join(HERE, "..", "graphs", "cifar10_val.yaml"), rank=rank, world_size=world,
                             epochs=1, output="torch", urls=args.test_urls, batch_size=500)
    with torch.no_grad(), val:
        for images, labels in val:
            correct += (model(images).argmax(1) == labels).sum().item()
            total += labels.numel()
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)
    model.train()
    return 100.0 * counts[0].item() / counts[1].item(), int(counts[1].item())


def train(rank, world, args):
    timeout = datetime.timedelta(seconds=300)  # a lost peer becomes an error, not a hang
    if args.rendezvous:  # a shared file: no port to collide with anything else on the host
        dist.init_process_group("gloo", init_method=f"file://{args.rendezvous}", rank=rank, world_size=world,
                                timeout=timeout)
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = ResNet(args.width, args.depth)
    ddp = nn.parallel.DistributedDataParallel(model)
    per_rank = args.samples_per_epoch // world
    train_data = shardflow.Pipeline(os.path.join(HERE, "..", "graphs", "cifar10_train.yaml"), rank=rank,
                                    world_size=world, epochs=args.epochs, urls=args.train_urls,
                                    output="torch_dict" if args.keys_log else "torch",
                                    samples_per_epoch=per_rank, batch_size=args.batch_size, seed=args.seed)
    steps = len(train_data)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.epochs * steps)
    first_epoch, best = 0, 0.0
    if args.load_checkpoint:
        state = load_checkpoint(args.load_checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        first_epoch, best = state["epoch"] + 1, state["best_accuracy"]
        train_data.load_state_dict(state["pipeline"][rank])
        log(rank, f"Resumed from {args.load_checkpoint} at Epoch={first_epoch + 1} "
                  f"(pipeline epoch {train_data.epoch} step {train_data.step}) BestAccuracy={best:.2f}")
    keys_log = open(os.path.join(args.keys_log, f"rank-{rank}.txt"), "a") if args.keys_log else None
    for epoch in range(first_epoch, args.epochs):
        start = last = time.time()
        samples = last_samples = 0
        rate = 0.0
        for step, batch in enumerate(train_data, 1):
            if keys_log:  # a dict with the keys: "EPOCH STEP KEY" per sample
                keys_log.writelines(f"{epoch} {step} {key}\n" for key in batch["__key__"])
                batch = (next(v for v in batch.values() if torch.is_tensor(v) and v.ndim == 4), batch["cls"])
            images, labels = batch
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(images), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            samples += labels.numel()
            if step % args.log_steps == 0:
                now = time.time()
                instant = (samples - last_samples) / (now - last)
                rate = instant if rate == 0 else rate * 0.4 + instant * 0.6  # torch_xla's RateTracker
                last, last_samples = now, samples
                log(rank, f"Training Device=cpu Epoch={epoch + 1} Step={step} Loss={loss.item():.5f} "
                          f"Rate={rate:.2f} GlobalRate={samples / (now - start):.2f}")
            if args.interrupt_at and (epoch + 1, step) == tuple(args.interrupt_at):
                log(rank, f"Interrupted (--interrupt-at) at Epoch={epoch + 1} Step={step}")
                dist.destroy_process_group()
                os._exit(3)  # as a killed job: no clean-up, no checkpoint
        elapsed = time.time() - start
        log(rank, f"Epoch={epoch + 1} Replica Train Samples={samples} Epoch Time={elapsed:.1f}s "
                  f"GlobalRate={samples / elapsed:.2f}")
        reduced = torch.tensor([samples / elapsed])
        dist.all_reduce(reduced)
        accuracy, scored = evaluate(model, args, rank, world)
        states = [None] * world
        dist.all_gather_object(states, train_data.state_dict())
        if rank == 0:
            log(rank, f"Epoch={epoch + 1} Reduced GlobalRate={reduced.item():.2f}")
            log(rank, f"Validation Epoch={epoch + 1} Accuracy={accuracy:.2f}% over {scored} test images")
            if accuracy > best:
                best = accuracy
                save_checkpoint(args.checkpoint_url, {
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch, "best_accuracy": best,
                    "pipeline": states, "world_size": world})
                log(rank, f"Checkpoint Epoch={epoch + 1} Accuracy={accuracy:.2f}% saved to {args.checkpoint_url}")
        best = max(best, accuracy)
    if rank == 0:
        log(rank, f"Done BestAccuracy={best:.2f}%")
    train_data.close()
    if keys_log:
        keys_log.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # a spawned worker ends here: interpreter teardown with gloo and the engine's threads can hang


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", default="http://127.0.0.1:8750/cifar10",
                    help="base URL of the main job's shards (train/ and test/ under it)")
    ap.add_argument("--train-shards", type=int, default=650, help="train shards (cifar-train-%%06d.tar)")
    ap.add_argument("--checkpoint-url", default="http://127.0.0.1:8750/checkpoints/resnet-cifar10.pt")
    ap.add_argument("--load-checkpoint", metavar="URL", help="resume from this checkpoint")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--samples-per-epoch", type=int, default=TRAIN_SAMPLES, help="over all ranks")
    ap.add_argument("--test-shards", type=int, default=5, help="test shards holding the 10,000 images once")
    ap.add_argument("--batch-size", type=int, default=128, help="per rank")
    ap.add_argument("--lr", type=float, default=0.2, help="peak of the one-cycle schedule")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--depth", type=int, default=1, help="blocks per stage (1: ResNet-8, 3: ResNet-20)")
    ap.add_argument("--nprocs", type=int, default=2, help="data-parallel processes (ignored under torchrun)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-steps", type=int, default=20)
    ap.add_argument("--port", type=int, default=29517, help="rendezvous port on 127.0.0.1")
    ap.add_argument("--rendezvous", metavar="FILE", help="rendezvous through this (new) file instead of a port")
    ap.add_argument("--interrupt-at", type=int, nargs=2, metavar=("EPOCH", "STEP"),
                    help="die at this (1-based) epoch and step, to show resumption")
    ap.add_argument("--keys-log", metavar="DIR", help="append each rank's sample keys to DIR/rank-R.txt, "
                    "one 'EPOCH STEP KEY' line per sample (to check that ranks read disjoint samples)")
    args = ap.parse_args()
    args.train_urls = f"{args.shards}/train/cifar-train-{{000000..{args.train_shards - 1:06d}}}.tar"
    # the main job writes the test set x10, each copy shuffled on its own: the first 5 shards hold it once
    args.test_urls = f"{args.shards}/test/cifar-test-{{000000..{args.test_shards - 1:06d}}}.tar"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        mp.spawn(train, args=(args.nprocs, args), nprocs=args.nprocs, join=True)


if __name__ == "__main__":
    main()
