"""Elastic resume: a state saved at world size W continues its epoch at another world size W'.

Every batch is a function of the graph, seed, rank, world size and position, so the samples each
old rank consumed are found by replaying it with the real stages (no second implementation of the
shard dealing or the shuffle buffer); the rest of the epoch is dealt to the new ranks as a resume
plan that shard_source (option `plan`) and tar_split follow.  docs/resume.md describes it.
"""
import ctypes
import logging
import numbers
import operator
import os
import tempfile
from collections.abc import Mapping

# sf_pipeline_options' first_epoch and first_step are uint64: a larger Python int would wrap in ctypes.
_LARGEST = 2**63 - 1
_FIX = "pass the dict state_dict() or merge_states() returned, as it was saved (docs/resume.md)"


def merge_states(states):
    """Merges the state_dict() of every rank of one run (gathered by the trainer, e.g. with
    torch.distributed.all_gather_object) into one state that load_state_dict() resumes at any world
    size: {"epoch", "world_size", "steps": [batches rank r returned], "plans": [rank r's plan or
    None], "fingerprint"}. Raises ValueError naming what is missing or inconsistent (a state that is
    not one rank's state_dict(), a rank twice or absent, states of different epochs, world sizes or
    graphs)."""
    states = [check_state(s, merged=False) for s in states]
    if not states:
        raise ValueError("merge_states: no state given; pass the state_dict() of every rank")
    world = states[0]["world_size"]
    epochs = {s["epoch"] for s in states}
    if len(epochs) != 1 or any(s["world_size"] != world for s in states):
        raise ValueError("merge_states: the states come from different epochs or world sizes "
                         f"({sorted(epochs)}); save every rank's state at the same epoch of one run")
    fingerprints = {s.get("fingerprint") for s in states}
    if len(fingerprints) != 1:
        raise ValueError("merge_states: the states carry different order fingerprints "
                         f"({', '.join(sorted(str(f) for f in fingerprints))}): they come from pipelines of different "
                         "graphs or options; merge the states of one run, all saved by the same graph")
    by_rank = {}
    for s in states:
        if s["rank"] in by_rank:
            raise ValueError(f"merge_states: rank {s['rank']} is given twice")
        by_rank[s["rank"]] = s
    missing = [r for r in range(world) if r not in by_rank]
    if missing or len(by_rank) != world:
        raise ValueError(f"merge_states: the states of ranks {missing} of world size {world} are missing; "
                         "an elastic resume needs where every rank stood")
    merged = {"epoch": epochs.pop(), "world_size": world,
              "steps": [by_rank[r]["step"] for r in range(world)],
              "plans": [by_rank[r].get("plan") for r in range(world)]}
    fingerprint = fingerprints.pop()
    if fingerprint is not None:
        merged["fingerprint"] = fingerprint
    return merged


def _whole(value, what, least=0):
    """value as an int in least.._LARGEST; ValueError naming `what` when it is not one (a bool, a float, text)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"the state's {what} is {value!r} ({type(value).__name__}), not a whole number; {_FIX}")
    if not least <= int(value) <= _LARGEST:
        raise ValueError(f"the state's {what} is {int(value)}, outside {least}..{_LARGEST}; {_FIX}")
    return int(value)


def _plan(value, what):
    """A plan ([[shard index, sample index], ...], or None) as a list of int pairs; ValueError for another shape."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ValueError(f"the state's {what} is a {type(value).__name__}, not a list of [shard, sample] pairs; {_FIX}")
    pairs = []
    for i, pair in enumerate(value):
        if isinstance(pair, (str, bytes, Mapping)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ValueError(f"the state's {what}[{i}] is {pair!r}, not a [shard, sample] pair; {_FIX}")
        pairs.append((_whole(pair[0], f"{what}[{i}][0]"), _whole(pair[1], f"{what}[{i}][1]")))
    return pairs


def check_state(state, merged=None):
    """The state (one rank's state_dict(), or merge_states()'s result: the one with "steps") checked and with
    its numbers as ints; merged: True or False requires that form. Raises ValueError saying what is wrong
    (not a dict, a key missing, a type, a value out of range, a rank past its world size, steps or plans not one
    per rank, a plan that is not [shard, sample] pairs) and what to pass instead."""
    if not isinstance(state, Mapping):
        raise ValueError(f"the state is a {type(state).__name__}, not the dict state_dict() or merge_states() "
                         f"returns; {_FIX}")
    is_merged = "steps" in state
    if merged is not None and merged != is_merged:
        raise ValueError("merge_states takes each rank's own state_dict(), not a merged state (it has 'steps'); "
                         "merge the ranks' states once")
    keys = ("epoch", "world_size", "steps") if is_merged else ("epoch", "step", "rank", "world_size")
    absent = [k for k in keys if k not in state]
    if absent:
        raise ValueError(f"the state has no {', '.join(repr(k) for k in absent)} "
                         f"(it has {', '.join(map(repr, state))}): the key is missing; {_FIX}")
    out = dict(state)
    out["epoch"] = _whole(state["epoch"], "epoch")
    world = out["world_size"] = _whole(state["world_size"], "world_size", least=1)
    fingerprint = state.get("fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise ValueError(f"the state's fingerprint is a {type(fingerprint).__name__}, not the text state_dict() "
                         f"writes; {_FIX}")
    if not is_merged:
        out["step"] = _whole(state["step"], "step")
        out["rank"] = _whole(state["rank"], "rank")
        if out["rank"] >= world:
            raise ValueError(f"the state's rank {out['rank']} is not below its world_size {world}; {_FIX}")
        out["plan"] = _plan(state.get("plan"), "plan")
        if out["plan"] is None:
            out.pop("plan", None)
        return out
    steps, plans = state["steps"], state.get("plans")
    for name, value in (("steps", steps), ("plans", plans)):
        if value is None and name == "plans":
            continue
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
            raise ValueError(f"the merged state's {name} is a {type(value).__name__}, not a list with one entry per "
                             f"rank; {_FIX}")
        if len(value) != world:
            raise ValueError(f"the merged state has {len(value)} {name} for world_size {world}: merge_states() "
                             "gives one per rank of the run; merge the state_dict() of every rank (docs/resume.md)")
    out["steps"] = [_whole(step, f"steps[{r}]") for r, step in enumerate(steps)]
    out["plans"] = [_plan(p, f"plans[{r}]") for r, p in enumerate(plans)] if plans is not None else None
    return out


def check_fingerprint(state, fingerprint):
    """Refuses (ValueError) a state saved by a graph whose order fingerprint differs from `fingerprint` (this
    pipeline's, sf_pipeline_order_fingerprint); a state without one (saved before states carried it) is
    resumed unchecked, with a warning."""
    saved = state.get("fingerprint")
    if saved is None:
        logging.getLogger("shardflow").warning(
            "the state has no order fingerprint (saved by a shardflow from before states carried one): it is resumed "
            "unchecked; if the graph's seed, shard list, batch_size or another option that decides the order changed "
            "since, samples repeat or go missing (docs/resume.md)")
    elif saved != fingerprint:
        raise ValueError(
            f"the state's order fingerprint {saved[:16]}... is not this pipeline's {fingerprint[:16]}...: it was saved "
            "by a graph whose seed, shard list, batch_size, shuffle, samples_per_epoch, mix weights, filters or any "
            "other option that decides which samples a batch holds differ from this one (docs/resume.md lists them), "
            "so resuming here would repeat or skip samples; resume with the graph and options it was saved with, "
            "or start a new epoch with set_epoch()")


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
