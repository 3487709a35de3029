#!/usr/bin/env bash
# Benchmark: the ImageNet-like pipeline (JPEG photographs -> random resized crop 224, flip -> uint8 HWC or
# normalised float32 CHW, batches of 64) against libjpeg-turbo's own `tjbench` decoding the same JPEGs in the
# same run. Whole `shardflow run` processes, interleaved rounds, medians. The reference is N tjbench processes
# at once, one per CPU this shell may use (`nproc`: 2 on the project's machine), their images/s summed: they
# share the caches and the memory as the pipeline's threads do. N x one process's rate is printed too.
# Two parts, measured in the same rounds:
# - per output type, hand-tuned graphs (decode and augment at `replicas: N`) with decode's defer_jpeg off
#   (full decode, then crop) and on (only the crop's region decoded, at the smallest DCT scale): samples/s,
#   the ratio to N tjbench, and the CPU time per sample (all threads, from the process's rusage), steadier
#   than wall time on a shared machine, as a fraction of tjbench's per-core speed;
# - for float32 CHW, the same pipeline "as a user writes it" (shard_source, tar_split, decode, augment,
#   batch, device_sink: no replicas, no threads, no decode hints), "mis-tuned" (that graph with the
#   graph-level `queue_size: 2` and tar_split's `prefetch: 0`) and "hand-tuned" (decode {defer_jpeg: true,
#   replicas: N}, augment {replicas: N}: the float32 region-decode graph above), with the ratios
#   user / hand-tuned, user / N tjbench, hand-tuned / N tjbench and mis-tuned / hand-tuned, each the
#   median over the rounds of the ratio within a round.
#   bench/imagenet.sh [--runs N] [--samples N] [--epochs N]
# --epochs N (default 1): each shardflow run reads the samples N times (one process, N epochs), so that its
# start (loading the binary and its libraries, about 15 ms here), its first fill and its last drain weigh 1/N
# as much; tjbench's figure is a steady state (it times a loop after a warm-up).
# SF_BUILD names the build directory (default build-release). The photographs are made once (PIL) under
# data/bench/imagenet-q90-N: pieces cut from Debian's mate-backgrounds, 500 px long side, JPEG quality 90.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=5 samples=2048 epochs=1 per_shard=256 build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    *) echo "usage: bench/imagenet.sh [--runs N] [--samples N] [--epochs N]" >&2; exit 2 ;;
  esac
done
. bench/lib.sh
bench_build

data=$top/data/bench/imagenet-q90-$samples
if [ ! -f "$data/.done" ]; then
  rm -rf "$data"; mkdir -p "$data/jpg"
  /usr/bin/python3 - "$data" "$samples" "$per_shard" <<'PY'
import glob, io, multiprocessing, random, sys, tarfile
from PIL import Image
out, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = sorted(glob.glob("/usr/share/backgrounds/mate/nature/*.jpg"))
if not src:
    sys.exit("imagenet.sh: no photographs in /usr/share/backgrounds/mate/nature (apt-get install mate-backgrounds)")

def shard(s):
    """Pieces as ImageNet has them: long side 500, short 333..500, a random window of a photo resampled."""
    photos = [Image.open(p).convert("RGB") for p in src]
    rng = random.Random(s)
    with tarfile.open(f"{out}/imagenet-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(s * per, min(n, (s + 1) * per)):
            k = rng.randrange(len(photos))
            im = photos[k]
            short = rng.randint(333, 500)
            w, h = (500, short) if rng.random() < 0.75 else (short, 500)
            z = rng.uniform(1.0, min(im.width / w, im.height / h))
            cw, ch = int(w * z), int(h * z)
            x, y = rng.randrange(im.width - cw + 1), rng.randrange(im.height - ch + 1)
            b = io.BytesIO()
            im.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BICUBIC).save(b, "JPEG", quality=90)
            if i < 64:  # tjbench's sample of the same JPEGs
                with open(f"{out}/jpg/{i:07d}.jpg", "wb") as f:
                    f.write(b.getvalue())
            for ext, data in (("jpg", b.getvalue()), ("cls", str(k).encode())):
                ti = tarfile.TarInfo(f"{i:07d}.{ext}")
                ti.size, ti.mtime = len(data), 0
                tf.addfile(ti, io.BytesIO(data))

with multiprocessing.Pool() as pool:
    pool.map(shard, range((n + per - 1) // per))
PY
  touch "$data/.done"
fi

run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
last=$(printf '%06d' $(( (samples + per_shard - 1) / per_shard - 1 )))
ncpu=$(nproc)
# graph PREFIX DECODE_OPTIONS AUGMENT_OPTIONS DTYPE [TAR_SPLIT_OPTIONS]: the pipeline, with the options
# given (each a YAML block at a stage's indentation, or empty) and nothing else written.
graph() {
  local layout=hwc norm=""
  [ "$4" = float32 ] && layout=chw norm="
    mean: [0.485, 0.456, 0.406]
    std: [0.229, 0.224, 0.225]"
  cat <<YAML
seed: 0
epochs: $epochs$1
stages:
  - type: shard_source
    urls: $data/imagenet-{000000..$last}.tar
  - type: tar_split${5-}
  - type: decode$2
  - type: augment$3
    crop: random_resized
    size: 224
    flip: 0.5$norm
    layout: $layout
    dtype: $4
  - type: batch
    batch_size: 64
  - type: device_sink
YAML
}
for defer in false true; do
  for dtype in uint8 float32; do
    graph "" "
    replicas: $ncpu
    defer_jpeg: $defer" "
    replicas: $ncpu" $dtype > "$run/$dtype-$defer.yaml"
  done
done
# As a user writes it: whatever the engine picks by itself (replicas, threads, JPEG deferral) is measured.
graph "" "" "" float32 > "$run/user.yaml"
# The same with augment's opt-in `exact: false` (DCT scaling, fast IDCT, plain chroma upsampling).
graph "" "" "
    exact: false" float32 > "$run/user-inexact.yaml"
# Mis-tuned: small queues, one shard at a time (prefetch counts for remote shards only: local files are
# read as split), nothing else pinned.
graph "
queue_size: 2" "" "" float32 "
    prefetch: 0" > "$run/mistuned.yaml"
bench_page_cache "$data"/*.tar

/usr/bin/python3 - "$build/shardflow" "$run" "$data/jpg" "$((samples * epochs))" "$runs" "$ncpu" "$epochs" <<'PY'
import glob, os, re, resource, statistics, subprocess, sys, time
sf, run, jpg, n, runs, ncpu, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), \
    int(sys.argv[6]), int(sys.argv[7])
configs = [f"{d}-{x}" for d in ("uint8", "float32") for x in ("false", "true")] + ["user", "user-inexact",
                                                                                    "mistuned"]
# All 64 JPEGs kept for tjbench: their mean size is within 2% of the 2048 the pipeline reads (the first 16 alone
# were 11% larger in bytes, which slowed the reference by as much as the ratio's last points).
files = sorted(glob.glob(os.path.join(jpg, "*.jpg")))

def tjbench_process(shift):
    """Starts one tjbench process over the JPEGs (the list rotated by shift), one after another."""
    order = files[shift:] + files[:shift]
    script = "; ".join(f"tjbench {f} -rgb -nowrite -benchtime 0.05 -warmup 0.02 -quiet" for f in order)
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)

def images_per_second(out):
    """tjbench's decompression Mpixels/s of each JPEG, as images/s over them all."""
    seconds = 0.0
    for row in (l.split() for l in out.splitlines() if l.startswith("RGB")):
        w, h, mpix = int(row[4]), int(row[5]), float(row[-1])
        seconds += w * h / (mpix * 1e6)
    return len(files) / seconds

def tjbench(processes):
    """Images/s of `processes` tjbench processes running at once (one per core), summed."""
    procs = [tjbench_process(k * len(files) // processes) for k in range(processes)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("imagenet.sh: tjbench failed")
    return sum(images_per_second(o) for o in outs)

def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def shardflow(cfg):
    """samples/s of a whole run; its CPU seconds per sample go to cpu_per_sample[cfg]."""
    t, c = time.monotonic(), cpu()
    subprocess.run([sf, "run", os.path.join(run, cfg + ".yaml"), "--quiet", "--no-summary"], check=True,
                   stdout=subprocess.DEVNULL)
    cpu_per_sample[cfg].append((cpu() - c) / n)
    return n / (time.monotonic() - t)

rates = {c: [] for c in ["tjbench", "tjbench-all"] + configs}
cpu_per_sample = {c: [] for c in configs}
for r in range(runs):  # interleaved, the order rotated every round
    order = ["tjbench", "tjbench-all"] + configs
    order = order[r % len(order):] + order[:r % len(order)]
    for c in order:
        rates[c].append(tjbench(1) if c == "tjbench" else tjbench(ncpu) if c == "tjbench-all" else shardflow(c))
med = {c: statistics.median(v) for c, v in rates.items()}
# The reference: one tjbench process per core, all at once (they share the caches and memory, as the
# pipeline's threads do); N x one process's rate is printed too.
ref = med["tjbench-all"]
tj = f"{ncpu} tjbench"
spread = lambda v: (max(v) - min(v)) / statistics.median(v)
print(f"{n} samples a run ({n // epochs} x {epochs} epoch(s); 500 px long side, quality 90), rrc 224, medians of {runs} interleaved runs, "
      f"load {os.getloadavg()[0]:.1f}; spread = (max - min) / median of the runs")
print(f"tjbench, one process: {med['tjbench']:8.0f} images/s   {ncpu} x that: {ncpu * med['tjbench']:8.0f}   "
      f"(spread {spread(rates['tjbench']):.0%})")
print(f"{tj} processes at once: {ref:8.0f} images/s in all (spread {spread(rates['tjbench-all']):.0%}): "
      f"the reference below")

def line(c, name):
    ms = statistics.median(cpu_per_sample[c]) * 1e3
    print(f"{name:37s} {med[c]:8.0f} samples/s  {med[c] / ref:.2f} of {tj}  (spread {spread(rates[c]):.0%})  "
          f"CPU {ms:.2f} ms/sample = {1e3 / ms / med['tjbench']:.2f} of tjbench per core")

print(f"hand-tuned (decode and augment at replicas: {ncpu}):")
for c in configs[:4]:
    dtype, defer = c.split("-")
    line(c, f"{dtype} {'HWC' if dtype == 'uint8' else 'CHW'}, {'region decode' if defer == 'true' else 'full decode'}")
hand = "float32-true"
print(f"float32 CHW as written (hand-tuned = decode {{defer_jpeg: true, replicas: {ncpu}}}, "
      f"augment {{replicas: {ncpu}}}):")
line("user", "as a user writes it")
line("user-inexact", "as written + augment exact: false")
line("mistuned", "mis-tuned (queue_size 2, prefetch 0)")
line(hand, "hand-tuned")
# Each ratio within a round (the two runs a few seconds apart), then the median over the rounds: steadier
# than a ratio of medians when the machine's speed drifts between rounds.
within = lambda a, b, k=1: statistics.median(x / (k * y) for x, y in zip(rates[a], rates[b]))
print("ratios, medians over the rounds of the ratio within a round:")
for name, value in ((f"as written / hand-tuned", within("user", hand)),
                    (f"as written / {tj}", within("user", "tjbench-all")),
                    (f"as written / {ncpu} x one tjbench", within("user", "tjbench", ncpu)),
                    (f"as written, exact: false / {tj}", within("user-inexact", "tjbench-all")),
                    (f"hand-tuned / {tj}", within(hand, "tjbench-all")),
                    (f"mis-tuned / hand-tuned", within("mistuned", hand))):
    print(f"  {name:35s} {value:.2f}")
PY
