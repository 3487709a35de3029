#!/usr/bin/env bash
# Benchmark: WebP and AVIF decode per core, shardflow's decode stage against the libraries' own command-line
# decoders on the same images: `dwebp` (libwebp) and `avifdec` (libavif with dav1d, one thread). Each side is
# measured as time per image on one core, and reported as a ratio (above 1: shardflow decodes faster):
# - shardflow: `shardflow run` of shard_source -> tar_split -> decode (one replica) -> batch -> device_sink over
#   the images in one shard, its CPU time (every thread, from the process's rusage) per image: the whole
#   pipeline is charged to decode;
# - the tools: one process per image, decoding without writing (`dwebp FILE`: decode to RGB(A) in memory;
#   `avifdec --info FILE`: the AV1 decode to YUV, without the conversion to RGB that shardflow does), their
#   CPU time per image (from rusage, as for shardflow: steadier than wall time on a shared machine) less the
#   same tool's on an 8x8 image of the format (the cost of starting the process).
# Interleaved rounds; the ratio is taken within each round and the median over the rounds is printed.
#   bench/webp_avif.sh [--runs N] [--images N]
# SF_BUILD names the build directory (default build-release). The images are made once under
# data/bench/webp-avif-N: 1024x768 pieces cut from Debian's mate-backgrounds photographs, encoded by cwebp
# (-q 80) and avifenc (-s 6, quantizer 24..32, 4:2:0) (Debian's webp and libavif-bin).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=5 images=48 build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    *) echo "usage: bench/webp_avif.sh [--runs N] [--images N]" >&2; exit 2 ;;
  esac
done
. bench/lib.sh
bench_build

data=$top/data/bench/webp-avif-$images
if [ ! -f "$data/.done" ]; then
  rm -rf "$data"; mkdir -p "$data/png" "$data/webp" "$data/avif"
  /usr/bin/python3 - "$data" "$images" <<'PY'
import glob, random, sys
from PIL import Image
out, n = sys.argv[1], int(sys.argv[2])
src = sorted(glob.glob("/usr/share/backgrounds/mate/nature/*.jpg"))
if not src:
    sys.exit("webp_avif.sh: no photographs in /usr/share/backgrounds/mate/nature (apt-get install mate-backgrounds)")
rng = random.Random(0)
for i in range(n):
    im = Image.open(src[i % len(src)]).convert("RGB")
    z = rng.uniform(1.0, min(im.width / 1024, im.height / 768))
    cw, ch = int(1024 * z), int(768 * z)
    x, y = rng.randrange(im.width - cw + 1), rng.randrange(im.height - ch + 1)
    im.crop((x, y, x + cw, y + ch)).resize((1024, 768), Image.BICUBIC).save(f"{out}/png/{i:07d}.png")
Image.new("RGB", (8, 8), (90, 120, 150)).save(f"{out}/png/tiny.png")
PY
  for png in "$data"/png/*.png; do
    name=$(basename "$png" .png)
    cwebp -quiet -q 80 "$png" -o "$data/webp/$name.webp"
    avifenc -s 6 --min 24 --max 32 -y 420 -j 1 "$png" "$data/avif/$name.avif" >/dev/null
  done
  /usr/bin/python3 - "$data" <<'PY'
import glob, io, os, sys, tarfile
d = sys.argv[1]
for fmt in ("webp", "avif"):
    with tarfile.open(f"{d}/{fmt}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for f in sorted(glob.glob(f"{d}/{fmt}/0*.{fmt}")):
            data = open(f, "rb").read()
            ti = tarfile.TarInfo(os.path.basename(f))
            ti.size, ti.mtime = len(data), 0
            tf.addfile(ti, io.BytesIO(data))
PY
  touch "$data/.done"
fi

run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
for fmt in webp avif; do
  cat > "$run/$fmt.yaml" <<YAML
seed: 0
epochs: 1
stages:
  - type: shard_source
    urls: $data/$fmt.tar
  - type: tar_split
  - type: decode
    replicas: 1
  - type: batch
    batch_size: 16
  - type: device_sink
YAML
done
cat "$data"/*.tar > /dev/null # warm the page cache

/usr/bin/python3 - "$build/shardflow" "$run" "$data" "$images" "$runs" <<'PY'
import glob, os, resource, statistics, subprocess, sys
sf, run, data, n, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
tools = {"webp": lambda f: ["dwebp", f], "avif": lambda f: ["avifdec", "-c", "dav1d", "-j", "1", "--info", f]}

def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def ours(fmt):
    """CPU seconds per image of a shardflow run over the shard."""
    c = cpu()
    subprocess.run([sf, "run", os.path.join(run, fmt + ".yaml"), "--quiet", "--no-summary"], check=True,
                   stdout=subprocess.DEVNULL)
    return (cpu() - c) / n

def tool(fmt):
    """CPU seconds per image of the tool, less its CPU time on the 8x8 image (process start, file read)."""
    def each(files, repeat=1):
        c = cpu()
        for _ in range(repeat):
            for f in files:
                subprocess.run(tools[fmt](f), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return (cpu() - c) / (len(files) * repeat)
    start = each([f"{data}/{fmt}/tiny.{fmt}"], repeat=16)
    return each(sorted(glob.glob(f"{data}/{fmt}/0*.{fmt}"))) - start

times = {(fmt, side): [] for fmt in tools for side in ("ours", "tool")}
for r in range(runs):  # interleaved, the order rotated every round
    order = [(fmt, side) for fmt in tools for side in ("ours", "tool")]
    order = order[r % len(order):] + order[:r % len(order)]
    for fmt, side in order:
        times[fmt, side].append(ours(fmt) if side == "ours" else tool(fmt))
print(f"{n} images of 1024x768, medians of {runs} interleaved rounds, load {os.getloadavg()[0]:.1f}; "
      "time per image on one core")
names = {"webp": "dwebp", "avif": "avifdec (dav1d, 1 thread)"}
for fmt in tools:
    o, t = statistics.median(times[fmt, "ours"]), statistics.median(times[fmt, "tool"])
    ratio = statistics.median(b / a for a, b in zip(times[fmt, "ours"], times[fmt, "tool"]))
    spread = max(times[fmt, "ours"]) / min(times[fmt, "ours"]) - 1
    print(f"{fmt:5s} shardflow {o * 1e3:6.2f} ms CPU/image (spread {spread:.0%})   {names[fmt]:26s} "
          f"{t * 1e3:6.2f} ms CPU/image   ratio {ratio:.2f} of {names[fmt].split()[0]} per core")
PY
