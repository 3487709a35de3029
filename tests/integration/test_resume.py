"""Exact resumption: stop after batch k, resume in a fresh process, compare with an uninterrupted run:
no missing sample, no duplicate, the same order, identical bytes - for world sizes 1 and 2, batch
sizes 1 and 128, workers 1 and 4, shuffling on and off (the shape of MosaicML Streaming's test)."""
import itertools
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, run, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-resume-")
urls, truth = make_dataset(tmp, shards=16, per_shard=40)  # 640 samples


def dumps(name, world, rank, workers, worker, batch_size, shuffle, extra=()):
    out = os.path.join(tmp, name)
    shutil.rmtree(out, ignore_errors=True)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, shuffle=shuffle, workers=workers, worker=worker)),
        ("tar_split", {}),
        ("decode", {}),
        ("augment", dict(crop="random", size=8, padding=2, flip=0.5, mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2])),
        ("shuffle", dict(buffer_size=100 if shuffle else 1)),
        ("batch", dict(batch_size=batch_size)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=11, epochs=2)
    run(["run", graph, "--quiet", "--no-summary", "--rank", str(rank), "--world-size", str(world)] + list(extra))
    return {(e, b): (keys, fields) for e, b, keys, fields in read_batches(out)}


cases = 0
for world, batch_size, workers, shuffle in itertools.product((1, 2), (1, 128), (1, 4), (True, False)):
    rank, worker = world - 1, workers - 1  # the last rank and worker: the ones with the fewest shards
    tag = f"w{world}-b{batch_size}-k{workers}-{'s' if shuffle else 'n'}"
    full = dumps(tag + "-full", world, rank, workers, worker, batch_size, shuffle)
    per_epoch = max(b for (e, b) in full if e == 0) + 1
    for epoch, step in ((0, per_epoch // 2), (1, 1), (0, per_epoch)):
        resumed = dumps(f"{tag}-e{epoch}s{step}", world, rank, workers, worker, batch_size, shuffle,
                        ["--start-epoch", str(epoch), "--start-step", str(step)])
        expect = {k: v for k, v in full.items() if k >= (epoch, step)}
        check(sorted(resumed) == sorted(expect), f"{tag} from ({epoch},{step}): the same batches follow")
        for k in expect:
            (k1, f1), (k2, f2) = expect[k], resumed[k]
            check(k1 == k2 and all(np.array_equal(f1[n], f2[n]) for n in f1), f"{tag} {k}: identical keys and bytes")
        # what the first process consumed plus what the second returns: each key once per epoch
        for e in (0, 1):
            before = [key for (ee, b), (ks, _) in full.items() if ee == e and (ee, b) < (epoch, step) for key in ks]
            after = [key for (ee, b), (ks, _) in resumed.items() if ee == e for key in ks]
            whole = [key for (ee, b), (ks, _) in full.items() if ee == e for key in ks]
            check(sorted(before + after) == sorted(whole) and len(set(whole)) == len(whole),
                  f"{tag} epoch {e}: no sample missing or repeated across the stop")
        cases += 1
check(cases == 48, f"{cases} resumption cases")

# The order fingerprint: the stopped run's --stats-json records carry it; --start-fingerprint resumes only a graph that
# rebuilds the same batches (replicas and threads may differ), and refuses one with another batch size.
graph = os.path.join(tmp, "w1-b1-k1-s-full.yaml")
stats = os.path.join(tmp, "stats.jsonl")
run(["run", graph, "--quiet", "--no-summary", "--epochs", "1", "--log-steps", "50", "--stats-json", stats])
records = [json.loads(line) for line in open(stats)]
fingerprints = {r.get("order_fingerprint") for r in records}
check(len(fingerprints) == 1 and len(next(iter(fingerprints)) or "") == 64,
      f"every stats record carries the order fingerprint: {fingerprints}")
fingerprint = records[-1]["order_fingerprint"]
full = dumps("fp-full", 1, 0, 1, 0, 1, True)
for what, sets in (("the same graph", []),
                   ("decode replicas 2, threads 2", ["--set", "decode.replicas=2", "--set", "threads=2"])):
    resumed = dumps("fp-" + what.replace(" ", "-").replace(",", ""), 1, 0, 1, 0, 1, True,
                    ["--start-epoch", "0", "--start-step", "100", "--start-fingerprint", fingerprint] + sets)
    expect = {k: v for k, v in full.items() if k >= (0, 100)}
    check(sorted(resumed) == sorted(expect) and all(resumed[k][0] == expect[k][0] for k in expect),
          f"--start-fingerprint, {what}: the batches that follow, with their keys")
p = run(["run", graph, "--quiet", "--no-summary", "--start-step", "100", "--start-fingerprint", fingerprint,
         "--set", "batch.batch_size=2"], check=False)
check(p.returncode == 2 and "order fingerprint" in p.stderr and "batch_size" in p.stderr,
      f"--start-fingerprint refuses another batch size: {p.returncode} {p.stderr}")
check.done("resume")
