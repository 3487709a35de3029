"""The reference trainer on a small generated dataset: two gloo processes, the reference log lines,
a checkpoint uploaded to WebDAV nginx, a kill in the middle of an epoch, and the resumption from
the checkpoint (the accuracy run on the real CIFAR-10 is tools/train-demo.sh: too long for CI)."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, nginx  # noqa: E402

try:
    import torch  # noqa: F401
except ImportError:
    print("trainer: python3-torch is not installed (tools/setup-debian.sh installs it); skipped")
    sys.exit(77)

check = Checks()
root = tempfile.mkdtemp(prefix="sf-trainer-")
for split, shards in (("train", 2), ("test", 2)):
    d = os.path.join(root, "cifar10", split)
    os.makedirs(d)
    make_dataset(d, shards=shards, per_shard=64, size=32, seed=len(split))
    for i in range(shards):
        os.rename(os.path.join(d, f"shard-{i:06d}.tar"), os.path.join(d, f"cifar-{split}-{i:06d}.tar"))
script = os.path.join(os.environ["SF_SOURCE_ROOT"], "examples", "train_cifar10.py")
env = dict(os.environ, SHARDFLOW_LIB=os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))


def trainer(args):
    """Runs the trainer; returns (status, log). The log goes through a file, not a pipe: the
    multiprocessing helpers it starts may hold a pipe open after it exits."""
    path = os.path.join(root, f"log-{len(os.listdir(root))}.txt")
    with open(path, "w") as out:
        p = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=600, env=env)
    with open(path) as f:
        return p.returncode, f.read()


DAV = "location /checkpoints/ { dav_methods PUT DELETE MOVE; create_full_put_path on; client_max_body_size 0; }"

with nginx(root, DAV) as base:
    ckpt = f"{base}/checkpoints/t.pt"
    common = [sys.executable, script, "--shards", f"{base}/cifar10", "--train-shards", "2", "--test-shards", "2",
              "--samples-per-epoch", "256", "--batch-size", "32", "--epochs", "3", "--log-steps", "2",
              "--checkpoint-url", ckpt, "--lr", "0.05"]
    status, log = trainer(common + ["--interrupt-at", "3", "2", "--rendezvous", os.path.join(root, "rdv1")])
    check(status != 0, "the interrupted run ends with an error status")
    for needle in ("Rate=", "GlobalRate=", "Replica Train Samples=128", "Reduced GlobalRate=",
                   "Validation Epoch=1 Accuracy=", "Interrupted (--interrupt-at) at Epoch=3 Step=2"):
        check(needle in log, f"first run logs {needle!r}:\n{log[-2000:]}")
    check("Checkpoint Epoch=" in log and os.path.exists(os.path.join(root, "checkpoints", "t.pt")),
          "a checkpoint was uploaded to object storage")
    saved = [line for line in log.splitlines() if "Checkpoint Epoch=" in line]
    last_saved = int(saved[-1].split("Checkpoint Epoch=")[1].split()[0])
    status, log2 = trainer(common + ["--load-checkpoint", ckpt, "--rendezvous", os.path.join(root, "rdv2")])
    check(status == 0, f"the resumed run finishes:\n{log2[-2000:]}")
    check(f"Resumed from {ckpt} at Epoch={last_saved + 1}" in log2, f"the log shows where it resumed:\n{log2[:1500]}")
    check(f"Epoch={last_saved + 1} Replica Train Samples=128" in log2 and "Done BestAccuracy=" in log2,
          "it trains the remaining epochs")
    check("Epoch=1 Replica" not in log2 or last_saved == 0, "finished epochs are not trained again")
check.done("trainer")
