"""Elastic resume: 2 ranks stop after k steps (3 and 2), their merged state resumes at 3 and at 1 ranks:
the consumed keys plus the resumed ranks' keys are every sample of the shards exactly once (the
reference is the shards' own key list, from tarfile), the new ranks get equal shares (+-1), the next
epoch is the new world's ordinary epoch; a state saved inside the resumed epoch resumes again (same
and other world size); states that lack the information are refused, naming what is missing. A malformed plan
(a pair of the wrong length, a value that is not an integer) is refused and leaves no temporary file."""
import logging
import os
import pickle
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
from sfutil import Checks, make_dataset, tar_keys, write_graph  # noqa: E402

import shardflow  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-elastic-")

plan_tmp = tempfile.mkdtemp(prefix="sf-plan-")
saved_tempdir, tempfile.tempdir = tempfile.tempdir, plan_tmp
try:
    for bad in ([(1, 2), (3,)], [(1, 2, 3)], [("1\n2", 3)], [(1.5, 2)], [(-1, 2)], [None], 5):
        try:
            path = shardflow.elastic.write_plan(bad)
            check(False, f"the plan {bad!r} is refused, not written as {open(path).read()!r}")
        except (TypeError, ValueError):
            pass
        check(os.listdir(plan_tmp) == [], f"the refused plan {bad!r} left {os.listdir(plan_tmp)}")
    path = shardflow.elastic.write_plan([(0, 1), [2, 3]])
    check(open(path).read().splitlines()[1:] == ["0 1", "2 3"], "a good plan is written")
    os.remove(path)
finally:
    tempfile.tempdir = saved_tempdir
    shutil.rmtree(plan_tmp)
try:
    urls, truth = make_dataset(tmp, shards=6, per_shard=20)  # 120 samples
    every = sorted(tar_keys(*[os.path.join(tmp, f) for f in sorted(os.listdir(tmp)) if f.endswith(".tar")]))
    check(sorted(every) == sorted(truth) and len(set(every)) == 120, "reference: 120 distinct keys in the shards")

    def graph(shuffle, samples_per_epoch=0, batch_size=8):
        return write_graph(os.path.join(tmp, f"g-{shuffle}-{samples_per_epoch}-{batch_size}.yaml"), [
            ("shard_source", dict(urls=urls, shuffle=shuffle, samples_per_epoch=samples_per_epoch)),
            ("tar_split", {}),
            ("decode", {}),
            ("shuffle", dict(buffer_size=25 if shuffle else 1)),
            ("batch", dict(batch_size=batch_size, partial=True)),
            ("device_sink", {}),
        ], seed=7, epochs=2)

    def pipe(g, rank, world, **options):
        return shardflow.Pipeline(g, rank=rank, world_size=world, output="dict", **options)

    def take(p, n):
        """Keys of the next n batches (all of the epoch when n is None)."""
        keys = []
        for _ in range(10**6 if n is None else n):
            b = p.next_batch()
            if b is None:
                break
            keys += b["__key__"]
        return keys

    def resume(g, state, world, steps=None):
        """Each new rank's keys for the rest of the epoch (or its first steps[j] batches), and its pipeline."""
        out = []
        for j in range(world):
            p = pipe(g, j, world)
            p.load_state_dict(state)
            out.append((take(p, None if steps is None else steps[j]), p))
        return out

    for shuffle in (True, False):
        g = graph(shuffle)
        old = [pipe(g, r, 2) for r in range(2)]
        consumed = take(old[0], 3) + take(old[1], 2)
        merged = shardflow.merge_states([p.state_dict() for p in reversed(old)])
        check(merged["steps"] == [3, 2] and len(consumed) == 40, f"shuffle={shuffle}: merged state {merged['steps']}")
        for world in (3, 1):
            ranks = resume(g, merged, world)
            got = [k for keys, _ in ranks for k in keys]
            check(sorted(consumed + got) == every,
                  f"shuffle={shuffle} 2 -> {world}: every sample exactly once "
                  f"({len(consumed)} + {len(got)}, {len(set(consumed + got))} distinct of {len(every)})")
            sizes = [len(keys) for keys, _ in ranks]
            check(max(sizes) - min(sizes) <= 1, f"shuffle={shuffle} 2 -> {world}: equal shares {sizes}")
            # the next epoch is the new world's ordinary one
            for j, (_, p) in enumerate(ranks):
                fresh = pipe(g, j, world)
                fresh.set_epoch(1)
                check(take(p, None) == take(fresh, None), f"shuffle={shuffle} 2 -> {world} rank {j}: epoch 1 as usual")
                fresh.close()
                p.close()

        # a state saved inside the resumed epoch: the same world continues it exactly; another world splits it
        ranks = resume(g, merged, 3, steps=[1, 2, 1])
        first = [k for keys, _ in ranks for k in keys]
        states = [p.state_dict() for _, p in ranks]
        check(all("plan" in s for s in states), f"shuffle={shuffle}: a state inside a resumed epoch holds its plan")
        rest3 = []
        for j, (_, p) in enumerate(ranks):
            expect = take(p, None)
            again = pipe(g, j, 3)
            again.load_state_dict(states[j])
            check(take(again, None) == expect, f"shuffle={shuffle} 3 -> 3 rank {j}: the same batches follow")
            again.close()
            rest3 += expect
        check(sorted(consumed + first + rest3) == every, f"shuffle={shuffle}: resumed twice at 3, every sample once")
        twice = resume(g, shardflow.merge_states(states), 2)
        got = [k for keys, _ in twice for k in keys]
        check(sorted(consumed + first + got) == every, f"shuffle={shuffle}: 2 -> 3 -> 2, every sample exactly once")
        for _, p in ranks + twice:
            p.close()
        for p in old:
            p.close()

    # refusals that name what is missing
    g = graph(True)
    p0, p1 = pipe(g, 0, 2), pipe(g, 1, 2)
    take(p0, 1)
    one = p0.state_dict()
    target = pipe(g, 0, 3)

    def refused(call, words, what):
        try:
            call()
        except ValueError as e:
            check(all(w in str(e) for w in words), f"{what}: {e}")
            return
        check(False, f"{what}: accepted")

    refused(lambda: target.load_state_dict(one), ["rank 0 of 2", "merge_states"], "one rank's state at world 3")
    refused(lambda: shardflow.merge_states([one]), ["ranks [1]", "missing"], "merge_states without rank 1")
    refused(lambda: shardflow.merge_states([one, one]), ["rank 0", "twice"], "merge_states with rank 0 twice")
    g_spe = graph(True, samples_per_epoch=50)
    q0, q1 = pipe(g_spe, 0, 2), pipe(g_spe, 1, 2)
    take(q0, 1)
    spe = shardflow.merge_states([q0.state_dict(), q1.state_dict()])
    refused(lambda: pipe(g_spe, 0, 3).load_state_dict(spe), ["samples_per_epoch"], "a graph with samples_per_epoch")
    for p in (p0, p1, target, q0, q1):
        p.close()

    # Inconsistent states are refused, saying what is wrong: each of these resumed (before the checks) with
    # samples lost or repeated, counted here against the epoch's keys; a good state still resumes exactly.
    def outcome(call, expect):
        """call() returns every key of the epoch the trainer saw (consumed before the stop + resumed after):
        (None, message) when it raises ValueError, else (what it lost and repeated against expect, None)."""
        try:
            got = call()
        except ValueError as e:
            return None, str(e)
        except Exception as e:  # noqa: BLE001 - any other failure is a wrong answer too
            return f"raised {type(e).__name__}: {e}", None
        missing, repeated = len(set(expect) - set(got)), len(got) - len(set(got))
        return f"{missing} of {len(expect)} samples lost, {repeated} repeated", None

    def must_refuse(what, call, expect, words):
        counts, message = outcome(call, expect)
        check(message is not None, f"{what}: {'refused' if message is not None else 'accepted: ' + counts}")
        check(all(w in (message or "") for w in words), f"{what}: refused, naming {words}: {message}")

    def elastic_keys(state, world, before):
        """A call giving the keys consumed before the stop plus what state's resume at world ranks returns."""
        def call():
            keys = list(before)
            for got, p in resume(g, state, world):
                keys += got
                p.close()
            return keys
        return call

    g, g16 = graph(True), graph(True, batch_size=16)
    old = [pipe(g, r, 2) for r in range(2)]
    consumed = take(old[0], 3) + take(old[1], 2)
    merged = shardflow.merge_states([p.state_dict() for p in old])
    short = dict(merged, steps=merged["steps"][:1], plans=merged["plans"][:1])
    must_refuse("merged state with 1 step for world size 2", elastic_keys(short, 3, consumed), every,
                ["steps", "world_size 2", "merge_states"])
    must_refuse("merged state with a negative step", elastic_keys(dict(merged, steps=[3, -1]), 3, consumed), every,
                ["steps", "-1"])

    def other_batch_size():
        p16 = pipe(g16, 0, 1)
        first = take(p16, 3)  # 48 samples
        p8 = pipe(g, 0, 1)
        p8.load_state_dict(p16.state_dict())
        keys = first + take(p8, None)
        p16.close()
        p8.close()
        return keys

    must_refuse("batch_size 16's state in a batch_size 8 graph", other_batch_size, every,
                ["fingerprint", "batch_size", "docs/resume.md"])
    for p in old:
        p.close()

    # a good state resumes exactly (the keys in the uninterrupted run's order), also with other replicas and threads
    whole = take(pipe(g, 0, 1), None)
    check(sorted(whole) == every, "uninterrupted: every key once")
    p = pipe(g, 0, 1)
    first = take(p, 4)
    state = p.state_dict()
    check(isinstance(state.get("fingerprint"), str) and len(state["fingerprint"]) == 64,
          f"the state carries the order fingerprint: {state}")
    for what, options in (("the same graph", {}), ("decode replicas 3, threads 3, tar_split mmap off",
                                                    dict(decode__replicas=3, threads=3, tar_split__mmap=False))):
        q = pipe(g, 0, 1, **options)
        q.load_state_dict(pickle.loads(pickle.dumps(state)))
        check(first + take(q, None) == whole, f"{what}: the uninterrupted run's keys, in order")
        q.close()
    merged1 = shardflow.merge_states([state])
    check(merged1.get("fingerprint") == state.get("fingerprint", ""), "merge_states keeps the fingerprint")

    # a state saved before states had a fingerprint still loads, unchecked, with a warning
    legacy = {k: v for k, v in state.items() if k != "fingerprint"}
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("shardflow").addHandler(handler)
    q = pipe(g, 0, 1)
    q.load_state_dict(legacy)
    logging.getLogger("shardflow").removeHandler(handler)
    check(first + take(q, None) == whole, "a state without a fingerprint resumes")
    check(any("fingerprint" in r.getMessage() for r in records),
          f"... with a warning: {[r.getMessage() for r in records]}")
    q.close()

    # wrong types and shapes, out-of-range values
    bad = [
        ("not a dict", [0, 4], ["dict", "state_dict()"]),
        ("step as text", dict(state, step="4"), ["step", "'4'"]),
        ("step True", dict(state, step=True), ["step", "True"]),
        ("epoch 1.5", dict(state, epoch=1.5), ["epoch", "1.5"]),
        ("epoch -1", dict(state, epoch=-1), ["epoch", "-1"]),
        ("step -2", dict(state, step=-2), ["step", "-2"]),
        ("rank past the world", dict(state, rank=1), ["rank 1", "world_size 1"]),
        ("no step", {k: v for k, v in state.items() if k != "step"}, ["step", "missing"]),
        ("fingerprint of another graph", dict(state, fingerprint="0" * 64), ["fingerprint", "docs/resume.md"]),
        ("plan of triples", dict(state, plan=[[0, 1, 2]]), ["plan", "[shard, sample]"]),
        ("plan of negatives", dict(state, plan=[[0, -1]]), ["plan", "-1"]),
        ("merged: plans for 2 ranks at world 1", dict(merged1, plans=[None, None]), ["plans", "world_size 1"]),
        ("merged: step as a float", dict(merged1, steps=[4.0]), ["steps", "4.0"]),
    ]
    for what, s, words in bad:
        q = pipe(g, 0, 1)
        must_refuse(what, lambda: first + (q.load_state_dict(s) or take(q, None)), whole, words)
        check(take(q, 1) == whole[:8], f"{what}: after the refusal the pipeline goes on as before")
        q.close()
    refused(lambda: shardflow.merge_states([state, dict(state, rank=1, world_size=2)]), ["world sizes"],
            "merge_states of different world sizes")
    s16 = pipe(g16, 1, 2)
    refused(lambda: shardflow.merge_states([dict(state, world_size=2), s16.state_dict()]), ["fingerprint"],
            "merge_states of two graphs")
    s16.close()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.done("elastic")
