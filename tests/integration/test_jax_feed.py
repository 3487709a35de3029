"""The NumPy path examples/jax_feed.py feeds jax.make_array_from_process_local_data with (JAX itself is not
installable here): two "processes" (rank 0 and 1 of 2) each yield C-contiguous NumPy batches, the same number
of them (every JAX process must make the same collective calls), of disjoint samples whose union is the epoch,
with the values tarfile reads; the global batch JAX would assemble is their concatenation along axis 0."""
import importlib.util
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sfutil import Checks, make_dataset, write_graph  # noqa: E402

SRC = os.environ["SF_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(SRC, "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
spec = importlib.util.spec_from_file_location("jax_feed", os.path.join(SRC, "examples", "jax_feed.py"))
jax_feed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(jax_feed)  # imports shardflow, not jax (main() does)

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-jax-feed-")
try:
    urls, truth = make_dataset(tmp, shards=4, per_shard=32, size=8)
    batch = 8
    graph = write_graph(os.path.join(tmp, "g.yaml"), [
        ("shard_source", dict(urls=urls, shuffle=True, samples_per_epoch=len(truth) // 2)),
        ("tar_split", {}),
        ("decode", {}),
        ("augment", dict(dtype="float32", layout="chw", mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])),
        ("batch", dict(batch_size=batch, partial=False)),
        ("device_sink", {}),
    ], seed=3, epochs=1)
    per_rank = [list(jax_feed.local_batches(graph, rank, 2)) for rank in (0, 1)]
    check(len(per_rank[0]) == len(per_rank[1]) == len(truth) // 2 // batch,
          f"both processes yield {len(truth) // 2 // batch} batches: {[len(b) for b in per_rank]}")
    seen = []
    for step, (b0, b1) in enumerate(zip(*per_rank)):
        for b in (b0, b1):
            for name in ("ppm", "cls"):
                a = b[name]
                check(isinstance(a, np.ndarray) and a.flags["C_CONTIGUOUS"] and a.shape[0] == batch,
                      f"step {step} {name}: a C-contiguous [B,...] NumPy array ({type(a)}, {getattr(a, 'shape', None)})")
            check(b["ppm"].dtype == np.float32 and b["ppm"].shape[1:] == (3, 8, 8) and b["cls"].dtype == np.int64,
                  f"step {step}: dtypes and shapes {b['ppm'].dtype} {b['ppm'].shape} {b['cls'].dtype}")
            for j, key in enumerate(b["__key__"]):
                img, label = truth[key]
                want = (img.transpose(2, 0, 1).astype(np.float32) / 255.0 - 0.5) / 0.25
                check(int(b["cls"][j]) == label and np.allclose(b["ppm"][j], want, atol=1e-5),
                      f"step {step} {key}: the values tarfile's sample holds")
            seen += b["__key__"]
        glob = {name: np.concatenate([b0[name], b1[name]]) for name in ("ppm", "cls")}
        check(glob["ppm"].shape == (2 * batch, 3, 8, 8) and glob["cls"].shape == (2 * batch,),
              f"step {step}: the global batch is [processes x B, ...]: {glob['ppm'].shape}")
    check(len(seen) == len(set(seen)) == len(truth) and set(seen) == set(truth),
          f"the processes' samples are disjoint and make the epoch: {len(seen)} seen, {len(set(seen))} distinct")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.done("jax_feed")
