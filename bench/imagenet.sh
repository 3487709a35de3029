#!/usr/bin/env bash
# Benchmark: the ImageNet-like pipeline (JPEG photographs -> random resized crop 224, flip -> uint8 HWC or
# normalised float32 CHW, batches of 64) against libjpeg-turbo's own `tjbench` decoding the same JPEGs in the
# same run. Whole `shardflow run` processes, interleaved rounds, medians; prints samples/s and the ratio to
# 2 x tjbench (tjbench decodes on one core; the machine has two) for each output type, with decode's
# defer_jpeg off (full decode, then crop) and on (only the crop's region decoded, at the smallest DCT scale);
# also the CPU time per sample (all threads, from the process's rusage), steadier than wall time on a shared
# machine, as a fraction of tjbench's per-core speed.
#   bench/imagenet.sh [--runs N] [--samples N]
# SF_BUILD names the build directory (default build-release). The photographs are made once (PIL) under
# data/bench/imagenet-q90-N: pieces cut from Debian's mate-backgrounds, 500 px long side, JPEG quality 90.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=5 samples=2048 per_shard=256 build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    *) echo "usage: bench/imagenet.sh [--runs N] [--samples N]" >&2; exit 2 ;;
  esac
done
tools/setup-debian.sh
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release -Dtests=false >/dev/null
ninja -C "$build" shardflow >/dev/null
case $build in /*) ;; *) build=$top/$build ;; esac

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
for defer in false true; do
  for dtype in uint8 float32; do
    layout=hwc norm=""
    [ $dtype = float32 ] && layout=chw norm="mean: [0.485, 0.456, 0.406]
    std: [0.229, 0.224, 0.225]"
    cat > "$run/$dtype-$defer.yaml" <<YAML
seed: 0
epochs: 1
threads: 2
stages:
  - type: shard_source
    urls: $data/imagenet-{000000..$last}.tar
  - type: tar_split
  - type: decode
    replicas: 2
    defer_jpeg: $defer
  - type: augment
    replicas: 2
    crop: random_resized
    size: 224
    flip: 0.5
    $norm
    layout: $layout
    dtype: $dtype
  - type: batch
    batch_size: 64
  - type: device_sink
YAML
  done
done
cat "$data"/*.tar > /dev/null # warm the page cache

/usr/bin/python3 - "$build/shardflow" "$run" "$data/jpg" "$samples" "$runs" <<'PY'
import glob, os, re, resource, statistics, subprocess, sys, time
sf, run, jpg, n, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
configs = [f"{d}-{x}" for d in ("uint8", "float32") for x in ("false", "true")]
files = sorted(glob.glob(os.path.join(jpg, "*.jpg")))[:16]

def tjbench():
    """Images/s of one core: tjbench's decompression Mpixels/s over 16 of the JPEGs, as time per image."""
    seconds = 0.0
    for f in files:
        out = subprocess.run(["tjbench", f, "-rgb", "-nowrite", "-benchtime", "0.2", "-warmup", "0.05", "-quiet"],
                             capture_output=True, text=True, check=True).stdout
        row = [l.split() for l in out.splitlines() if l.startswith("RGB")][-1]
        w, h, mpix = int(row[4]), int(row[5]), float(row[-1])
        seconds += w * h / (mpix * 1e6)
    return len(files) / seconds

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

rates = {c: [] for c in ["tjbench"] + configs}
cpu_per_sample = {c: [] for c in configs}
for r in range(runs):  # interleaved, the order rotated every round
    order = ["tjbench"] + configs
    order = order[r % len(order):] + order[:r % len(order)]
    for c in order:
        rates[c].append(tjbench() if c == "tjbench" else shardflow(c))
med = {c: statistics.median(v) for c, v in rates.items()}
ref = 2 * med["tjbench"]
spread = lambda v: (max(v) - min(v)) / statistics.median(v)
print(f"{n} samples (500 px long side, quality 90), rrc 224, medians of {runs} interleaved runs, "
      f"load {os.getloadavg()[0]:.1f}; spread = (max - min) / median of the runs")
print(f"tjbench, one core: {med['tjbench']:8.0f} images/s   2 x tjbench: {ref:8.0f}   "
      f"(spread {spread(rates['tjbench']):.0%})")
for c in configs:
    dtype, defer = c.split("-")
    name = f"{dtype} {'HWC' if dtype == 'uint8' else 'CHW'}, {'region decode' if defer == 'true' else 'full decode'}"
    ms = statistics.median(cpu_per_sample[c]) * 1e3
    print(f"{name:32s} {med[c]:8.0f} samples/s  {med[c] / ref:.2f} of 2 x tjbench  (spread {spread(rates[c]):.0%})  "
          f"CPU {ms:.2f} ms/sample = {1e3 / ms / med['tjbench']:.2f} of tjbench per core")
PY
