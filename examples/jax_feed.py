"""Feeding JAX from shardflow: one pipeline per host process, global batches from local ones.

UNTESTED WITH JAX: JAX is not installable on the machine this project is built on. The NumPy
path this relies on (local_batches below: per-process C-contiguous NumPy arrays of the process's
share) is tested by tests/integration/test_jax_feed.py; the JAX calls are those of JAX's
documentation for multi-process data loading (jax.make_array_from_process_local_data).

    # on every host of a TPU pod slice (or every GPU process), the same command:
    python3 examples/jax_feed.py graphs/cifar10_train.yaml

Each JAX process runs one shardflow pipeline with rank = jax.process_index() and
world_size = jax.process_count(): shard_source gives each process its own shards, and with
shard_source's samples_per_epoch every process yields the same number of batches, which
multi-process JAX needs (every process must call the collective the same number of times).
The pipeline's batch_size is the per-process batch: the global batch is batch_size x processes.
"""
import sys

import numpy as np

try:
    import shardflow
except ImportError:  # running from a source tree without the package installed
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import shardflow


def local_batches(graph, rank, world_size, **options):
    """Yields this process's batches for one epoch as a dict of C-contiguous NumPy arrays (views of
    the batch's memory through DLPack, no copy), e.g. {"ppm": float32 [B,3,H,W], "cls": int64 [B]},
    plus "__key__" (the B sample keys). The arrays stay valid after the next batch (each holds its
    batch). options: stage options as for shardflow.Pipeline (e.g. batch_size=64)."""
    with shardflow.Pipeline(graph, rank=rank, world_size=world_size, output="dict", **options) as p:
        for batch in p:
            yield {name: value if name == "__key__" else np.ascontiguousarray(value) for name, value in batch.items()}


def main(graph):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    jax.distributed.initialize()  # on TPU pods and SLURM the coordinator is found automatically
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))  # the batch axis split over every device
    for local in local_batches(graph, jax.process_index(), jax.process_count()):
        # Each process hands its own rows; JAX places them on its local devices and returns one
        # global array of shape [batch_size x process_count, ...].
        batch = {name: jax.make_array_from_process_local_data(sharding, value)
                 for name, value in local.items() if name != "__key__"}
        yield batch


if __name__ == "__main__":
    for step, batch in enumerate(main(sys.argv[1])):
        if step == 0:
            print({name: (value.shape, value.dtype) for name, value in batch.items()})
