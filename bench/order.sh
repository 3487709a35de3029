#!/usr/bin/env bash
# shard_source's orders compared on the same shards: sequential (whole shards), global (a permutation of all
# samples, one ranged read each) and block (blocks of consecutive samples, one read each), read from local
# disk (page cache), from nginx, and from nginx behind the delay proxy (a distant object store). Prints per
# order and source: samples/s, the ratio to sequential, and for HTTP the requests and bytes per sample (from
# tar_split's end-of-run account). Medians of hyperfine runs.
#   bench/order.sh [--runs N] [--shards N] [--per-shard N] [--size PX] [--rtt 20ms] [--block N]
# SF_BUILD names the build directory (default build-release), SF_PORT nginx's port (default 8753).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=3 shards=20 per_shard=1000 size=32 rtt=20ms block=64
port=${SF_PORT:-8753} build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --per-shard) per_shard=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rtt) rtt=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    *) echo "usage: bench/order.sh [--runs N] [--shards N] [--per-shard N] [--size PX] [--rtt 20ms] [--block N]" >&2
       exit 2 ;;
  esac
done
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release -Dtests=false >/dev/null
ninja -C "$build" shardflow bench/delay_proxy >/dev/null
case $build in /*) ;; *) build=$top/$build ;; esac
sf=$build/shardflow proxy_bin=$build/bench/delay_proxy

# The shards: random PPM images with a label, written once (shardflow write also writes their indexes).
data=$top/data/bench/order-$shards-$per_shard-$size
if [ ! -f "$data/.done" ]; then
  rm -rf "$data"; mkdir -p "$data/files"
  /usr/bin/python3 - "$data/files" "$((shards * per_shard))" "$size" <<'PY'
import os, sys
import numpy as np
out, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
for i in range(n):
    img = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    with open(f"{out}/{i:08d}.ppm", "wb") as f:
        f.write(f"P6\n{size} {size}\n255\n".encode() + img.tobytes())
    with open(f"{out}/{i:08d}.cls", "w") as f:
        f.write(str(i % 10))
PY
  "$sf" write --quiet --layout files --maxcount "$per_shard" "$data/files" "$data/shard-%06d.tar"
  rm -rf "$data/files"
  touch "$data/.done"
fi
range="shard-{000000..$(printf '%06d' $((shards - 1)))}.tar"
samples=$((shards * per_shard))

run=$(mktemp -d)
proxy_pid=""
cleanup() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null
  tools/nginx.sh stop "$run/nginx" || true
  rm -rf "$run"
}
trap cleanup EXIT
tools/nginx.sh start "$data" "$port" "$run/nginx"
"$proxy_bin" --upstream "127.0.0.1:$port" --listen 127.0.0.1:0 --rtt "$rtt" > "$run/proxy.out" 2> "$run/proxy.err" &
proxy_pid=$!
for _ in $(seq 50); do grep -q listening "$run/proxy.out" 2>/dev/null && break; sleep 0.1; done
pport=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$run/proxy.out")
[ -n "$pport" ] || { echo "order.sh: the delay proxy did not start:" >&2; cat "$run/proxy.err" >&2; exit 1; }

cat > "$run/graph.yaml" <<YAML
seed: 1
epochs: 1
stages:
  - type: shard_source
    urls: $data/$range
  - type: tar_split
  - type: decode
  - type: batch
    batch_size: 256
YAML
# The remote shards' indexes (ETags recorded), one directory per server URL.
"$sf" index -q --out "$run/idx-nginx" "http://127.0.0.1:$port/$range"
"$sf" index -q --out "$run/idx-proxy" "http://127.0.0.1:$pport/$range"

declare -A urls=([local]="$data/$range" [nginx]="http://127.0.0.1:$port/$range" [proxy]="http://127.0.0.1:$pport/$range")
declare -A idx=([local]="" [nginx]="$run/idx-nginx" [proxy]="$run/idx-proxy")
cmd() { # source order
  local c="$sf run $run/graph.yaml --quiet --no-summary --set 'shard_source.urls=${urls[$1]}' --set shard_source.order=$2"
  [ "$2" = block ] && c+=" --set shard_source.block_size=$block"
  [ -n "${idx[$1]}" ] && [ "$2" != sequential ] && c+=" --set 'shard_source.index_dir=${idx[$1]}'"
  echo "$c"
}

echo "== $samples samples in $shards shards of $per_shard (${size}x${size} PPM), block_size $block, proxy RTT $rtt"
printf '%-7s %-10s %12s %9s %10s %12s\n' source order samples/s vs-seq req/sample bytes/sample
for source in local nginx proxy; do
  declare -A rate=()
  for order in sequential global block; do
    c=$(cmd "$source" "$order")
    out=$(eval "$c" 2>&1)  # also checks that every sample arrives, and reads the network account
    grep -q "Replica Train Samples=$samples " <<<"$out" || { echo "order.sh: expected $samples samples from: $c" >&2
                                                           echo "$out" >&2; exit 1; }
    reqs=$(sed -n 's/.*downloaded \([0-9]*\) shard(s), \([0-9.]*\) MiB.*/\1 \2/p' <<<"$out")
    hyperfine --style none --warmup 0 --runs "$runs" --export-json "$run/h.json" "$c" >/dev/null 2>&1
    t=$(/usr/bin/python3 -c "import json,statistics,sys; print(statistics.median(json.load(open(sys.argv[1]))['results'][0]['times']))" "$run/h.json")
    rate[$order]=$(/usr/bin/python3 -c "print($samples / $t)")
    /usr/bin/python3 - "$source" "$order" "${rate[$order]}" "${rate[sequential]}" "$samples" $reqs <<'PY'
import sys
source, order, rate, seq, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
reqs = f"{int(sys.argv[6]) / n:10.3f}" if len(sys.argv) > 7 else f"{'-':>10s}"
size = f"{float(sys.argv[7]) * 1048576 / n:12.0f}" if len(sys.argv) > 7 else f"{'-':>12s}"
print(f"{source:7s} {order:10s} {rate:12.0f} {rate / seq:9.2f} {reqs} {size}")
PY
  done
  unset rate
done
