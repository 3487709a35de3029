"""shardflow.torch: a pipeline as a PyTorch IterableDataset, for DataLoader(dataset, batch_size=None).

    ds = shardflow.dataset("graphs/cifar10_train.yaml", samples_per_epoch=25_000)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in range(epochs):
        ds.set_epoch(epoch)              # before iterating: reaches the workers, persistent ones too
        for images, labels in loader:    # len(loader) batches, samples_per_epoch samples on this rank
            ...

Every DataLoader worker runs its own pipeline over its own shards (shard_source's worker split:
rank x workers slots) and takes its share of samples_per_epoch, so the rank still yields
samples_per_epoch samples in len(ds) batches whatever num_workers is. With shard_source's order: global
or block the rank's batches are dealt in rounds (worker w reads the rank's batches w, w + num_workers, ...),
so the rank yields the same batches whatever num_workers is, and ds.state_dict(batches=k) in the trainer's
process is a state that resumes at any world size and num_workers (docs/resume.md).
"""
import ctypes
import multiprocessing
import os

import torch.utils.data

from . import Pipeline, library


def _worker_share(samples, batch_size, workers, worker):
    """Samples of one worker: whole batches dealt out in turn, the short rest to the worker with
    one batch fewer (or the last one), so the workers together cut the same batches a single
    pipeline would (ceil or floor of samples / batch_size of them)."""
    full, rest = divmod(samples, batch_size)
    batches = full // workers + (1 if worker < full % workers else 0)
    return batches * batch_size + (rest if worker == full % workers else 0)


class PipelineDataset(torch.utils.data.IterableDataset):
    """One epoch of batches per iteration, as Pipeline yields them (output "torch" unless given).

    graph and keyword arguments: as Pipeline's (a file's path or YAML text; stage options by name).
    set_epoch(epoch) chooses the epoch of the next iteration, in the main process; the epoch sits in
    shared memory, so DataLoader workers see it when they start an iteration, persistent ones too.
    len() is the rank's batches per epoch (needs shard_source's samples_per_epoch; TypeError
    otherwise), the number DataLoader(batch_size=None) reports as its length.
    """

    def __init__(self, graph, **options):
        super().__init__()
        self._graph, self._options = graph, options
        self._epoch = multiprocessing.RawValue("q", 0)  # inherited (or sent at spawn) by the workers
        self._pipeline = None  # the running iteration's pipeline, in this process (a worker, or the main one)
        self._pending = None   # a loaded state, for the next iteration

    @property
    def epoch(self):
        """The epoch the next iteration yields (0-based)."""
        return self._epoch.value

    def set_epoch(self, epoch):
        """Sets the epoch the next iteration yields (DistributedSampler's set_epoch): any epoch. A loaded state
        of another epoch is dropped (its epoch is done); one of this epoch is kept."""
        self._epoch.value = int(epoch)
        if self._pending is not None and self._pending.get("epoch") != int(epoch):
            self._pending = None

    def _measure(self, measure):
        """measure(graph) of the graph with this dataset's stage options (Pipeline's arguments left out)."""
        graph_options = {k: v for k, v in self._options.items()
                         if k not in ("rank", "world_size", "epochs", "output")}
        g = Pipeline._load_graph(self._graph, graph_options)
        try:
            return measure(g)
        finally:
            library.sf_graph_destroy(ctypes.byref(g))

    def __len__(self):
        batches = self._measure(Pipeline._epoch_batches)
        if batches is None:
            raise TypeError("the epoch length is not fixed: set shard_source's samples_per_epoch to have len()")
        return batches

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        options = dict(self._options)
        options.setdefault("output", "torch")
        if info is not None and info.num_workers > 1:
            shape = self._measure(Pipeline._epoch_shape)
            indexed = self._measure(Pipeline._indexed_order)
            # The inputs of a mix by position are split alike (the mix deals its positions as they do).
            for source in indexed[0] if indexed and len(indexed[0]) > 1 else ("shard_source",):
                options.setdefault(f"{source}__workers", info.num_workers)
                options.setdefault(f"{source}__worker", info.id)
            if shape is not None and indexed and indexed[2] is None:
                # Dealt in rounds of a batch (shard_source's deal): samples_per_epoch stays the rank's and worker w
                # reads rounds w, w + workers, ...: none when the rank has no more batches than that.
                if info.id >= Pipeline._epoch_batches_of(shape):
                    return
            elif shape is not None:
                share = _worker_share(shape[0], shape[1], info.num_workers, info.id)
                if share == 0:
                    return  # more workers than batches: this one has none
                options["shard_source__samples_per_epoch"] = share
        with Pipeline(self._graph, **options) as p:
            if (info is not None and info.num_workers > 1 and shape is None and indexed and indexed[2] is None
                    and self._pending is None and info.id >= p._rank_batches(self._epoch.value)):
                return  # dealt in rounds: the rank's epoch has fewer batches than workers, none for this one
            if self._pending is not None and self._pending.get("epoch", self._epoch.value) == self._epoch.value:
                p.load_state_dict(self._pending)  # this worker's own position (torchdata's protocol)
                self._pending = None
            else:
                p.set_epoch(self._epoch.value)
            self._pipeline = p
            try:
                yield from p
            finally:
                self._pipeline = None

    def state_dict(self, batches=None):
        """The position of this process's iteration, torchdata's Stateful protocol: StatefulDataLoader calls it
        in each DataLoader worker (each reads its own shards: its state is its own) and hands each worker its
        state back through load_state_dict() on resume. Outside an iteration: the loaded state, else the epoch
        the next iteration starts. A small dict (Pipeline.state_dict(), docs/resume.md).

        batches: in the trainer's process, the batches it took from the DataLoader in the current epoch (of
        the epoch set_epoch() set, or of the loaded state's): the rank's state, counting the samples every
        rank consumed, which resumes at any world size and number of DataLoader workers (load_state_dict()
        before making the DataLoader). Needs shard_source's order: global or block and a graph whose rows
        are its samples in order (ValueError naming what stands in the way otherwise)."""
        if batches is not None:
            return {"pipeline": self._rank_state(int(batches))}
        if self._pipeline is not None:
            return {"pipeline": self._pipeline.state_dict()}
        if self._pending is not None:
            return {"pipeline": self._pending}
        return {"epoch": self._epoch.value}

    def _rank_state(self, batches):
        """The rank's state after it took `batches` batches of the current epoch (see state_dict)."""
        graph_options = {k: v for k, v in self._options.items()
                         if k not in ("rank", "world_size", "epochs", "output")}
        g = Pipeline._load_graph(self._graph, graph_options)
        try:
            indexed = Pipeline._indexed_order(g)
            if indexed is None or indexed[2] is not None:
                raise ValueError("the rank's state counts consumed samples, which needs shard_source's order: "
                                 "global or block and a graph whose rows are its samples in order"
                                 + (f"; here {indexed[2]}" if indexed else "") + ": save each worker's own "
                                 "state (torchdata's StatefulDataLoader) and resume with the same workers")
            Pipeline._deal(g, indexed)
            fingerprint = Pipeline._layout_free_fingerprint(g, indexed)
        finally:
            library.sf_graph_destroy(ctypes.byref(g))

        def placed(name, env, fallback):
            value = self._options.get(name)
            if value is None:
                value = os.environ.get(env[0], os.environ.get(env[1], fallback))
            return int(value)
        rank = placed("rank", ("RANK", "SLURM_PROCID"), 0)
        world = placed("world_size", ("WORLD_SIZE", "SLURM_NTASKS"), 1)
        epoch, base = self._epoch.value, 0
        pending = self._pending
        if pending is not None and pending.get("epoch") == epoch and "consumed" in pending:
            base = int(pending["consumed"])  # this epoch was resumed: its count goes on from there
        return {"epoch": epoch, "step": batches, "rank": rank, "world_size": world, "fingerprint": fingerprint,
                "consumed": base + batches * indexed[1] * world}

    def load_state_dict(self, state):
        """Resumes the next iteration where state_dict() was taken: in the same worker of the same number of
        workers and world size (the same process of a StatefulDataLoader), or any world size for a pipeline
        whose state counts consumed samples (shard_source order: global or block), also at any number of
        workers (ds.state_dict(batches=k), or the worker state with the least "consumed"). Checked when the
        iteration starts (Pipeline.load_state_dict's errors)."""
        if "pipeline" in state:
            self._pending = dict(state["pipeline"])
            epoch = self._pending.get("epoch")
            if torch.utils.data.get_worker_info() is None and isinstance(epoch, int) and epoch >= 0:
                self._epoch.value = epoch  # the trainer's process: the workers it starts resume this epoch
        else:
            self._pending = None
            self._epoch.value = int(state["epoch"])
