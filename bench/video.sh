#!/usr/bin/env bash
# Benchmark: the video plugin's clips against FFmpeg's own `ffmpeg -benchmark` decoding the same videos.
# Videos: V H.264 MP4s made once by Debian's ffmpeg from Debian's photographs (a window panning over one; 320x240,
# 25 fps, 4 s = 100 frames, a keyframe every 25 frames, 2 B-frames, an AAC track), each stored `--copies` times in
# one shard. Whole `shardflow run` processes, interleaved rounds, medians.
#   bench/video.sh [--runs N] [--videos N] [--copies N]
# Measured:
# - ffmpeg: `ffmpeg -benchmark -threads 1 -i V.mp4 -an -pix_fmt rgb24 -f null -` per video (every frame decoded and
#   converted to RGB, as the plugin does), its user+system CPU time net of a 1-frame run's (process start, probing):
#   frames per CPU-second, and whole videos per CPU-second;
# - shardflow, per graph (uniform 8 frames; random_clip 16 frames stride 2; that + augment's random resized crop 112
#   to float32 [3,16,112,112]; that + audio: true): clips/s (wall), clips per CPU-second (all threads, from the
#   process's rusage: "per core", steadier than wall time on a shared machine), frames the decoder produced per
#   clip (the counter frames_decoded: what seeking to the keyframe before the clip leaves to decode), and two
#   ratios: clips per CPU-second / ffmpeg's whole videos per CPU-second (a clip against decoding its whole video,
#   what a loader that decodes everything pays), and decoded frames per CPU-second / ffmpeg's frames per
#   CPU-second (the cost of a decoded frame, engine included, against ffmpeg's: 1.00 = as fast);
# - memory per clip in flight: the Python binding runs the random_clip graph for epochs until stopped and stops
#   consuming after one batch, so every queue fills; the peak RSS with queue_size 64 minus that with queue_size 8
#   (queue_bytes 0: items only), divided by the difference in clips in flight (clips `video` made, less the 8
#   consumed): bytes per clip in flight (its clip, its share of the members queued before `video`, the engine's
#   overhead), next to the clip's T x H x W x 3 bytes.
# SF_BUILD names the build directory (default build-release).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
runs=5 videos=32 copies=4 build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --videos) videos=$2; shift 2 ;;
    --copies) copies=$2; shift 2 ;;
    *) echo "usage: bench/video.sh [--runs N] [--videos N] [--copies N]" >&2; exit 2 ;;
  esac
done
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release -Dtests=false -Dvideo_plugin=enabled >/dev/null
ninja -C "$build" >/dev/null
case $build in /*) ;; *) build=$top/$build ;; esac
[ -f "$build/plugins/video/video.so" ] || { echo "video.sh: $build has no video plugin (FFmpeg's -dev packages)" >&2; exit 1; }

data=$top/data/bench/video-$videos
if [ ! -f "$data/.done" ]; then
  rm -rf "$data"; mkdir -p "$data"
  photos=(/usr/share/backgrounds/mate/nature/*.jpg)
  [ -f "${photos[0]}" ] || { echo "video.sh: no photographs (apt-get install mate-backgrounds)" >&2; exit 1; }
  for ((i = 0; i < videos; i++)); do
    photo=${photos[$((i % ${#photos[@]}))]}
    ffmpeg -nostdin -loglevel error -y -loop 1 -framerate 25 -i "$photo" \
      -f lavfi -i "sine=frequency=$((300 + 20 * i)):sample_rate=44100" -map 0:v -map 1:a \
      -vf "scale=960:-2,crop=320:240:'mod(n*$((3 + i % 5)),600)':'mod(n*2,200)'" -frames:v 100 -shortest \
      -c:v libx264 -preset medium -pix_fmt yuv420p -g 25 -keyint_min 25 -sc_threshold 0 -bf 2 \
      -c:a aac -b:a 96k "$data/$(printf '%04d' "$i").mp4"
  done
  /usr/bin/python3 - "$data" "$copies" <<'PY'
import glob, io, os, sys, tarfile
data, copies = sys.argv[1], int(sys.argv[2])
with tarfile.open(os.path.join(data, "clips.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
    for c in range(copies):
        for path in sorted(glob.glob(os.path.join(data, "*.mp4"))):
            b = open(path, "rb").read()
            ti = tarfile.TarInfo(f"c{c}-{os.path.basename(path)}")
            ti.size, ti.mtime = len(b), 0
            tf.addfile(ti, io.BytesIO(b))
PY
  touch "$data/.done"
fi

run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
# graph VIDEO_OPTIONS [AUGMENT] [GRAPH_OPTIONS]: shard_source, tar_split, video, (augment), batch of 8, device_sink.
graph() {
  cat <<YAML
plugins: [video]
seed: 0
epochs: 1${3-}
stages:
  - type: shard_source
    urls: $data/clips.tar
  - type: tar_split
  - type: video
    fields: [mp4]$1${2-}
  - type: batch
    batch_size: 8
  - type: device_sink
YAML
}
clip="
    frames: 16
    sampling: random_clip
    stride: 2"
augment="
  - type: augment
    crop: random_resized
    size: 112
    flip: 0.5
    mean: [0.43216, 0.394666, 0.37645]
    std: [0.22803, 0.22145, 0.216989]
    layout: cthw"
graph "
    frames: 8" > "$run/uniform8.yaml"
graph "$clip" > "$run/clip16.yaml"
graph "$clip" "$augment" > "$run/clip16-augment.yaml"
graph "$clip
    audio: true" > "$run/clip16-audio.yaml"
for q in 8 64; do
  graph "$clip" "" "
queue_size: $q
queue_bytes: 0" > "$run/memory-$q.yaml"
done
cat "$data"/clips.tar > /dev/null # warm the page cache

SHARDFLOW_PLUGIN_PATH=$build/plugins/video SHARDFLOW_LIB=$build/libshardflow.so PYTHONPATH=$top/python \
/usr/bin/python3 - "$build/shardflow" "$run" "$data" "$runs" "$videos" "$copies" <<'PY'
import glob, json, os, re, resource, statistics, subprocess, sys, time
sf, run, data, runs, videos, copies = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
clips = videos * copies
configs = ["uniform8", "clip16", "clip16-augment", "clip16-audio"]
files = sorted(glob.glob(os.path.join(data, "*.mp4")))

def ffmpeg_cpu(path, frames=None):
    """user + system CPU seconds that ffmpeg -benchmark reports for decoding path to RGB (one thread)."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-benchmark", "-threads", "1", "-i", path, "-an",
           "-pix_fmt", "rgb24"] + (["-frames:v", str(frames)] if frames else []) + ["-f", "null", "-"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"bench: utime=([\d.]+)s stime=([\d.]+)s", out)
    return float(m.group(1)) + float(m.group(2))

def ffmpeg():
    """(frames per CPU-second, whole videos per CPU-second) over every video, net of the 1-frame run's cost."""
    net = sum(max(ffmpeg_cpu(f) - ffmpeg_cpu(f, 1), 1e-6) for f in files)
    return 99 * len(files) / net, len(files) / net

def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def shardflow(cfg):
    """(clips/s, clips per CPU-second, decoded frames per clip) of one whole run."""
    stats = os.path.join(run, cfg + ".jsonl")
    t, c = time.monotonic(), cpu()
    subprocess.run([sf, "run", os.path.join(run, cfg + ".yaml"), "--quiet", "--no-summary", "--stats-json", stats],
                   check=True, stdout=subprocess.DEVNULL)
    wall, used = time.monotonic() - t, cpu() - c
    final = [json.loads(line) for line in open(stats)][-1]
    node = next(n for n in final["nodes"] if n["name"] == "video")
    return clips / wall, clips / used, node["counters"]["frames_decoded"] / clips

res = {c: [] for c in ["ffmpeg"] + configs}
for r in range(runs):  # interleaved, the order rotated every round
    order = ["ffmpeg"] + configs
    for c in order[r % len(order):] + order[:r % len(order)]:
        res[c].append(ffmpeg() if c == "ffmpeg" else shardflow(c))
med = lambda c, k: statistics.median(x[k] for x in res[c])
ff_frames, ff_videos = med("ffmpeg", 0), med("ffmpeg", 1)
print(f"{clips} clips a run ({videos} H.264 MP4s of 100 frames, 320x240, keyframe every 25, x{copies}); medians of "
      f"{runs} interleaved runs; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
print(f"ffmpeg -benchmark -threads 1, to rgb24: {ff_frames:8.0f} frames per CPU-second = {ff_videos:6.1f} whole "
      f"videos per CPU-second")
print(f"{'graph':16s} {'clips/s':>8s} {'clips/CPU-s':>11s} {'frames/clip':>11s} {'vs whole video':>14s} "
      f"{'per frame vs ffmpeg':>19s}")
for c in configs:
    rate, per_cpu, frames = med(c, 0), med(c, 1), med(c, 2)
    print(f"{c:16s} {rate:8.1f} {per_cpu:11.1f} {frames:11.1f} {per_cpu / ff_videos:14.2f} "
          f"{per_cpu * frames / ff_frames:19.2f}")

# Memory per clip in flight: every queue full (epochs until stopped, the consumer stops after one batch), peak RSS
# at two queue sizes,
# each in a process of its own.
FILL = r"""
import os, re, sys, time
import shardflow
status = lambda key: int(re.search(key + r":\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
base = status("VmRSS")
p = shardflow.Pipeline(sys.argv[1], epochs=0, output="numpy")  # epochs until stopped: the queues fill
it = iter(p)
next(it)
last, stable, deadline = 0, 0, time.monotonic() + 60
while stable < 4 and time.monotonic() < deadline:  # until the peak stops growing for 2 s
    time.sleep(0.5)
    now = status("VmHWM")
    stable, last = (stable + 1 if now == last else 0), now
clips = next(n for n in p.stats() if n["name"] == "video")["items"] - 8  # all but the batch consumed (dropped)
p.close()
print(last - base, clips)
"""

def rss_full(q):
    out = subprocess.run([sys.executable, "-c", FILL, os.path.join(run, f"memory-{q}.yaml")], capture_output=True,
                         text=True, check=True).stdout
    peak, clips = out.split()[-2:]
    return int(peak), int(clips)

(small, n_small), (big, n_big) = rss_full(8), rss_full(64)
per = (big - small) / max(n_big - n_small, 1)
clip_bytes = 16 * 240 * 320 * 3
member = statistics.mean(os.path.getsize(f) for f in files)
print(f"memory: peak RSS {small / 2**20:.0f} MiB with {n_small} clips in flight (queue_size 8), {big / 2**20:.0f} "
      f"MiB with {n_big} (64): {per / 2**20:.2f} MiB per clip in flight (a clip is {clip_bytes / 2**20:.2f} MiB, "
      f"a member {member / 2**20:.2f} MiB): {per / clip_bytes:.2f} x the clip's bytes")
PY
