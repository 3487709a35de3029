"""The reference trainer under torchrun (Debian's torch: python3 -m torch.distributed.run): two ranks,
each its own pipeline from RANK / WORLD_SIZE, a few hundred steps on small generated shards. Each
rank logs its sample keys: within every epoch the ranks read disjoint samples that together are the
whole dataset, and they take the same number of steps."""
import collections
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, nginx  # noqa: E402

try:
    import torch  # noqa: F401
except ImportError:
    print("torchrun: python3-torch is not installed (tools/setup-debian.sh installs it); skipped")
    sys.exit(77)

check = Checks()
root = tempfile.mkdtemp(prefix="sf-torchrun-")
truth = {}
for split, shards in (("train", 4), ("test", 2)):
    d = os.path.join(root, "cifar10", split)
    os.makedirs(d)
    _, keys = make_dataset(d, shards=shards, per_shard=50, size=32, seed=len(split))
    truth[split] = keys
    for i in range(shards):
        os.rename(os.path.join(d, f"shard-{i:06d}.tar"), os.path.join(d, f"cifar-{split}-{i:06d}.tar"))
keys_dir = os.path.join(root, "keys")
os.makedirs(keys_dir)
EPOCHS, SAMPLES, BATCH = 4, 200, 2  # per rank and epoch: 100 samples in 50 steps; 200 steps in all
env = dict(os.environ, SHARDFLOW_LIB=os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"), OMP_NUM_THREADS="1")
env.pop("RANK", None)
env.pop("WORLD_SIZE", None)
# Debian 12's torch 1.13 under Python 3.11: torchrun's default "--redirects 0 --tee 0" fails (Std.from_str
# maps 0 to None: 3.11 no longer iterates a Flag's zero member); stdout teed to a log file and the console
# (1) goes through, and is what a user of that torchrun has to pass too (docs/python.md).
TORCHRUN_PY311 = ["--redirects", "1", "--tee", "1", "--log_dir", os.path.join(root, "torchrun-logs")]
DAV = "location /checkpoints/ { dav_methods PUT DELETE MOVE; create_full_put_path on; client_max_body_size 0; }"
with nginx(root, DAV) as base:
    script = os.path.join(os.environ["SF_SOURCE_ROOT"], "examples", "train_cifar10.py")
    log_path = os.path.join(root, "log.txt")
    with open(log_path, "w") as out:  # a file, not a pipe: helper processes may hold a pipe open
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                            *TORCHRUN_PY311,
                            script, "--shards", os.path.join(root, "cifar10"), "--train-shards", "4",
                            "--test-shards", "2", "--samples-per-epoch", str(SAMPLES), "--batch-size", str(BATCH),
                            "--epochs", str(EPOCHS), "--width", "4", "--log-steps", "25", "--lr", "0.05",
                            "--checkpoint-url", f"{base}/checkpoints/t.pt", "--keys-log", keys_dir],
                           stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, timeout=300)
    with open(log_path) as f:
        log = f.read()
check(p.returncode == 0, f"torchrun ends with status 0 (got {p.returncode}):\n{log[-3000:]}")
check("Done BestAccuracy=" in log, f"rank 0 finishes:\n{log[-2000:]}")
for rank in (0, 1):
    check(any(f"Epoch={EPOCHS} Replica Train Samples={SAMPLES // 2} " in line and f"Rank={rank} " in line
              for line in log.splitlines()),
          f"rank {rank} trained {SAMPLES // 2} samples in the last epoch:\n{log[-2000:]}")

ranks = {}
for rank in (0, 1):
    with open(os.path.join(keys_dir, f"rank-{rank}.txt")) as f:
        ranks[rank] = [line.split() for line in f]
steps = {r: collections.Counter(epoch for epoch, step, _ in {(e, s, None) for e, s, _ in lines}) for r, lines in ranks.items()}
check(steps[0] == steps[1] == {str(e): SAMPLES // 2 // BATCH for e in range(EPOCHS)},
      f"both ranks take {SAMPLES // 2 // BATCH} steps every epoch: {steps}")
for epoch in map(str, range(EPOCHS)):
    seen = {r: [key for e, _, key in lines if e == epoch] for r, lines in ranks.items()}
    check(not set(seen[0]) & set(seen[1]), f"epoch {epoch}: the ranks read disjoint samples")
    check(sorted(seen[0] + seen[1]) == sorted(truth["train"]),
          f"epoch {epoch}: together every training sample once ({len(seen[0])} + {len(seen[1])})")
check.done("torchrun")
