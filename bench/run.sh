#!/usr/bin/env bash
# Benchmark: the reference graph over 100,000 CIFAR-10 samples, from page cache and over nginx on
# loopback, against `cat` of the same shard bytes, all in one run (medians of 5, hyperfine).
#   bench/run.sh [--runs N]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=5 port=${SF_PORT:-8751}
[ "${1:-}" = "--runs" ] && runs=$2
tools/setup-debian.sh
[ -f build-release/build.ninja ] || meson setup build-release --buildtype=release -Dtests=false >/dev/null
ninja -C build-release >/dev/null
sf=$top/build-release/shardflow
archive=$top/../shared/data/cifar10-jpg.tar.zst
shards=$top/data/bench/cifar10-x2
if [ ! -f "$shards/.done" ]; then
  rm -rf "$shards"; mkdir -p "$shards"
  "$sf" write --quiet --subdir train --repeat 2 "$archive" "$shards/cifar-train-%06d.tar"
  touch "$shards/.done"
fi
samples=100000
local_urls="$shards/cifar-train-{000000..000049}.tar"
http_urls="http://127.0.0.1:$port/cifar-train-{000000..000049}.tar"
run=$(mktemp -d)
trap 'tools/nginx.sh stop "$run"; rm -rf "$run"' EXIT
tools/nginx.sh start "$shards" "$port" "$run"
graph=graphs/cifar10_train.yaml
cat "$shards"/*.tar > /dev/null # warm the page cache
hyperfine --style basic --warmup 1 --runs "$runs" --export-json "$run/times.json" \
  -n cat "cat $shards/*.tar > /dev/null" \
  -n page-cache "$sf run $graph --quiet --no-summary --set 'shard_source.urls=$local_urls'" \
  -n nginx "$sf run $graph --quiet --no-summary --set 'shard_source.urls=$http_urls'" >&2
/usr/bin/python3 - "$run/times.json" "$samples" <<'PY'
import json, statistics, sys
res = {r["command"]: statistics.median(r["times"]) for r in json.load(open(sys.argv[1]))["results"]}
n = int(sys.argv[2])
rate = {k: n / v for k, v in res.items()}
print(f"samples per run: {n} (CIFAR-10 .ppm + .cls, 50 shards), medians of {len(json.load(open(sys.argv[1]))['results'][0]['times'])} runs")
print(f"cat (raw read of the shard bytes): {rate['cat']:12,.0f} samples/s")
print(f"shardflow from page cache:         {rate['page-cache']:12,.0f} samples/s  ({rate['page-cache'] / rate['cat']:.3f} of cat)")
print(f"shardflow over nginx (loopback):   {rate['nginx']:12,.0f} samples/s  ({rate['nginx'] / rate['cat']:.3f} of cat, {rate['nginx'] / rate['page-cache']:.3f} of page cache)")
PY
