"""Faults between shardflow and nginx (tests/integration/fault_proxy.py): resets, stalls, 503 with Retry-After,
a server that ignores Range, and objects that change while they are read. Every epoch must yield each sample
exactly once (the multiset of keys equals Python tarfile's, in shard order), the resumed requests must carry
Range and If-Match, the refetched bytes must be reported, and a changed object must fail its shard with an
error record, never a sample spliced from two versions. Last, tar_split's shard cache: each shard is
downloaded once over two epochs and a second run, and the cached files equal the originals."""
import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from fault_proxy import FaultProxy  # noqa: E402
from sfutil import Checks, make_dataset, nginx, read_batches, run, tar_keys, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-faults-")
root = os.path.join(tmp, "www")
os.makedirs(root)
SHARDS = 4
# 200 samples of 16x16 RGB a shard: ~0.5 MB, more than one 512 KiB block of the reader.
make_dataset(root, shards=SHARDS, per_shard=200, size=16)
names = [f"shard-{i:06d}.tar" for i in range(SHARDS)]
sizes = [os.path.getsize(os.path.join(root, n)) for n in names]


def keys_before(path, limit):
    """(confirmed, complete): samples a reader of the first `limit` bytes of the shard must emit (the next
    sample's header arrived, so no member of theirs can follow) and those whose bytes all arrived."""
    last_end, confirmed = {}, 0
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    for i, m in enumerate(members):
        last_end[m.name.split(".")[0]] = m.offset_data + m.size
        if i > 0 and m.name.split(".")[0] != members[i - 1].name.split(".")[0] and m.offset + 512 <= limit:
            confirmed += 1
    keys = tar_keys(path)
    return confirmed, len([k for k in keys if last_end[k] <= limit])


def check_prefix(name, got, before, shard, after, limit):
    """got = before + a prefix of shard's samples (what arrived before the break) + after; nothing spliced."""
    keys = tar_keys(shard)
    lo, hi = keys_before(shard, limit)
    middle = got[len(before):len(got) - len(after)] if len(got) >= len(before) + len(after) else None
    check(got[:len(before)] == before and got[len(got) - len(after):] == after and middle is not None
          and middle == keys[:len(middle)] and lo <= len(middle) <= hi,
          f"{name}: the shard's samples before the break ({lo}..{hi}), none after it, none twice, the other "
          f"shards whole (got {len(got)}: {len(middle) if middle is not None else '?'} of the broken shard)")


truth = {n: tar_keys(os.path.join(root, n)) for n in names}
all_keys = [k for n in names for k in truth[n]]

SUMMARY = re.compile(r"downloaded (\d+) shard\(s\), [\d.]+ MiB; refetched (\d+) bytes; (\d+) retries "
                     r"\((\d+) resumed with Range\); (\d+) failed")


def epoch(name, base, policy="fail", expect_rc=0, epochs=1, **tar_options):
    """One epoch over the shards through base; returns (keys in order, stderr, summary numbers)."""
    out = os.path.join(tmp, name)
    opts = dict(retries=6, retry_wait="50ms", retry_max_wait="5s", stall_timeout="1s", connect_timeout="2s",
                prefetch=2)
    opts.update(tar_options)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls="::".join(f"{base}/{n}" for n in names), shuffle=False)),
        ("tar_split", opts),
        ("decode", {}),
        ("batch", dict(batch_size=64, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=epochs, error_policy=policy)
    t0 = time.monotonic()
    p = run(["run", graph, "--quiet"], check=False)
    took = time.monotonic() - t0
    check(p.returncode == expect_rc, f"{name}: exit {p.returncode}, expected {expect_rc}\n{p.stderr}")
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    m = SUMMARY.search(p.stderr)
    check(m is not None or tar_options.get("cache_dir"), f"{name}: the end-of-run download summary is printed\n{p.stderr}")
    numbers = dict(zip(("shards", "refetched", "retries", "resumes", "failed"), map(int, m.groups() if m else [0] * 5)))
    print(f"{name}: {took:.1f}s, {numbers}")
    return keys, p.stderr, numbers


def range_start(request):
    m = re.fullmatch(r"bytes=(\d+)-", request["range"] or "")
    return int(m.group(1)) if m else None


with nginx(root) as upstream:
    port = int(upstream.rsplit(":", 1)[1])

    # 0. No fault: the baseline, through the proxy.
    with FaultProxy(port) as proxy:
        keys, err, n = epoch("clean", proxy.base)
        check(keys == all_keys, f"clean: every sample once, in shard order ({len(keys)} of {len(all_keys)})")
        check(n["retries"] == 0 and n["refetched"] == 0 and n["shards"] == SHARDS, f"clean: no retries {n}")

    # 1. A connection reset in the middle of a shard: resumed with Range from the byte reached, pinned by ETag.
    path = "/" + names[1]
    with FaultProxy(port, {path: [("reset", 300_000)]}) as proxy:
        keys, err, n = epoch("reset", proxy.base)
        check(keys == all_keys, f"reset: every sample once, in shard order ({len(keys)} of {len(all_keys)})")
        reqs = proxy.requests(path)
        check(len(reqs) == 2, f"reset: one retry of the shard ({reqs})")
        start = range_start(reqs[1])
        check(start is not None and 0 < start <= 300_000, f"reset: the retry asks for Range bytes=N- ({reqs[1]})")
        check(reqs[1]["if_match"] and reqs[1]["if_match"].startswith('"'),
              f"reset: the retry is pinned with If-Match <ETag> ({reqs[1]})")
        check(n["retries"] == 1 and n["resumes"] == 1 and n["refetched"] == 0, f"reset: counters {n}")

    # 2. A stall longer than stall_timeout: the attempt is abandoned and resumed.
    path = "/" + names[2]
    with FaultProxy(port, {path: [("stall", 200_000, 6)]}) as proxy:
        keys, err, n = epoch("stall", proxy.base)
        check(keys == all_keys, f"stall: every sample once ({len(keys)} of {len(all_keys)})")
        reqs = proxy.requests(path)
        check(len(reqs) >= 2 and range_start(reqs[1]) and range_start(reqs[1]) <= 200_000,
              f"stall: resumed with a Range ({reqs})")
        check(reqs[1]["time"] - reqs[0]["time"] < 5.5, "stall: given up before the server woke up")
        check(n["resumes"] >= 1 and n["refetched"] == 0, f"stall: counters {n}")

    # 3. 503 with Retry-After: 1, twice: the retries wait as told.
    path = "/" + names[0]
    with FaultProxy(port, {path: [("status", 503, 1), ("status", 503, 1)]}) as proxy:
        keys, err, n = epoch("503", proxy.base)
        check(keys == all_keys, f"503: every sample once ({len(keys)} of {len(all_keys)})")
        reqs = proxy.requests(path)
        check(len(reqs) == 3, f"503: two retries ({reqs})")
        gaps = [b["time"] - a["time"] for a, b in zip(reqs, reqs[1:])]
        check(all(g >= 0.95 for g in gaps), f"503: Retry-After honoured ({gaps})")
        check(n["retries"] == 2 and n["resumes"] == 0, f"503: counters {n}")

    # 4. A server that ignores Range after a reset: it sends the whole object again (same ETag); the first N
    #    bytes are discarded and counted as refetched.
    path = "/" + names[3]
    with FaultProxy(port, {path: [("reset", 250_000), "ignore_range"]}) as proxy:
        keys, err, n = epoch("ignore_range", proxy.base)
        check(keys == all_keys, f"ignore_range: every sample once ({len(keys)} of {len(all_keys)})")
        reqs = proxy.requests(path)
        start = range_start(reqs[1]) if len(reqs) > 1 else None
        check(start is not None, f"ignore_range: the retry asked for a Range ({reqs})")
        check(n["refetched"] == start, f"ignore_range: refetched bytes = the Range start ({n}, {start})")

    # 5. 429 with a Retry-After longer than retry_max_wait: the shard fails at once (skip policy goes on).
    path = "/" + names[2]
    with FaultProxy(port, {path: [("status", 429, 3600)]}) as proxy:
        keys, err, n = epoch("retry_after_too_long", proxy.base, policy="skip")
        expect = [k for i, nm in enumerate(names) if i != 2 for k in truth[nm]]
        check(keys == expect, f"429: the other shards' samples, once ({len(keys)} of {len(expect)})")
        check(f"{proxy.base}{path}" in err and "429" in err and "retry_max_wait" in err,
              f"429: the record names the URL, the status and the option\n{err}")
        check(len(proxy.requests(path)) == 1 and n["failed"] == 1, f"429: no retry, one failure {n}")

    # 6. The object changes behind nginx between the reset and the resumed request: nginx answers the
    #    If-Match with 412; the shard fails with a record, its samples before the break stay, nothing spliced.
    victim = os.path.join(root, names[1])
    original = victim + ".orig"
    shutil.copy(victim, original)

    other = os.path.join(tmp, "other")
    os.makedirs(other)
    make_dataset(other, shards=1, per_shard=200, size=16, seed=99)  # other images under shard 0's keys

    def rewrite():
        shutil.copy(os.path.join(other, "shard-000000.tar"), victim)
        os.utime(victim, (time.time() + 10, time.time() + 10))  # a new ETag for nginx (mtime + size)

    path = "/" + names[1]
    with FaultProxy(port, {path: [("reset", 300_000, rewrite)]}) as proxy:
        keys, err, n = epoch("changed_412", proxy.base, policy="skip")
        reqs = proxy.requests(path)
        start = range_start(reqs[1]) if len(reqs) > 1 else 0
        check(len(reqs) == 2 and start > 0, f"changed_412: one resumed request ({reqs})")
        check_prefix("changed_412", keys, truth[names[0]], original, truth[names[2]] + truth[names[3]], start)
        check("412" in err and f"{proxy.base}{path}" in err and "@ byte" in err,
              f"changed_412: the record names the URL, the status and the offset\n{err}")
        check(n["failed"] == 1, f"changed_412: one shard failed {n}")
    shutil.copy(original, victim)

    # 7. A server that ignores If-Match and serves the changed bytes (another ETag) from the Range.
    path = "/" + names[2]
    with FaultProxy(port, {path: [("reset", 300_000), ("changed", False)]}) as proxy:
        keys, err, n = epoch("changed_etag", proxy.base, policy="skip")
        reqs = proxy.requests(path)
        start = range_start(reqs[1]) if len(reqs) > 1 else 0
        check_prefix("changed_etag", keys, truth[names[0]] + truth[names[1]], os.path.join(root, names[2]),
                     truth[names[3]], start)
        check("changed" in err and f"{proxy.base}{path}" in err, f"changed_etag: a clear record\n{err}")

    # 8. The same changed object, honest about If-Match (412), under the fail policy: the run stops.
    with FaultProxy(port, {path: [("reset", 300_000), ("changed", True)]}) as proxy:
        keys, err, n = epoch("changed_fail", proxy.base, policy="fail", expect_rc=1)
        check("412" in err and f"{proxy.base}{path}" in err, f"changed_fail: the record\n{err}")
        check(not set(keys) - set(all_keys) and len(keys) == len(set(keys)), "changed_fail: no sample twice")

    # 9. Retries run out: a shard that always answers 503 fails after `retries` retries.
    path = "/" + names[0]
    with FaultProxy(port, {path: [("status", 503, None)] * 10}) as proxy:
        keys, err, n = epoch("retries_out", proxy.base, policy="skip", retries=2)
        check(len(proxy.requests(path)) == 3, f"retries_out: 1 + 2 attempts ({len(proxy.requests(path))})")
        check("503" in err and "retries" in err, f"retries_out: the record says so\n{err}")
        check(keys == [k for nm in names[1:] for k in truth[nm]], "retries_out: the other shards, once")

    # 10. prefetch 0 (one shard at a time) goes through the same retries.
    path = "/" + names[1]
    with FaultProxy(port, {path: [("reset", 100_000), ("reset", 400_000)]}) as proxy:
        keys, err, n = epoch("no_prefetch", proxy.base, prefetch=0)
        check(keys == all_keys, f"no_prefetch: every sample once ({len(keys)})")
        check(n["resumes"] == 2, f"no_prefetch: two resumes {n}")

    # 10b. A tight budget (1 MiB for 3 shards ahead): downloads pause and resume on their own; a reset too.
    with FaultProxy(port, {"/" + names[2]: [("reset", 200_000)]}) as proxy:
        keys, err, n = epoch("tight_budget", proxy.base, prefetch=3, prefetch_bytes="1MiB")
        check(keys == all_keys, f"tight_budget: every sample once, in order ({len(keys)})")

    # 11. The shard cache: two epochs download each shard once (a reset included: only complete shards are
    #     cached; the second epoch only revalidates); a second run with the same cache_dir downloads nothing.
    cache = os.path.join(tmp, "shard-cache")
    with FaultProxy(port, {"/" + names[1]: [("reset", 300_000)]}) as proxy:
        keys, err, n = epoch("cache", proxy.base, epochs=2, cache_dir=cache, cache_size="64MiB")
        check(keys == all_keys + all_keys, f"cache: every sample once per epoch ({len(keys)})")
        counts = [len([r for r in proxy.requests("/" + nm) if not r["range"] and not r["if_none_match"]])
                  for nm in names]
        check(counts == [1] * SHARDS, f"cache: each shard downloaded once over two epochs ({counts})")
        cached = [f for f in os.listdir(cache) if f.endswith(".shard")]
        # An entry is a header naming the shard's version (ETag, Last-Modified), a blank line, the shard.
        digest = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
        check(sorted(digest(open(os.path.join(cache, f), "rb").read().split(b"\n\n", 1)[1]) for f in cached)
              == sorted(digest(open(os.path.join(root, nm), "rb").read()) for nm in names),
              f"cache: the shards in cache_dir are byte for byte the originals ({len(cached)})")
        before = len(proxy.log)
        keys, err, n = epoch("cache_again", proxy.base, cache_dir=cache, cache_size="64MiB")
        check(keys == all_keys, "cache_again: every sample once")
        again = proxy.log[before:]
        check(len(again) == SHARDS and all(r["if_none_match"] for r in again) and n["shards"] == 0,
              f"cache_again: no download at all, one revalidation a shard ({again}, {n})")

# Credentials in URLs never reach messages.
graph = write_graph(os.path.join(tmp, "secret.yaml"), [
    ("shard_source", dict(urls="http://alice:s3cr3t-pw@127.0.0.1:1/x.tar?X-Amz-Signature=abcdef0123", shuffle=False)),
    ("tar_split", dict(retries=0)),
    ("batch", dict(batch_size=4, partial=True)),
    ("device_sink", {}),
], seed=1, epochs=1, error_policy="fail")
p = run(["run", graph], check=False)
check(p.returncode != 0 and "127.0.0.1:1" in p.stderr, f"dead URL fails\n{p.stderr}")
check("s3cr3t" not in p.stderr and "abcdef0123" not in p.stderr, f"no credentials in messages\n{p.stderr}")
check.done("test_faults")
