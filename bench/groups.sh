#!/usr/bin/env bash
# Benchmark: a decode-bound graph (ImageNet-sized JPEG photographs decoded, random-resized-cropped to 224,
# normalised float32 CHW, batched by 64) run (a) in one process with 2 threads, (b) with decode+augment in a
# group of 2 local worker processes (ipc://, results in shared-memory rings), (c) in a group served over
# tcp://127.0.0.1 with CURVE to two `shardflow worker` processes; samples/s (medians of interleaved runs), the ratio to (a), CPU per sample.
# decode has `replicas: 2` everywhere (in (a) it is what lets decoding use both cores).
#   bench/groups.sh [--runs N] [--samples N] [--dtype float32|uint8|split] [--wire-form auto|as_written|both]
#                   [--unit-samples N] [--perf]
# --dtype uint8 keeps augment's output as uint8 HWC (4x fewer bytes between processes);
# --dtype split: the group's augment crops to uint8 HWC, a second augment on the head normalises to float32 CHW
#   (written straight into the batch): the trainer gets what float32 gives, the sockets carry uint8;
# --wire-form: the groups' `wire_form` (auto: the plan may send the float32 augment's output as uint8 HWC crops
#   and normalise on the head, see docs/groups.md; as_written: float32 crosses the wire); both: (b) and (c) each way
#   in the same interleaved run, (b') and (c') with as_written;
# --perf records one run of each configuration with `perf record -g` (reports under data/bench/perf-groups).
# SF_BUILD names the build directory (default build-release), SF_PORT the tcp port (default: a free one).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=5 samples=5120 per_shard=256 dtype=float32 unit_samples="" perf=0 wire_form=auto
port=${SF_PORT:-} build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --wire-form) wire_form=$2; shift 2 ;;
    --unit-samples) unit_samples=$2; shift 2 ;;
    --perf) perf=1; shift ;;
    *) echo "usage: bench/groups.sh [--runs N] [--samples N] [--dtype float32|uint8|split] [--wire-form auto|as_written|both] [--unit-samples N] [--perf]" >&2
       exit 2 ;;
  esac
done
. bench/lib.sh
bench_build
sf=$build/shardflow

# The shards: photographs cut from Debian's mate-backgrounds (12 photos of 1280x1024 to 2560x1920) into
# ImageNet-like pieces: the long side 500 px, the short side 333..500, landscape 3 times in 4, each piece a
# random window of the photo (zoomed out up to the photo's size) resampled and re-encoded at JPEG quality 95
# (about 45 KiB each); key %07d, fields .jpg and .cls (the photo's index). Made once, by PIL.
data=$top/data/bench/photos-$samples
if [ ! -f "$data/.done" ]; then
  rm -rf "$data"; mkdir -p "$data"
  /usr/bin/python3 - "$data" "$samples" "$per_shard" <<'PY'
import glob, io, multiprocessing, random, sys, tarfile
from PIL import Image
out, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = sorted(glob.glob("/usr/share/backgrounds/mate/nature/*.jpg"))
if not src:
    sys.exit("groups.sh: no photographs in /usr/share/backgrounds/mate/nature (apt-get install mate-backgrounds)")

def shard(s):
    photos = [Image.open(p).convert("RGB") for p in src]
    rng = random.Random(s)
    with tarfile.open(f"{out}/photos-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(s * per, min(n, (s + 1) * per)):
            k = rng.randrange(len(photos))
            im = photos[k]
            short = rng.randint(333, 500)
            w, h = (500, short) if rng.random() < 0.75 else (short, 500)
            z = rng.uniform(1.0, min(im.width / w, im.height / h))
            cw, ch = int(w * z), int(h * z)
            x, y = rng.randrange(im.width - cw + 1), rng.randrange(im.height - ch + 1)
            piece = im.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BILINEAR)
            if rng.random() < 0.5:
                piece = piece.transpose(Image.FLIP_LEFT_RIGHT)
            b = io.BytesIO()
            piece.save(b, "JPEG", quality=95)
            for ext, data in (("jpg", b.getvalue()), ("cls", str(k).encode())):
                ti = tarfile.TarInfo(f"{i:07d}.{ext}")
                ti.size, ti.mtime = len(data), 0
                tf.addfile(ti, io.BytesIO(data))

with multiprocessing.Pool() as pool:
    pool.map(shard, range((n + per - 1) // per))
PY
  touch "$data/.done"
fi
last=$(printf '%06d' $(( (samples + per_shard - 1) / per_shard - 1 )))
urls="$data/photos-{000000..$last}.tar"

run=$(mktemp -d)
[ -n "${SF_BENCH_KEEP:-}" ] || trap 'rm -rf "$run"' EXIT

[ -n "$port" ] || port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Keys for (c): the head's pair and two workers' (their .pub files are the allow-list).
# A key file whose Z85 key holds '#' is not read back by this tree's engine/group/transport.c (it takes '#' for a
# comment, even inside the quotes), so such pairs are made again.
mkdir -p "$run/keys/allowed"
for name in head w1 w2; do
  for _ in $(seq 50); do
    rm -f "$run/keys/$name.key" "$run/keys/$name.pub"
    "$sf" keygen "$name" --dir "$run/keys" >/dev/null
    grep -q '#.*"$' <(grep -h -- '-key = ' "$run/keys/$name.key") || break
  done
done
cp "$run/keys/w1.pub" "$run/keys/w2.pub" "$run/keys/allowed/"

# One graph, three placements of decode+augment.
layout=chw out_dtype=$dtype
[ "$dtype" = uint8 ] && layout=hwc
norm="mean: [0.485, 0.456, 0.406]
    std: [0.229, 0.224, 0.225]"
[ "$dtype" = uint8 ] && norm=""
normalize=""
if [ "$dtype" = split ]; then
  layout=hwc out_dtype=uint8 norm=""
  normalize="  - type: augment
    name: normalize
    mean: [0.485, 0.456, 0.406]
    std: [0.229, 0.224, 0.225]
    layout: chw
    dtype: float32"
fi
graph() { # graph NAME GROUP-OPTIONS (empty: no group)
  local group_line="" member=""
  if [ -n "$2" ]; then
    group_line="groups:
  decoders: {$2${unit_samples:+, unit_samples: $unit_samples}}"
    member="group: decoders"
  fi
  cat > "$run/$1.yaml" <<YAML
seed: 0
epochs: 1
threads: 2
$group_line
stages:
  - type: shard_source
    urls: $urls
  - type: tar_split
  - type: decode
    replicas: 2
    $member
  - type: augment
    $member
    crop: random_resized
    size: 224
    flip: 0.5
    $norm
    layout: $layout
    dtype: $out_dtype
$normalize
  - type: batch
    batch_size: 64
  - type: device_sink
YAML
}
wf=""
[ "$wire_form" = as_written ] && wf=", wire_form: as_written"
cfgs="a b c"
graph a ""
graph b "processes: 2$wf"
graph c "listen: 'tcp://127.0.0.1:$port', secret_key: '$run/keys/head.key', allowed_keys: '$run/keys/allowed'$wf"
if [ "$wire_form" = both ]; then # (b') and (c'): the same groups with the augment's float32 sent as written
  cfgs="a b c bw cw"
  graph bw "processes: 2, wire_form: as_written"
  graph cw "listen: 'tcp://127.0.0.1:$port', secret_key: '$run/keys/head.key', allowed_keys: '$run/keys/allowed', wire_form: as_written"
fi
cmd_of() { # cmd_of CFG: the command line of a configuration, into the array cmd
  case $1 in
    c|cw) cmd=("$run/c.sh" "$run/$1.yaml") ;;
    *) cmd=("$sf" run "$run/$1.yaml" --quiet --no-summary) ;;
  esac
}
cat > "$run/c.sh" <<SH
#!/usr/bin/env bash
# (c): two workers connect over tcp:// with CURVE; the head's run ends them (BYE). c.sh GRAPH [RUN-OPTIONS]
graph=\$1
shift
pids=()
for w in w1 w2; do
  "$sf" worker --connect tcp://127.0.0.1:$port --key "$run/keys/\$w.key" --server-key "$run/keys/head.pub" \
    --name "\$w" --quiet --connect-timeout 20 &
  pids+=(\$!)
done
if ! "$sf" run "\$graph" --quiet --no-summary "\$@"; then
  kill "\${pids[@]}" 2>/dev/null
  wait
  exit 1
fi
wait
SH
chmod +x "$run/c.sh"

# One checked run each first: every sample arrives, and the first batches are the same in all three.
for cfg in $cfgs; do
  cmd_of $cfg
  mkdir -p "$run/npy-$cfg"
  "${cmd[@]}" --set device_sink.npy_dir="$run/npy-$cfg" --set device_sink.npy_batches=3 > "$run/$cfg.log" 2>&1 ||
    { cat "$run/$cfg.log" >&2; echo "groups.sh: configuration ($cfg) failed" >&2; exit 1; }
  grep -q "Replica Train Samples=$samples " "$run/$cfg.log" ||
    { cat "$run/$cfg.log" >&2; echo "groups.sh: ($cfg) did not report $samples samples" >&2; exit 1; }
done
for cfg in ${cfgs#a }; do
  diff -rq "$run/npy-a" "$run/npy-$cfg" >&2 ||
    { echo "groups.sh: the batches of ($cfg) differ from (a)'s" >&2; exit 1; }
done
rm -rf "$run"/npy-?
# (b)'s local processes hand results over in shared memory (the group's shm_ring); what did not fit went by socket.
sed -n 's/.*results: \([0-9]*\) bytes through shared memory, \([0-9]*\) through the socket.*/(b) result bytes: \1 through shared memory, \2 through the socket/p' "$run/b.log" >&2

bench_page_cache "$data"/*.tar # the page cache holds the shards for every run
# Timed runs, interleaved (a b c, b c a, c a b, ...) so that load from anything else on the machine falls on
# every configuration alike; one round first as warm-up. Wall time and the CPU time of the whole process
# tree (wait4 of the command; the workers are its descendants) per run.
/usr/bin/python3 - "$run/times.json" "$runs" "$sf" "$run" $cfgs <<'PY' >&2
import json, os, resource, subprocess, sys, time
out, runs, sf, run, cfgs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
cmds = {k: [f"{run}/c.sh", f"{run}/{k}.yaml"] if k in ("c", "cw") else
        [sf, "run", f"{run}/{k}.yaml", "--quiet", "--no-summary"] for k in cfgs}
res = {k: {"times": [], "cpu": []} for k in cmds}
for r in range(runs + 1):
    order = cfgs[r % len(cfgs):] + cfgs[:r % len(cfgs)]
    for k in order:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        subprocess.run(cmds[k], check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if r > 0:
            res[k]["times"].append(wall)
            res[k]["cpu"].append(cpu)
        print(f"  round {r}{' (warm-up)' if r == 0 else ''} ({k}): {wall:6.2f} s wall, {cpu:6.2f} s CPU", flush=True)
json.dump(res, open(out, "w"))
PY

if [ "$perf" = 1 ]; then
  out=$top/data/bench/perf-groups
  mkdir -p "$out"
  for cfg in $cfgs; do
    cmd_of $cfg
    perf record -q -g -o "$out/$cfg.data" -- "${cmd[@]}" >/dev/null 2>&1
    perf report -i "$out/$cfg.data" --no-children --sort comm,dso,sym --stdio 2>/dev/null | head -80 > "$out/$cfg.txt"
  done
  echo "perf reports: $out/{${cfgs// /,}}.txt" >&2
fi

/usr/bin/python3 - "$run/times.json" "$samples" "$dtype" "$(nproc)" "$wire_form" <<'PY'
import json, statistics, sys
res = json.load(open(sys.argv[1]))
n, dtype, cpus, wire_form = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
wall = {k: statistics.median(v["times"]) for k, v in res.items()}
cpu = {k: statistics.median(v["cpu"]) for k, v in res.items()}
names = {"a": "(a) one process, 2 threads",
         "b": "(b) group: 2 local processes, ipc://",
         "c": "(c) group: 2 workers, tcp:// + CURVE",
         "bw": "(b') (b), wire_form: as_written",
         "cw": "(c') (c), wire_form: as_written"}
out = {"float32": "float32 CHW normalised", "uint8": "uint8 HWC",
       "split": "uint8 HWC in the group, normalised to float32 CHW on the head"}[dtype]
print(f"{n} JPEG photographs (~500x416, q95) -> random_resized 224, {out}, batches of 64; "
      f"{cpus} CPUs; medians of {len(res['a']['times'])} interleaved runs; groups' wire_form {wire_form}")
print(f"{'configuration':40} {'samples/s':>10} {'of (a)':>7} {'CPU ms/sample':>14} {'cores busy':>11}")
for k in res:
    rate = n / wall[k]
    print(f"{names[k]:40} {rate:10,.0f} {rate / (n / wall['a']):7.3f} {1000 * cpu[k] / n:14.2f} {cpu[k] / wall[k]:11.2f}")
PY
