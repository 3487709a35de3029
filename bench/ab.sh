#!/usr/bin/env bash
# Interleaved A/B of two shardflow binaries on the same command: A, B, A, B, ... N rounds, then the medians
# and minima of each one's wall time and CPU time (user + system, all threads). Interleaving makes the two
# see the same drifts of a shared machine's speed; compare medians, and the CPU more than the wall.
#   bench/ab.sh [--rounds N] BINARY_A BINARY_B ARGS...
# e.g. keep the build before a change: cp build-release/shardflow /tmp/sf-before; rebuild; then
#   bench/ab.sh --rounds 16 /tmp/sf-before build-release/shardflow run graphs/cifar10_train.yaml --quiet \
#     --no-summary --set 'shard_source.urls=data/bench/cifar10-x2/cifar-train-{000000..000049}.tar'
set -euo pipefail
rounds=10
if [ "${1-}" = --rounds ]; then rounds=$2; shift 2; fi
[ $# -ge 2 ] || { echo "usage: bench/ab.sh [--rounds N] BINARY_A BINARY_B ARGS..." >&2; exit 2; }
a=$1 b=$2
shift 2
/usr/bin/python3 - "$rounds" "$a" "$b" "$@" <<'PY'
import resource, statistics, subprocess, sys, time
rounds, binaries, args = int(sys.argv[1]), sys.argv[2:4], sys.argv[4:]
cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN))
wall = {b: [] for b in binaries}
used = {b: [] for b in binaries}
for _ in range(rounds):
    for b in binaries:
        t, c = time.monotonic(), cpu()
        subprocess.run([b] + args, check=True, stdout=subprocess.DEVNULL)
        wall[b].append(time.monotonic() - t)
        used[b].append(cpu() - c)
for name, b in zip("AB", binaries):
    print(f"{name} {b}: wall median {statistics.median(wall[b]) * 1e3:.0f} ms (min {min(wall[b]) * 1e3:.0f}), "
          f"CPU median {statistics.median(used[b]) * 1e3:.0f} ms (min {min(used[b]) * 1e3:.0f}), {rounds} rounds")
ratio = lambda d: statistics.median(d[binaries[1]]) / statistics.median(d[binaries[0]])
print(f"B / A: wall {ratio(wall):.3f}, CPU {ratio(used):.3f}")
PY
