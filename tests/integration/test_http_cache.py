"""tar_split's shard cache against a real nginx: a shard replaced on the server is downloaded again
(never the old bytes), an unchanged one is served from the cache after nginx answers 304 Not
Modified, and the run's report counts the hits. Samples are compared with Python's tarfile;
nginx's own access log says which requests it answered 200 and which 304."""
import io
import os
import re
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, nginx, read_batches, run, tar_keys, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-http-cache-")
root = os.path.join(tmp, "www")
os.makedirs(root)
cache = os.path.join(tmp, "cache")
access_log = os.path.join(tmp, "access.log")
names = ["a.tar", "b.tar"]


def write_shard(name, first, n, mtime):
    """n samples keyed first.. with a label; the file's mtime set (nginx's ETag is mtime + size)."""
    path = os.path.join(root, name)
    with tarfile.open(path, "w") as tf:
        for k in range(first, first + n):
            info = tarfile.TarInfo(f"{k:07d}.cls")
            data = str(k % 10).encode()
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    os.utime(path, (mtime, mtime))


def statuses():
    """(path, status) of every request nginx logged so far, in order (the combined log format)."""
    with open(access_log) as f:
        return [(m.group(1), int(m.group(2))) for m in re.finditer(r'"GET (\S+) HTTP/[\d.]+" (\d+)', f.read())]


def epoch(name, base, **tar_options):
    """One epoch through the cache; returns (keys in order, the report's cache counts)."""
    out = os.path.join(tmp, name)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls="::".join(f"{base}/{n}" for n in names), shuffle=False)),
        ("tar_split", dict(cache_dir=cache, cache_size="16MiB", **tar_options)),
        ("batch", dict(batch_size=4, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=1, error_policy="fail")
    before = len(statuses())
    p = run(["run", graph, "--quiet"], check=False)
    check(p.returncode == 0, f"{name}: exit {p.returncode}\n{p.stderr}")
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    m = re.search(r"shard cache: (\d+) hit\(s\), (\d+) stale, (\d+) miss\(es\)", p.stderr)
    check(m is not None, f"{name}: the report counts the cache's hits\n{p.stderr}")
    counts = dict(zip(("hits", "stale", "misses"), map(int, m.groups())))
    return keys, counts, statuses()[before:]


write_shard("a.tar", 0, 10, 1_700_000_000)
write_shard("b.tar", 10, 6, 1_700_000_000)
with nginx(root, locations=f"access_log {access_log};") as base:
    for prefetch in (2, 0):  # shards downloaded ahead (tar_split's lookup), and one at a time (the reader's)
        tag = f"prefetch {prefetch}"
        for f in os.listdir(cache) if os.path.isdir(cache) else []:
            os.unlink(os.path.join(cache, f))
        write_shard("a.tar", 0, 10, 1_700_000_000)
        keys, n, log = epoch(f"first{prefetch}", base, prefetch=prefetch)
        check(keys == tar_keys(*(os.path.join(root, x) for x in names)), f"{tag}: first run reads the shards ({keys})")
        check(n == dict(hits=0, stale=0, misses=2), f"{tag}: first run: two misses {n}")
        check(sorted(log) == [("/a.tar", 200), ("/b.tar", 200)], f"{tag}: first run downloads both {log}")

        keys, n, log = epoch(f"unchanged{prefetch}", base, prefetch=prefetch)
        check(keys == tar_keys(*(os.path.join(root, x) for x in names)), f"{tag}: unchanged: same samples")
        check(n == dict(hits=2, stale=0, misses=0), f"{tag}: unchanged: two hits {n}")
        check(sorted(log) == [("/a.tar", 304), ("/b.tar", 304)], f"{tag}: unchanged: nginx answers 304 {log}")

        # Replaced on the server (another size and mtime, so another ETag): the new bytes, never the old.
        write_shard("a.tar", 100, 7, 1_700_000_100)
        keys, n, log = epoch(f"replaced{prefetch}", base, prefetch=prefetch)
        want = tar_keys(*(os.path.join(root, x) for x in names))
        check(keys == want, f"{tag}: replaced: the new shard's samples ({keys}, want {want})")
        check(n == dict(hits=1, stale=1, misses=0), f"{tag}: replaced: one stale entry, one hit {n}")
        check(sorted(log) == [("/a.tar", 200), ("/b.tar", 304)], f"{tag}: replaced: a.tar downloaded again {log}")

        keys, n, log = epoch(f"again{prefetch}", base, prefetch=prefetch)
        check(keys == want, f"{tag}: again: the new shard from the cache")
        check(n == dict(hits=2, stale=0, misses=0), f"{tag}: again: two hits {n}")
check.done("test_http_cache")
