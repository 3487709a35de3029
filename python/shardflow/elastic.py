"""Elastic resume: a state saved at world size W continues its epoch at another world size W'.

Every batch is a function of the graph, seed, rank, world size and position, so the samples each
old rank consumed are found by replaying it with the real stages (no second implementation of the
shard dealing or the shuffle buffer); the rest of the epoch is dealt to the new ranks as a resume
plan that shard_source (option `plan`) and tar_split follow.  docs/resume.md describes it.
"""
import ctypes
import operator
import os
import tempfile


def merge_states(states):
    """Merges the state_dict() of every rank of one run (gathered by the trainer, e.g. with
    torch.distributed.all_gather_object) into one state that load_state_dict() resumes at any world
    size: {"epoch", "world_size", "steps": [batches rank r returned], "plans": [rank r's plan or
    None]}. Raises ValueError naming what is missing or inconsistent (a rank twice or absent,
    states of different epochs or world sizes)."""
    states = list(states)
    if not states:
        raise ValueError("merge_states: no state given; pass the state_dict() of every rank")
    world = states[0]["world_size"]
    epochs = {s["epoch"] for s in states}
    if len(epochs) != 1 or any(s["world_size"] != world for s in states):
        raise ValueError("merge_states: the states come from different epochs or world sizes "
                         f"({sorted(epochs)}); save every rank's state at the same epoch of one run")
    by_rank = {}
    for s in states:
        if s["rank"] in by_rank:
            raise ValueError(f"merge_states: rank {s['rank']} is given twice")
        by_rank[s["rank"]] = s
    missing = [r for r in range(world) if r not in by_rank]
    if missing or len(by_rank) != world:
        raise ValueError(f"merge_states: the states of ranks {missing} of world size {world} are missing; "
                         "an elastic resume needs where every rank stood")
    return {"epoch": epochs.pop(), "world_size": world,
            "steps": [by_rank[r]["step"] for r in range(world)],
            "plans": [by_rank[r].get("plan") for r in range(world)]}


def _check_graph(pipeline_cls, graph, options):
    """Refuses graphs whose epoch is not a fixed set of samples dealt by shard_source alone."""
    from . import library
    g = pipeline_cls._load_graph(graph, options)
    try:
        for i in range(library.sf_graph_node_count(g)):
            if library.sf_graph_node_type(g, i).decode() != "shard_source":
                continue
            value = lambda name: library.sf_graph_node_option(g, i, name.encode()).decode()  # noqa: E731
            if value("samples_per_epoch") not in ("0", ""):
                raise ValueError("an elastic resume needs an epoch that is one pass over the shards, but "
                                 "shard_source sets samples_per_epoch (shards repeat, so the epoch's samples are "
                                 "not a fixed set): resume at the same world size, or start the next epoch")
            if value("workers") not in ("1", ""):
                raise ValueError("an elastic resume needs one loader worker per rank (shard_source workers: 1); "
                                 "the state of a DataLoader with several workers does not say where each stood")
    finally:
        library.sf_graph_destroy(ctypes.byref(g))


def _replay(pipeline_cls, graph, options, epoch, rank, world, plan):
    """(shard index, sample index) of every sample old rank `rank` returns in `epoch`, in order,
    one list per batch: the real graph run again (its reads and decodes are the cost)."""
    p = pipeline_cls(graph, rank=rank, world_size=world, epochs=0, output="numpy", **options)
    try:
        p._start(epoch, 0, plan)  # the old rank's epoch, its plan when it had one
        return list(iter(p._next_origins, None))
    finally:
        p.close()


def plan(pipeline_cls, graph, options, state, rank, world):
    """The (shard index, sample index) pairs new rank `rank` of `world` reads for the rest of the
    merged state's epoch: the epoch's samples minus those the old ranks returned, sorted by shard
    and dealt in contiguous runs, rank j getting floor(n/W') or one more (the first n mod W' ranks)."""
    _check_graph(pipeline_cls, graph, options)
    epoch, steps, plans = state["epoch"], state["steps"], state.get("plans") or [None] * len(state["steps"])
    whole, consumed = [], set()
    for old, (step, old_plan) in enumerate(zip(steps, plans)):
        batches = _replay(pipeline_cls, graph, options, epoch, old, state["world_size"], old_plan)
        if step > len(batches):
            raise ValueError(f"the state says rank {old} returned {step} batches of epoch {epoch}, but the "
                             f"graph gives it {len(batches)}: the state belongs to another graph or seed")
        whole += [s for b in batches for s in b]
        consumed.update(s for b in batches[:step] for s in b)
    rest = sorted(set(whole) - consumed)
    share, extra = divmod(len(rest), world)
    start = rank * share + min(rank, extra)
    return rest[start:start + share + (1 if rank < extra else 0)]


def write_plan(pairs):
    """Writes pairs to a new temporary plan file (lines `SHARD_INDEX SAMPLE_INDEX`); returns its
    path, which the caller removes. A malformed plan (not pairs of integers >= 0, e.g. from an edited
    state dict) raises TypeError or ValueError and leaves no file behind."""
    lines = []
    for pair in pairs:
        shard, sample = pair  # TypeError / ValueError when it is not a pair
        shard, sample = operator.index(shard), operator.index(sample)  # ints only: no "1\n2" lines
        if shard < 0 or sample < 0:
            raise ValueError(f"plan pair {pair!r}: shard and sample indices are >= 0")
        lines.append(f"{shard} {sample}\n")
    fd, path = tempfile.mkstemp(prefix="shardflow-plan-", suffix=".txt")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("# shardflow resume plan: shard index, sample index within the shard\n")
            f.writelines(lines)
    except BaseException:
        os.remove(path)
        raise
    return path
