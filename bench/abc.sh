#!/usr/bin/env bash
# The reference comparison (WebDataset's A/B/C table) on this machine, through graphs/cifar10_train.yaml:
#   A: one object per image (one-sample tar shards) over HTTP behind the delay proxy, random order,
#   B: the shards on local disk (page cache),
#   C: the same shards over HTTP behind the delay proxy, with prefetch when tar_split has it.
# First checks that the proxy's RTT and rate are what it was asked for. Medians of hyperfine runs; then
# the shardflow process's own CPU (user+sys) per sample for B and C, medians of interleaved runs.
#   bench/abc.sh [--runs N] [--shards N] [--a-samples N] [--rtt 20ms] [--rate 1GB/s] [--prefetch K] [--check-proxy]
# --check-proxy stops after the proxy check (exit 1 when the proxy is not what it was asked to be).
# SF_BUILD names the build directory (default build-release), SF_PORT nginx's port (default 8752).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=5 a_runs=3 shards=100 a_samples=400 rtt=20ms rate=1GB/s prefetch=4 prefetch_bytes=64MiB
port=${SF_PORT:-8752} build=${SF_BUILD:-build-release} check_only=no
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; a_runs=$(( $2 < 3 ? $2 : 3 )); shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --a-samples) a_samples=$2; shift 2 ;;
    --rtt) rtt=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --prefetch) prefetch=$2; shift 2 ;;
    --check-proxy) check_only=yes; shift ;;
    *) echo "usage: bench/abc.sh [--runs N] [--shards N] [--a-samples N] [--rtt 20ms] [--rate 1GB/s] [--prefetch K] [--check-proxy]" >&2; exit 2 ;;
  esac
done
tools/setup-debian.sh
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release -Dtests=false >/dev/null
ninja -C "$build" shardflow bench/delay_proxy >/dev/null
case $build in /*) ;; *) build=$top/$build ;; esac
sf=$build/shardflow proxy_bin=$build/bench/delay_proxy
graph=graphs/cifar10_train.yaml

# The shards: the main job's CIFAR-10 set (2,000 samples a shard), else bench/run.sh's smaller one.
src=$top/data/cifar10/train
last=$(printf 'cifar-train-%06d.tar' $((shards - 1)))
if [ ! -f "$src/$last" ]; then
  src=$top/data/bench/cifar10-x2
  if [ ! -f "$src/.done" ]; then
    rm -rf "$src"; mkdir -p "$src"
    "$sf" write --quiet --subdir train --repeat 2 "$top/../shared/data/cifar10-jpg.tar.zst" "$src/cifar-train-%06d.tar"
    touch "$src/.done"
  fi
  [ -f "$src/$last" ] || { echo "abc.sh: $src has fewer than $shards shards; use --shards" >&2; exit 1; }
fi
shard_range="cifar-train-{000000..$(printf '%06d' $((shards - 1)))}.tar"
samples=$((shards * 2000))

# A's objects: the first a_samples samples of shard 0, one tar per sample (its .ppm and .cls), by tarfile.
adir=$top/data/bench/abc-a-$a_samples
if [ ! -f "$adir/.done" ]; then
  rm -rf "$adir"; mkdir -p "$adir"
  /usr/bin/python3 - "$src/cifar-train-000000.tar" "$adir" "$a_samples" <<'PY'
import io, sys, tarfile
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
groups, order = {}, []
with tarfile.open(src) as t:
    for m in t:
        key = m.name.split(".", 1)[0]
        if key not in groups:
            if len(order) == n:
                break
            groups[key] = []
            order.append(key)
        groups[key].append((m, t.extractfile(m).read()))
for i, key in enumerate(order):
    with tarfile.open(f"{out}/sample-{i:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as o:
        for m, data in groups[key]:
            o.addfile(m, io.BytesIO(data))
PY
  touch "$adir/.done"
fi
a_range="sample-{000000..$(printf '%06d' $((a_samples - 1)))}.tar"

# One nginx serves both sets (symlinks) a small object and a big one (40 shards) for the proxy check.
run=$(mktemp -d)
proxy_pid="" proxy2_pid=""
cleanup() {
  [ -n "$proxy2_pid" ] && kill "$proxy2_pid" 2>/dev/null
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null
  tools/nginx.sh stop "$run/nginx" || true
  rm -rf "$run"
}
trap cleanup EXIT
mkdir -p "$run/www"
ln -s "$src" "$run/www/shards"
ln -s "$adir" "$run/www/a"
head -c 100 /dev/urandom > "$run/www/small.bin"
eval cat "$src/cifar-train-{000000..$(printf %06d $(( shards < 40 ? shards - 1 : 39 )))}.tar" > "$run/www/big.bin"
tools/nginx.sh start "$run/www" "$port" "$run/nginx"
"$proxy_bin" --upstream "127.0.0.1:$port" --listen 127.0.0.1:0 --rtt "$rtt" --rate "$rate" \
  > "$run/proxy.out" 2> "$run/proxy.err" &
proxy_pid=$!
for _ in $(seq 50); do grep -q listening "$run/proxy.out" 2>/dev/null && break; sleep 0.1; done
pport=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$run/proxy.out")
[ -n "$pport" ] || { echo "abc.sh: the delay proxy did not start:" >&2; cat "$run/proxy.err" >&2; exit 1; }

# A second proxy with a cap low enough for one client to measure: is the rate what it says?
"$proxy_bin" --upstream "127.0.0.1:$port" --listen 127.0.0.1:0 --rtt "$rtt" --rate 200MB/s > "$run/proxy2.out" 2>/dev/null &
proxy2_pid=$!
for _ in $(seq 50); do grep -q listening "$run/proxy2.out" 2>/dev/null && break; sleep 0.1; done
pport2=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$run/proxy2.out")

echo "== delay proxy check (asked: RTT $rtt, rate $rate; the second proxy: RTT $rtt, rate 200MB/s)"
check_rc=0
/usr/bin/python3 - "$port" "$pport" "$pport2" "$rtt" <<'PY' || check_rc=$?
import http.client, statistics, sys, threading, time
def get(conn, path):
    conn.request("GET", path)
    r = conn.getresponse()
    n = 0
    while True:
        b = r.read(1 << 20)
        if not b:
            return n
        n += len(b)
def check(port):
    news = []
    for _ in range(5):
        t = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port)
        get(c, "/small.bin")
        news.append(time.perf_counter() - t)
    first = statistics.median(news)
    lat = []
    for _ in range(15):
        t = time.perf_counter(); get(c, "/small.bin"); lat.append(time.perf_counter() - t)
    global big
    t = time.perf_counter(); big = get(c, "/big.bin"); one = big / (time.perf_counter() - t)
    # four connections at once share the link
    res = []
    def worker():
        w = http.client.HTTPConnection("127.0.0.1", port); get(w, "/small.bin")
        res.append(get(w, "/big.bin"))
    ths = [threading.Thread(target=worker) for _ in range(4)]
    t = time.perf_counter()
    for th in ths: th.start()
    for th in ths: th.join()
    four = sum(res) / (time.perf_counter() - t)
    return first * 1e3, statistics.median(lat) * 1e3, one / 1e6, four / 1e6
rtt = float(sys.argv[4].removesuffix("ms")) if sys.argv[4].endswith("ms") else float(sys.argv[4].removesuffix("s")) * 1e3
got = {}
for name, port in (("nginx direct", sys.argv[1]), ("proxy", sys.argv[2]), ("proxy 200MB/s", sys.argv[3])):
    got[name] = f, l, one, four = check(int(port))
    print(f"{name:14s}: request {l:6.2f} ms on a kept-alive connection, {f:6.2f} ms on a new one (medians); "
          f"one GET of {big/1e6:.0f} MB {one:7.1f} MB/s, 4 at once {four:7.1f} MB/s in all")
# What the proxy promises: +1 RTT per request, +2 RTT for a new connection (handshake), the rate cap
# (a 410 MB GET pays one RTT on top of size/rate; four connections share the one link).
direct, slow = got["nginx direct"], got["proxy 200MB/s"]
bad = []
for name in ("proxy", "proxy 200MB/s"):
    f, l, _, _ = got[name]
    # never faster than the delay; slower only by the machine's own noise
    if not (l >= rtt * 0.98 and l - direct[1] <= rtt * 1.25 + 2): bad.append(f"{name}: request adds {l - direct[1]:.2f} ms, not {rtt:g}")
    if not (f >= 2 * rtt * 0.98 and f - direct[0] <= 2 * rtt * 1.25 + 4): bad.append(f"{name}: new connection adds {f - direct[0]:.2f} ms, not {2 * rtt:g}")
for label, v in (("one GET", slow[2]), ("4 at once", slow[3])):
    if not 180 <= v <= 202: bad.append(f"proxy 200MB/s: {label} moved {v:.1f} MB/s")
print("proxy check: " + ("as asked" if not bad else "MISMATCH: " + "; ".join(bad)))
sys.exit(1 if bad else 0)
PY
kill "$proxy2_pid"; wait "$proxy2_pid" 2>/dev/null || true; proxy2_pid=""
[ "$check_rc" -eq 0 ] || exit "$check_rc"
[ "$check_only" = yes ] && exit 0

have_prefetch=no
if "$sf" help tar_split | grep -Eq '^[[:space:]]*prefetch[[:space:]]'; then have_prefetch=yes; fi
pf=()
[ $have_prefetch = yes ] && pf=(--set "tar_split.prefetch=$prefetch" --set "tar_split.prefetch_bytes=$prefetch_bytes")
cmd_a="$sf run $graph --quiet --no-summary --set 'shard_source.urls=http://127.0.0.1:$pport/a/$a_range' ${pf[*]}"
cmd_b="$sf run $graph --quiet --no-summary --set 'shard_source.urls=$src/$shard_range'"
cmd_c="$sf run $graph --quiet --no-summary --set 'shard_source.urls=http://127.0.0.1:$pport/shards/$shard_range' ${pf[*]}"
cmd_c0="$sf run $graph --quiet --no-summary --set 'shard_source.urls=http://127.0.0.1:$pport/shards/$shard_range' --set tar_split.prefetch=0"

# Every run must deliver every sample: check once (this also warms the page cache and nginx).
verify() {
  local want=$1 cmd=$2 out
  out=$(eval "$cmd" 2>&1)
  grep -q "Replica Train Samples=$want " <<<"$out" || { echo "abc.sh: expected $want samples from: $cmd" >&2; echo "$out" >&2; exit 1; }
}
eval cat "$src/$shard_range" > /dev/null
verify "$a_samples" "$cmd_a"; verify "$samples" "$cmd_b"; verify "$samples" "$cmd_c"

echo "== A/B/C (prefetch: $have_prefetch${pf[*]:+, ${pf[*]}}); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
hyperfine --style basic --runs "$a_runs" --export-json "$run/a.json" -n A "$cmd_a" >&2
# Two rows that separate the costs: C's graph straight from nginx (no delay: the loopback HTTP path's
# CPU), and C without prefetch (what the delay costs when nothing hides it).
cmd_n="$sf run $graph --quiet --no-summary --set 'shard_source.urls=http://127.0.0.1:$port/shards/$shard_range' ${pf[*]}"
extra=(-n C-nginx-no-delay "$cmd_n")
[ $have_prefetch = yes ] && extra+=(-n C-without-prefetch "$cmd_c0")
hyperfine --style basic --warmup 1 --runs "$runs" --export-json "$run/bc.json" -n B "$cmd_b" -n C "$cmd_c" "${extra[@]}" >&2
/usr/bin/python3 - "$run/a.json" "$run/bc.json" "$a_samples" "$samples" "$rtt" "$rate" "$(git rev-parse --short HEAD)" <<'PY'
import json, statistics, sys, datetime
a, bc, na, nb, rtt, rate, commit = sys.argv[1:]
med = {}
for f in (a, bc):
    for r in json.load(open(f))["results"]:
        med[r["command"]] = (statistics.median(r["times"]), len(r["times"]))
n = {"A": int(na)}
rates = {k: (n.get(k, int(nb)) / t, runs) for k, (t, runs) in med.items()}
print(f"commit {commit}, {datetime.date.today()}, RTT {rtt}, rate cap {rate}; samples/s = samples / wall time (start-up included), median")
for k in ("A", "B", "C", "C-nginx-no-delay", "C-without-prefetch"):
    if k in rates:
        r, runs = rates[k]
        print(f"  {k:19s} {r:12,.0f} samples/s  ({n.get(k, int(nb)):,} samples, median of {runs})")
ra, rb, rc = rates["A"][0], rates["B"][0], rates["C"][0]
print(f"  B/A = {rb / ra:.1f}   C/B = {rc / rb:.3f}   (the article: B/A = 1.112, C/B = 1.0; goal here: C/B >= 0.95)")
if "C-nginx-no-delay" in rates:
    print(f"  C / C-nginx-no-delay = {rc / rates['C-nginx-no-delay'][0]:.3f} (the delay's own cost once prefetch hides it)")
PY

# The client's own cost: user+sys CPU of the shardflow process (its rusage, /usr/bin/time; nginx and
# the proxy not included) per sample, B against C, in interleaved rounds (the order rotates each round).
echo "== CPU of the shardflow process: $runs interleaved rounds of B, C, C-nginx-no-delay" >&2
names=(B C C-nginx-no-delay) cmds=("$cmd_b" "$cmd_c" "$cmd_n")
: > "$run/cpu.txt"
for ((i = 0; i < runs; i++)); do
  for ((j = 0; j < 3; j++)); do
    k=$(( (i + j) % 3 ))
    eval "/usr/bin/time -f '%U %S %e' -o '$run/time' ${cmds[k]}" > /dev/null
    echo "${names[k]} $(cat "$run/time")" >> "$run/cpu.txt"
  done
done
/usr/bin/python3 - "$run/cpu.txt" "$samples" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    k, user, system, wall = line.split()
    runs.setdefault(k, []).append((float(user) + float(system), float(wall)))
n = int(sys.argv[2])
med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v), len(v)) for k, v in runs.items()}
print(f"shardflow process CPU (user+sys, rusage) per sample, medians of interleaved runs ({n:,} samples a run):")
for k in ("B", "C", "C-nginx-no-delay"):
    cpu, wall, count = med[k]
    print(f"  {k:19s} {cpu * 1e6 / n:8.2f} CPU-us/sample  ({cpu:.2f} CPU-s, {wall:.2f} s wall, median of {count})")
b, c = med["B"], med["C"]
print(f"  C/B: CPU per sample {c[0] / b[0]:.3f} (goal <= 1.05), wall samples/s {b[1] / c[1]:.3f} (these runs)")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores; other work on the machine skews every row)"
kill "$proxy_pid" 2>/dev/null; wait "$proxy_pid" 2>/dev/null || true; proxy_pid=""
cat "$run/proxy.err"
