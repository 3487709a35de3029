#!/usr/bin/env bash
# Benchmark: graphs/cifar10_train.yaml against WebDataset's recommended CIFAR pipeline, in one run.
# THE REFERENCE IS A RE-IMPLEMENTATION: WebDataset is not installable here (not in Debian, PyPI
# unreachable), so bench/webdataset_ref.py writes out what WebDataset does per sample (streaming tarfile,
# key grouping, shard split over DataLoader workers, .shuffle(N), .decode("rgb8"), the graph's augment in
# numpy, .batched) on Debian's python with torch, PIL and numpy; see its header.
# Interleaved rounds: the reference with 1, 2 and 4 DataLoader workers (over --ref-shards shards: it is
# slow; samples/s is what is compared) and `shardflow run` (whole process) over 50 shards from page
# cache, in an order rotated every round. Prints the medians and the ratio of shardflow to the
# reference's best configuration.
#   bench/cifar.sh [--rounds N] [--ref-shards N]
# SF_BUILD names the build directory (default build-release).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
rounds=5 ref_shards=8 build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --ref-shards) ref_shards=$2; shift 2 ;;
    *) echo "usage: bench/cifar.sh [--rounds N] [--ref-shards N]" >&2; exit 2 ;;
  esac
done
. bench/lib.sh
bench_build
sf=$build/shardflow
# The shards: bench/run.sh's set (CIFAR-10 .ppm + .cls, 2,000 samples a shard, 50 shards).
shards=$top/data/bench/cifar10-x2
if [ ! -f "$shards/.done" ]; then
  rm -rf "$shards"; mkdir -p "$shards"
  "$sf" write --quiet --subdir train --repeat 2 "$top/../shared/data/cifar10-jpg.tar.zst" "$shards/cifar-train-%06d.tar"
  touch "$shards/.done"
fi
bench_page_cache "$shards"/*.tar
/usr/bin/python3 - "$sf" "$shards" "$rounds" "$ref_shards" <<'PY'
import re, resource, statistics, subprocess, sys, time
sf, shards, rounds, ref_shards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sf_samples = 100000
sf_cmd = [sf, "run", "graphs/cifar10_train.yaml", "--quiet", "--no-summary",
          "--set", f"shard_source.urls={shards}/cifar-train-{{000000..000049}}.tar"]
ref_urls = f"{shards}/cifar-train-{{000000..{ref_shards - 1:06d}}}.tar"
rates, cpus = {}, {}  # samples/s; CPU microseconds per sample (user + system, all processes)
children_cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN))
SF = "shardflow run (whole process)"


def reference(w):
    out = subprocess.run(["/usr/bin/python3", "-W", "ignore", "bench/webdataset_ref.py", ref_urls,
                          "--workers", str(w)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"samples ([0-9]+) .*samples/s ([0-9.]+) cpu-seconds ([0-9.]+)", out)
    name = f"reference, {w} DataLoader worker{'s' if w > 1 else ''}"
    rates.setdefault(name, []).append(float(m.group(2)))
    cpus.setdefault(name, []).append(1e6 * float(m.group(3)) / int(m.group(1)))


def shardflow():
    start, cpu_start = time.perf_counter(), children_cpu()
    subprocess.run(sf_cmd, check=True, stdout=subprocess.DEVNULL)
    rates.setdefault(SF, []).append(sf_samples / (time.perf_counter() - start))
    cpus.setdefault(SF, []).append(1e6 * (children_cpu() - cpu_start) / sf_samples)


# The order rotates every round: a run right after a reference run (seconds of both cores busy) measured ~10%
# slower than after a short one on the shared machine, and no configuration should always come after the
# same one.
for name in ("reference, 1 DataLoader worker", "reference, 2 DataLoader workers", "reference, 4 DataLoader workers",
             SF):
    rates[name], cpus[name] = [], []
runs = [lambda: reference(1), lambda: reference(2), lambda: reference(4), shardflow]
for r in range(rounds):
    for run in runs[r % len(runs):] + runs[:r % len(runs)]:
        run()
    print(f"round {r + 1}/{rounds}: " + ", ".join(f"{v[-1]:,.0f}" for v in rates.values()), file=sys.stderr)
med = {k: statistics.median(v) for k, v in rates.items()}
med_cpu = {k: statistics.median(v) for k, v in cpus.items()}
print(f"medians of {rounds} interleaved rounds (reference: {ref_shards * 2000} samples, a re-implementation "
      f"of WebDataset's pipeline; shardflow: {sf_samples} samples):")
print(f"  {'':34s} {'samples/s':>12s} {'CPU us/sample':>14s}")
for k, v in med.items():
    print(f"  {k:34s} {v:12,.0f} {med_cpu[k]:14.1f}")
best = max((k for k in med if k.startswith("reference")), key=med.get)
ours = med["shardflow run (whole process)"]
print(f"ratio to the reference's best configuration ({best}): {ours / med[best]:.1f}x in samples/s")
print(f"ratio to 2 DataLoader workers: {ours / med['reference, 2 DataLoader workers']:.1f}x in samples/s, "
      f"{med_cpu['reference, 2 DataLoader workers'] / med_cpu['shardflow run (whole process)']:.1f}x in CPU per sample")
PY
