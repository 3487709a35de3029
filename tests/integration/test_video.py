#!/usr/bin/python3
"""Integration test of the video plugin's `video` stage, run by the CLI in a graph (`plugins: [video]`, found on
SHARDFLOW_PLUGIN_PATH): shard_source, tar_split, video, batch of 1, device_sink's .npy dumps.

Videos are made by Debian's `ffmpeg` from a photograph (a window panning over it, so every frame differs): H.264
in MP4 (B-frames, a keyframe every 12 frames), VP9 and VP8 in WebM, MPEG-4 Part 2 in MKV. The reference is PyAV
(python3-av, the same libavcodec and libswscale) decoding every frame in order, frame.to_ndarray(format="rgb24")
and frame.time: clips must equal its frames at the indices the documented rule picks, bit for bit, and FIELD.pts
its times. Checked: uniform, random_clip (starts between keyframes, deterministic across runs and replica counts),
fps, short videos (edge, zeros, skip: counted), decoding from the keyframe before the clip (frames_decoded), and
a truncated MP4, a truncated WebM, an MP4 cut after its header and a garbage member as error records that name
the shard, the key and the codec (error_policy skip: counted).
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import av
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, write_shard  # noqa: E402

PLUGIN_PATH = os.path.join(os.environ.get("SF_BUILD_ROOT", "build-test"), "plugins", "video")
TMP = tempfile.mkdtemp(prefix="sf_test_video_")
check = Checks()
PHOTOS = "/usr/share/backgrounds/mate/nature"


def photo():
    """A photograph (Debian's mate-backgrounds) or, without it, ffmpeg's own test picture."""
    if os.path.isdir(PHOTOS):
        names = sorted(n for n in os.listdir(PHOTOS) if n.endswith(".jpg"))
        if names:
            return ["-loop", "1", "-framerate", "25", "-i", os.path.join(PHOTOS, names[0])]
    return ["-f", "lavfi", "-i", "testsrc2=size=640x480:rate=25"]


def make_video(name, frames, codec_args, size="96x64", faststart=False):
    """Encodes `frames` frames (25 fps) of a window panning over the photograph; returns the file's bytes."""
    w, h = size.split("x")
    path = os.path.join(TMP, name)
    pan = f"scale=480:-2,crop={w}:{h}:'mod(n*7,200)':'mod(n*3,100)'"
    cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-y"] + photo() + ["-vf", pan, "-frames:v", str(frames)]
    cmd += codec_args + (["-movflags", "+faststart"] if faststart else []) + [path]
    subprocess.run(cmd, check=True, timeout=120)
    with open(path, "rb") as f:
        return f.read()


def reference(data):
    """Every frame PyAV decodes from the bytes, in order: (uint8 [N,H,W,3], times [N], keyframe flags [N])."""
    import io
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(video=0))
        return (np.stack([f.to_ndarray(format="rgb24") for f in frames]), np.array([f.time for f in frames]),
                np.array([f.key_frame for f in frames]))


def stage_options(options):
    return "".join(f"    {o.split('=', 1)[0]}: {o.split('=', 1)[1]}\n" for o in options)


def run_stage(name, samples, *options, replicas=1, policy="skip", cwd=None, augment=None, stage="video",
              batch_size=1):
    """Writes a shard and runs it through `video` (options "name=value") with the CLI, then `augment` when its
    options are given (a list of "name=value"). stage="decode" puts decode in video's place (frames given as
    images). Returns (a "samples N errors N skipped N" line then the CLI's stderr, {key.field: array of one
    sample} ({key.field: batch} when batch_size > 1), the video node's --stats-json record)."""
    shard = write_shard(os.path.join(TMP, name + ".tar"), samples)
    out = os.path.join(TMP, name)
    graph = os.path.join(TMP, name + ".yaml")
    stats = os.path.join(TMP, name + ".jsonl")
    opts = stage_options(options)
    after = "" if augment is None else f"  - type: augment\n{stage_options(augment)}"
    with open(graph, "w") as f:
        f.write(f"plugins: [video]\nseed: 7\nepochs: 1\nerror_policy: {policy}\nmax_error_rate: 1\nstages:\n"
                f"  - type: shard_source\n    urls: {shard}\n    shuffle: false\n  - type: tar_split\n"
                f"  - type: {stage}\n    replicas: {replicas}\n{opts}{after}"
                f"  - type: batch\n    batch_size: {batch_size}\n  - type: device_sink\n    npy_dir: {out}\n")
    p = run(["run", graph, "--quiet", "--no-summary", "--stats-json", stats], check=policy == "skip", cwd=cwd,
            env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=PLUGIN_PATH))
    if policy != "skip":
        return f"exit {p.returncode}\n{p.stderr}", {}, {}
    if batch_size > 1:
        arrays = {f"{keys[0]}.{field}": a for _, _, keys, fields in read_batches(out) for field, a in fields.items()}
    else:
        arrays = {f"{keys[0]}.{field}": a[0] for _, _, keys, fields in read_batches(out)
                  for field, a in fields.items()}
    counted = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
    errors, skipped = counted.groups() if counted else ("0", "0")
    final = [json.loads(line) for line in open(stats)][-1]
    node = next(n for n in final["nodes"] if n["name"] == stage)
    return f"samples {len(read_batches(out))} errors {errors} skipped {skipped}\n{p.stderr}", arrays, node


X264 = ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-g", "12", "-keyint_min", "12", "-sc_threshold", "0", "-bf", "2"]
VIDEOS = {
    "h264": ("mp4", make_video("h264.mp4", 50, X264)),
    "vp9": ("webm", make_video("vp9.webm", 40, ["-c:v", "libvpx-vp9", "-g", "10", "-deadline", "realtime",
                                                "-cpu-used", "8", "-b:v", "200k"])),
    "vp8": ("webm", make_video("vp8.webm", 30, ["-c:v", "libvpx", "-g", "10", "-deadline", "realtime",
                                                "-b:v", "200k"])),
    "mpeg4": ("mkv", make_video("mpeg4.mkv", 30, ["-c:v", "mpeg4", "-g", "10", "-bf", "1", "-q:v", "4"])),
}
REFS = {k: reference(data) for k, (_, data) in VIDEOS.items()}


def uniform_indices(n, t):
    """The documented rule: frame floor((2k+1) n / 2t) for k < t, every frame when the video is shorter."""
    return list(range(n)) if n < t else [(2 * k + 1) * n // (2 * t) for k in range(t)]


def check_clip(label, clip, pts, ref, idx):
    frames, times, _ = ref
    check(clip.dtype == np.uint8 and clip.shape == (len(idx),) + frames.shape[1:],
          f"{label}: clip {clip.dtype} {clip.shape}, want uint8 {(len(idx),) + frames.shape[1:]}")
    for k, i in enumerate(idx):
        diff = np.abs(clip[k].astype(int) - frames[i].astype(int)).max()
        check(diff == 0, f"{label}: clip frame {k} equals PyAV's frame {i} bit for bit (max diff {diff})")
    check(pts.dtype == np.float64 and np.allclose(pts, times[idx], rtol=0, atol=1e-9),
          f"{label}: pts {pts} are PyAV's times {times[idx]}")


def test_uniform():
    out, got, node = run_stage("uniform", [(k, {f: d}) for k, (f, d) in VIDEOS.items()], "frames=8",
                               "fields=[mp4, webm, mkv]")
    check("samples 4 errors 0 skipped 0" in out, f"all four decode: {out}")
    for key, (field, _) in VIDEOS.items():
        ref = REFS[key]
        check_clip(f"{key} uniform", got[f"{key}.{field}"], got[f"{key}.{field}.pts"], ref,
                   uniform_indices(len(ref[0]), 8))
    check(node["counters"]["frames_decoded"] > 0, f"frames_decoded counted: {node}")
    out, got, _ = run_stage("uniform_threads", [(k, {f: d}) for k, (f, d) in VIDEOS.items()], "frames=8",
                            "fields=[mp4, webm, mkv]", "threads=3")
    for key, (field, _) in VIDEOS.items():  # frame threads: the same frames
        check_clip(f"{key} threads=3", got[f"{key}.{field}"], got[f"{key}.{field}.pts"], REFS[key],
                   uniform_indices(len(REFS[key][0]), 8))


def random_starts(name, key, replicas, *extra):
    """Runs 12 copies of one video through random_clip (4 frames, stride 3); returns {sample key: start}."""
    field, data = VIDEOS[key]
    frames = REFS[key][0]
    out, got, _ = run_stage(name, [(f"s{i:02d}", {field: data}) for i in range(12)], "frames=4", "stride=3",
                            "sampling=random_clip", *extra, replicas=replicas)
    check("samples 12 errors 0" in out, f"{name}: all decode: {out}")
    starts = {}
    for i in range(12):
        clip = got[f"s{i:02d}.{field}"]
        hits = [s for s in range(len(frames) - 9) if np.array_equal(clip, frames[s:s + 10:3])]
        check(len(hits) == 1, f"{name} s{i:02d}: the clip is 4 frames 3 apart of the reference (found {hits})")
        check_clip(f"{name} s{i:02d}", clip, got[f"s{i:02d}.{field}.pts"], REFS[key],
                   list(range(hits[0], hits[0] + 10, 3)))
        starts[f"s{i:02d}"] = hits[0]
    return starts


def test_random_clip():
    for key in ("h264", "vp9"):
        one = random_starts(f"random_{key}", key, 1)
        again = random_starts(f"random_{key}_again", key, 1)
        three = random_starts(f"random_{key}_3", key, 3)
        check(one == again, f"{key}: random_clip is the same in two runs: {one} vs {again}")
        check(one == three, f"{key}: random_clip is the same with 3 replicas: {one} vs {three}")
        check(len(set(one.values())) > 3, f"{key}: starts differ between samples: {one}")
        keys = REFS[key][2]
        check(any(not keys[s] for s in one.values()), f"{key}: some clips start between keyframes: {one}")
    field, data = VIDEOS["h264"]
    frames = REFS["h264"][0]
    _, got, _ = run_stage("random_other_seed", [(f"s{i:02d}", {field: data}) for i in range(12)], "frames=4",
                          "stride=3", "sampling=random_clip", "start=first")
    check(all(np.array_equal(got[f"s{i:02d}.mp4"], frames[0:10:3]) for i in range(12)), "start=first: frames 0,3,6,9")


def test_keyframe_seek():
    """A 2-frame clip in the middle of a 50-frame H.264 video decodes from the keyframe before it, not from 0."""
    field, data = VIDEOS["h264"]
    ref = REFS["h264"]
    n = len(ref[0])
    _, got, node = run_stage("seek", [("mid", {field: data})], "frames=2", "sampling=random_clip", "start=center")
    start = (n - 2) // 2
    check_clip("center clip", got["mid.mp4"], got["mid.mp4.pts"], ref, [start, start + 1])
    key_before = max(i for i in range(start + 1) if ref[2][i])
    decoded = node["counters"]["frames_decoded"]
    check(decoded < start, f"decoding started near keyframe {key_before}, not at 0: {decoded} frames decoded for "
                           f"frames {start}, {start + 1}")


def test_fps():
    field, data = VIDEOS["h264"]
    ref = REFS["h264"]
    times = ref[1]

    def shown(t):  # the last frame whose time is <= t
        return int(np.searchsorted(times, t + 1e-9, side="right") - 1)

    rate = 10.0
    points = int(math.floor((times[-1] - times[0]) * rate + 1e-6)) + 1
    for start, first in (("first", 0), ("center", (points - 6) // 2)):
        _, got, _ = run_stage(f"fps_{start}", [("v", {field: data})], "sampling=fps", f"fps={rate}", "frames=6",
                              f"start={start}")
        idx = [shown(times[0] + (first + j) / rate) for j in range(6)]
        check_clip(f"fps start={start}", got["v.mp4"], got["v.mp4.pts"], ref, idx)
    p = run(["run", os.path.join(TMP, "fps_first.yaml"), "--quiet", "--set", "video.fps=0"], check=False,
            env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=PLUGIN_PATH))
    check(p.returncode != 0 and "fps" in p.stderr, f"sampling: fps without a rate is refused: {p.stderr}")


def test_short():
    short = make_video("short.mp4", 5, X264)
    ref = reference(short)
    samples = [("short", {"mp4": short}), ("long", {"mp4": VIDEOS["h264"][1]})]
    out, got, node = run_stage("short_edge", samples, "frames=8")
    check_clip("edge", got["short.mp4"], got["short.mp4.pts"], ref, [0, 1, 2, 3, 4, 4, 4, 4])
    check(node["counters"]["short_padded"] == 1, f"short_padded counts the padded video: {node}")
    out, got, node = run_stage("short_zeros", samples, "frames=8", "short=zeros")
    clip, pts = got["short.mp4"], got["short.mp4.pts"]
    check_clip("zeros", clip[:5], pts[:5], ref, [0, 1, 2, 3, 4])
    check(not clip[5:].any() and np.isnan(pts[5:]).all(), f"zeros: black frames, pts NaN: {pts}")
    out, got, node = run_stage("short_skip", samples, "frames=8", "short=skip")
    check("samples 1 errors 0" in out and "long.mp4" in got and "short.mp4" not in got, f"skip drops it: {out}")
    check(node["counters"]["short_skipped"] == 1 and node.get("filtered") == 1,
          f"short_skipped and filtered count it: {node}")
    _, got, _ = run_stage("short_random", samples, "frames=4", "stride=2", "sampling=random_clip")
    check_clip("random_clip short", got["short.mp4"], got["short.mp4.pts"], ref, [0, 2, 4, 4])


def test_damaged():
    mp4 = VIDEOS["h264"][1]
    fast = make_video("fast.mp4", 50, X264, faststart=True)
    webm = VIDEOS["vp9"][1]
    samples = [("good", {"mp4": mp4}), ("cut_mp4", {"mp4": mp4[:len(mp4) * 6 // 10]}),
               ("cut_fast", {"mp4": fast[:len(fast) * 6 // 10]}), ("cut_webm", {"webm": webm[:len(webm) * 6 // 10]}),
               ("garbage", {"mp4": bytes(np.random.default_rng(3).integers(0, 256, 5000, dtype=np.uint8))}),
               ("empty", {"webm": b""}), ("good2", {"webm": webm})]
    out, got, node = run_stage("damaged", samples, "frames=4")
    check("samples 2 errors 5 skipped 5" in out, f"five damaged members are skipped and counted: {out}")
    check("good.mp4" in got and "good2.webm" in got, "the whole ones decode")
    for key in ("cut_mp4", "cut_fast", "cut_webm", "garbage", "empty"):
        line = next((ln for ln in out.splitlines() if f"{key}" in ln), "")
        check(re.search(r"damaged\.tar", line) and "codec " in line,
              f"{key}: the error names shard, key, codec: {line}")
    check(re.search(r"cut_fast.*codec h264", out) and re.search(r"cut_webm.*codec vp9", out),
          f"the codec is named where the stream was found: {out}")
    out, _, _ = run_stage("damaged_fail", samples[1:2], "frames=4", policy="fail")
    check(not out.startswith("exit 0") and re.search(r"damaged_fail\.tar.*cut_mp4.*moov atom not found", out),
          f"under error_policy fail the run stops with the record: {out}")


def test_containers():
    """A container outside `containers` is refused naming the allowed ones, and decodes once allowed; a file
    without a video stream names its container."""
    nut = make_video("h264.nut", 20, X264)
    ref = reference(nut)
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-f", "lavfi", "-i", "sine=duration=0.5",
                    "-c:a", "aac", os.path.join(TMP, "sound.m4a")], check=True, timeout=60)
    with open(os.path.join(TMP, "sound.m4a"), "rb") as f:
        sound = f.read()
    samples = [("nut", {"mp4": nut}), ("sound", {"mp4": sound}), ("good", {"mp4": VIDEOS["h264"][1]})]
    out, got, _ = run_stage("containers", samples, "frames=4")
    check("samples 1 errors 2" in out and re.search(r"key nut\).*no container this reader takes \(allowed: mov,", out)
          and re.search(r"key sound\).*no video stream in the mov", out), f"nut refused, audio-only named: {out}")
    out, got, _ = run_stage("containers_nut", samples[:1], "frames=4", "containers=[nut, mov]")
    check_clip("nut allowed", got["nut.mp4"], got["nut.mp4.pts"], ref, uniform_indices(len(ref[0]), 4))
    # A concat list naming a file of this machine (beside the shard, where the CLI runs): with concat allowed,
    # libavformat would read that file in a context of its own; the reader opens nothing but the member.
    with open(os.path.join(TMP, "local.mp4"), "wb") as f:
        f.write(VIDEOS["h264"][1])
    listing = b"ffconcat version 1.0\nfile local.mp4\n"
    out, got, _ = run_stage("concat", [("list", {"mp4": listing}), ("good", {"mp4": VIDEOS["h264"][1]})],
                            "frames=4", "containers=[concat, mov]", cwd=TMP)
    check("samples 1 errors 1" in out and "list.mp4" not in got and re.search(r"key list\).*local\.mp4", out),
          f"a concat list's reference to a local file is not opened: {out}")


def test_too_big():
    small = make_video("small.mp4", 10, X264, size="48x32")  # 8 frames: 36864 bytes
    out, got, _ = run_stage("too_big", [("v", {"mp4": VIDEOS["h264"][1]}), ("small", {"mp4": small})], "frames=8",
                            "max_clip_bytes=100k")
    check("samples 1 errors 1 skipped 1" in out and re.search(r"key v\).*147456 bytes.*max_clip_bytes", out)
          and got["small.mp4"].shape == (8, 32, 48, 3),
          f"a clip over max_clip_bytes (8 x 96x64x3 = 147456 bytes) is refused, a smaller one passes: {out}")


def test_example_graph():
    """graphs/video_example.yaml runs as written but for its shards: clips of 8 frames 2 apart (their times),
    augmented to float32 [3,8,112,112], batched with labels."""
    field, data = VIDEOS["h264"]
    shard = write_shard(os.path.join(TMP, "example.tar"), [(f"v{i}", {"mp4": data, "cls": str(i).encode()})
                                                            for i in range(3)])
    out = os.path.join(TMP, "example")
    graph = os.path.join(os.environ.get("SF_SOURCE_ROOT", "."), "graphs", "video_example.yaml")
    run(["run", graph, "--quiet", "--no-summary", "--set", f"shard_source.urls={shard}", "--set",
         f"device_sink.npy_dir={out}"], env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=PLUGIN_PATH))
    batches = read_batches(out)
    check(len(batches) == 1, f"one partial batch of 3: {len(batches)}")
    _, _, keys, fields = batches[0]
    times = REFS["h264"][1]
    check(fields["mp4"].shape == (3, 3, 8, 112, 112) and fields["mp4"].dtype == np.float32
          and fields["mp4.pts"].shape == (3, 8) and list(fields["cls"]) == [int(k[1:]) for k in keys],
          f"batch shapes and labels: {fields['mp4'].shape} {fields.keys()} {keys}")
    check(np.isfinite(fields["mp4"]).all() and fields["mp4"].std() > 0.1, "normalised pixels")
    for j in range(3):
        pts = fields["mp4.pts"][j]
        check(any(np.allclose(pts, times[s:s + 15:2], rtol=0, atol=1e-9) for s in range(len(times) - 14)),
              f"{keys[j]}: 8 frames 2 apart of the reference: {pts}")


MEAN, STD = (0.43, 0.39, 0.41), (0.23, 0.22, 0.24)
NORM = [f"mean=[{', '.join(map(str, MEAN))}]", f"std=[{', '.join(map(str, STD))}]"]


def normalised(img):
    """uint8 (or float pixel values) [H,W,C] -> float64 (x/255 - mean)/std, the reference of augment's tables."""
    return (np.asarray(img, dtype=np.float64) / 255.0 - np.array(MEAN)) / np.array(STD)


def png(frame):
    from PIL import Image
    import io
    b = io.BytesIO()
    Image.fromarray(frame).save(b, format="PNG")
    return b.getvalue()


def test_augment():
    """augment on clips: one draw per sample for every frame; each frame equals augmenting it as an image with that
    draw (the image path, and an independent numpy/PIL reference); layouts tchw/cthw/hwc; batches [B,T,...];
    the same bytes in every run and with any replica count."""
    from PIL import Image
    field, data = VIDEOS["h264"]
    frames = REFS["h264"][0]
    idx = uniform_indices(len(frames), 4)
    clips = [(f"s{i}", {field: data}) for i in range(8)]

    # 1. random_resized + flip + normalise: the clip's frames equal the same frames through decode -> augment as
    # images of one sample (augment gives every field of a sample the same draw, from the same seeded stream).
    rrc = ["crop=random_resized", "size=40", "flip=0.5"] + NORM
    out, got, _ = run_stage("aug_rrc", clips, "frames=4", augment=rrc + ["layout=tchw"])
    check("samples 8 errors 0" in out, f"augmented clips pass: {out}")
    images = [(f"s{i}", {f"f{j}.png": png(frames[k]) for j, k in enumerate(idx)}) for i in range(8)]
    _, img, _ = run_stage("aug_rrc_images", images, stage="decode", augment=rrc + ["layout=chw"])
    for i in range(8):
        clip = got.get(f"s{i}.{field}")
        check(clip is not None and clip.dtype == np.float32 and clip.shape == (4, 3, 40, 40),
              f"s{i}: layout tchw gives float32 [T,C,H,W] = (4,3,40,40): {None if clip is None else clip.shape}")
        for j in range(4):
            ref = img.get(f"s{i}.f{j}.png")
            check(ref is not None and clip is not None and np.array_equal(clip[j], ref),
                  f"s{i} frame {j}: equals augmenting frame {idx[j]} as an image with the sample's draw")
    distinct = {got[f"s{i}.{field}"][0].tobytes() for i in range(8) if f"s{i}.{field}" in got}
    check(len(distinct) > 4, f"the draws differ between samples ({len(distinct)} distinct of 8)")

    # 2. padded random crop + flip against numpy: every frame of a clip is the same window and flip of its frame.
    crop = ["crop=random", "size=48", "padding=4", "flip=0.5"] + NORM
    _, cthw, _ = run_stage("aug_crop", clips, "frames=4", augment=crop + ["layout=cthw"])
    seen = set()
    for i in range(8):
        clip = cthw[f"s{i}.{field}"]
        check(clip.shape == (3, 4, 48, 48), f"s{i}: layout cthw gives [C,T,H,W] = (3,4,48,48): {clip.shape}")
        padded = [normalised(np.pad(frames[k], ((4, 4), (4, 4), (0, 0)))) for k in idx]
        want = clip[:, 0].transpose(1, 2, 0)
        best = min(((t, l, fl) for t in range(padded[0].shape[0] - 47) for l in range(padded[0].shape[1] - 47)
                    for fl in (False, True)),
                   key=lambda c: np.abs(want - (padded[0][c[0]:c[0] + 48, c[1]:c[1] + 48][:, ::-1] if c[2] else
                                                padded[0][c[0]:c[0] + 48, c[1]:c[1] + 48])).max())
        t, l, fl = best
        seen.add(best)
        for j in range(4):
            win = padded[j][t:t + 48, l:l + 48]
            win = win[:, ::-1] if fl else win
            diff = np.abs(clip[:, j].transpose(1, 2, 0) - win).max()
            check(diff <= 1e-6, f"s{i} frame {j}: numpy's crop at ({t},{l}) flip {fl} of frame {idx[j]} (diff {diff})")
    check(len({s[:2] for s in seen}) > 4 and 0 < sum(s[2] for s in seen) < 8, f"windows and flips vary: {seen}")
    _, tchw, _ = run_stage("aug_crop_tchw", clips, "frames=4", augment=crop + ["layout=tchw"])
    check(all(np.array_equal(tchw[f"s{i}.{field}"], cthw[f"s{i}.{field}"].transpose(1, 0, 2, 3)) for i in range(8)),
          "layout tchw is cthw with its first two axes swapped (the same draws)")
    again = run_stage("aug_crop_again", clips, "frames=4", augment=crop + ["layout=cthw"])[1]
    three = run_stage("aug_crop_3", clips, "frames=4", augment=crop + ["layout=cthw", "replicas=3"], replicas=3)[1]
    check(all(np.array_equal(again[k], v) and np.array_equal(three[k], v) for k, v in cthw.items()),
          "the same clips in another run and with 3 replicas of video and augment")

    # 3. resize + center crop + normalise against PIL's antialiased bilinear, bfloat16 bits, hwc, and a batch.
    _, got, _ = run_stage("aug_resize", clips[:2], "frames=4", augment=["resize=40", "crop=center", "size=36",
                                                                         "layout=thwc"] + NORM)
    for j, k in enumerate(idx):
        h, w = frames[k].shape[:2]
        rh, rw = (40, int(40 * w / h)) if h < w else (int(40 * h / w), 40)
        small = np.asarray(Image.fromarray(frames[k]).resize((rw, rh), Image.BILINEAR, reducing_gap=None))
        top, left = int(round((rh - 36) / 2.0)), int(round((rw - 36) / 2.0))
        ref = normalised(small[top:top + 36, left:left + 36])
        clip = got["s0.mp4"]
        check(clip.shape == (4, 36, 36, 3) and np.abs(clip[j] - ref).max() <= 1e-4,
              f"resize 40, center crop 36, layout thwc: frame {j} is PIL's bilinear of frame {k}")
    _, bf, _ = run_stage("aug_bf16", clips[:2], "frames=4", augment=crop + ["layout=cthw", "dtype=bfloat16"])
    f32 = cthw["s0.mp4"].astype(np.float32).view(np.uint32).astype(np.uint64)
    check(bf["s0.mp4"].dtype == np.uint16 and np.array_equal(bf["s0.mp4"],
          ((f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16).astype(np.uint16)), "bfloat16: the float32 output rounded")
    _, batch, _ = run_stage("aug_batch", clips[:6], "frames=4", augment=crop + ["layout=cthw"], batch_size=3)
    check(batch["s0.mp4"].shape == (3, 3, 4, 48, 48) and batch["s0.mp4.pts"].shape == (3, 4)
          and np.array_equal(batch["s3.mp4"][1], cthw["s4.mp4"]), f"batches of [B,C,T,H,W]: {batch['s0.mp4'].shape}")
    p = run(["run", os.path.join(TMP, "aug_crop.yaml"), "--quiet", "--set", "augment.layout=tchwx"], check=False,
            env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=PLUGIN_PATH))
    check(p.returncode != 0 and "cthw" in p.stderr, f"an unknown layout names the valid ones: {p.stderr}")


def make_av(name, frames, video_args, audio_input, audio_args):
    """A video of `frames` frames (25 fps, the panning photograph) with an audio track from ffmpeg's lavfi source
    `audio_input` (its own duration); returns the file's bytes."""
    path = os.path.join(TMP, name)
    pan = "scale=480:-2,crop=96:64:'mod(n*7,200)':'mod(n*3,100)'"
    cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-y"] + photo() + ["-f", "lavfi", "-i", audio_input,
           "-map", "0:v", "-map", "1:a", "-vf", pan, "-frames:v", str(frames)] + video_args + audio_args + [path]
    subprocess.run(cmd, check=True, timeout=120)
    with open(path, "rb") as f:
        return f.read()


def audio_reference(data):
    """Every audio sample PyAV decodes, as (float32 [channels, N], time of each sample [N], rate): planar float
    from frame.to_ndarray(), 16-bit integers divided by 32768 (libswresample's conversion)."""
    import io
    parts, times = [], []
    with av.open(io.BytesIO(data)) as c:
        for fr in c.decode(audio=0):
            a = fr.to_ndarray()
            if not fr.format.is_planar:
                a = a.reshape(-1, len(fr.layout.channels)).T
            if a.dtype == np.int16:
                a = a.astype(np.float32) / np.float32(32768)
            parts.append(a.astype(np.float32))
            times.append(fr.time + np.arange(a.shape[1]) / fr.sample_rate)
            rate = fr.sample_rate
    return np.concatenate(parts, axis=1), np.concatenate(times), rate


def expected_audio(ref, t0, t1):
    """The documented span: n = round((t1 - t0) * rate) samples from t0, sample k the one at t0 + k/rate, zeros
    where the track has none."""
    samples, times, rate = ref
    n = int(np.floor((t1 - t0) * rate + 0.5))
    out = np.zeros((samples.shape[0], n), np.float32)
    k = np.floor((times - t0) * rate + 0.5).astype(np.int64)
    inside = (k >= 0) & (k < n)
    out[:, k[inside]] = samples[:, inside]
    return out


def clip_span(pts, video_times):
    """[first frame's time, last frame's time + that frame's duration): the next frame's time minus its own."""
    last = int(np.searchsorted(video_times, pts.max() - 1e-9))
    dur = video_times[last + 1] - video_times[last] if last + 1 < len(video_times) else \
        (video_times[-1] - video_times[0]) / (len(video_times) - 1)
    return pts.min(), pts.max() + dur


def test_audio():
    """audio: true adds FIELD.audio (float32 [channels, samples], the stream's rate in FIELD.audio_rate) covering
    the clip's time span: PyAV's samples bit for bit (AAC in MP4, Opus in WebM, 16-bit PCM in MKV shorter than the
    video: zeros after its end); a video without audio is an error record or, with missing_audio: empty, an empty
    field (counted)."""
    tracks = {
        "aac": ("mp4", make_av("aac.mp4", 50, X264, "sine=frequency=440:sample_rate=44100:duration=2.3",
                               ["-c:a", "aac", "-b:a", "96k"])),
        "opus": ("webm", make_av("opus.webm", 30, ["-c:v", "libvpx", "-deadline", "realtime", "-b:v", "200k"],
                                 "aevalsrc=0.5*sin(2*PI*440*t)|0.3*sin(2*PI*700*t):s=48000:d=1.4",
                                 ["-c:a", "libopus", "-b:a", "64k"])),
        "pcm": ("mkv", make_av("pcm.mkv", 30, ["-c:v", "mpeg4", "-q:v", "4"],
                               "aevalsrc=0.5*sin(2*PI*300*t)|0.25*sin(2*PI*500*t):s=22050:d=0.9",
                               ["-c:a", "pcm_s16le"])),
    }
    refs = {k: audio_reference(d) for k, (_, d) in tracks.items()}
    vtimes = {k: reference(d)[1] for k, (_, d) in tracks.items()}
    channels = {"aac": 1, "opus": 2, "pcm": 2}
    for sampling in (["frames=4"], ["frames=6", "sampling=random_clip", "stride=2"]):
        label = sampling[-1]
        samples = [(f"{k}{i}", {f: d}) for k, (f, d) in tracks.items() for i in range(3)]
        out, got, node = run_stage(f"audio_{label[:6]}", samples, *sampling, "audio=true")
        check("samples 9 errors 0" in out, f"{label}: all decode with their audio: {out}")
        for key, (field, _) in tracks.items():
            for i in range(3):
                name = f"{key}{i}.{field}"
                audio, rate, pts = got.get(name + ".audio"), got.get(name + ".audio_rate"), got.get(name + ".pts")
                if audio is None or rate is None:
                    check(False, f"{name}: .audio and .audio_rate fields: {sorted(got)}")
                    continue
                t0, t1 = clip_span(pts, vtimes[key])
                want = expected_audio(refs[key], t0, t1)
                check(int(rate) == refs[key][2], f"{name}: audio_rate {rate} is the stream's {refs[key][2]}")
                check(audio.dtype == np.float32 and audio.shape == want.shape and audio.shape[0] == channels[key],
                      f"{name} {label}: float32 {want.shape} for [{t0:.3f}, {t1:.3f}): {audio.dtype} {audio.shape}")
                if audio.shape == want.shape:
                    diff = np.abs(audio - want).max()
                    check(diff == 0, f"{name} {label}: PyAV's samples bit for bit (max diff {diff})")
                    check(np.abs(audio).max() > 0.1, f"{name}: not silence")
        if label == "frames=4":  # frames 3, 11, 18 and 26 of 30: the clip ends at 1.08 s, the PCM at 0.9 s
            pcm, t0 = got["pcm0.mkv.audio"], got["pcm0.mkv.pts"][0]
            k = int((refs["pcm"][1][-1] - t0) * refs["pcm"][2])
            check(pcm.shape[1] > k + 1000 and not pcm[:, k + 2:].any() and np.abs(pcm[:, k - 100:k]).max() > 0.05,
                  f"audio shorter than the clip: zeros after its end (sample {k} of {pcm.shape})")
    _, got, _ = run_stage("audio_batch", [(f"a{i}", {"mp4": tracks["aac"][1]}) for i in range(3)], "frames=6",
                          "sampling=random_clip", "audio=true", batch_size=3)
    check(got["a0.mp4.audio"].shape == (3, 1, 10584) and got["a0.mp4.audio_rate"].shape == (3,),
          f"random clips of one length batch: [B, 1, 6/25 s x 44100]: {got['a0.mp4.audio'].shape}")
    silent = [("silent", {"mp4": VIDEOS["h264"][1]}), ("aac", {"mp4": tracks["aac"][1]})]
    out, got, node = run_stage("audio_missing", silent, "frames=4", "audio=true")
    check("samples 1 errors 1 skipped 1" in out and re.search(r"audio_missing\.tar.*key silent.*no audio stream", out),
          f"a video without audio is an error record naming shard and key: {out}")
    out, got, node = run_stage("audio_empty", silent, "frames=4", "audio=true", "missing_audio=empty")
    check("samples 2 errors 0" in out and got["silent.mp4.audio"].shape == (0, 0)
          and got["silent.mp4.audio"].dtype == np.float32 and int(got["silent.mp4.audio_rate"]) == 0
          and node["counters"].get("audio_missing") == 1, f"missing_audio: empty gives float32 [0,0], counted: {out}")
    _, got, _ = run_stage("audio_off", silent[1:], "frames=4")
    check("aac.mp4.audio" not in got and "aac.mp4" in got, "without audio: true no audio field")


def test_python():
    """Through the Python binding (DLPack): the clip as torch uint8 [B,T,H,W,3], pts as torch float64 [B,T]."""
    if os.environ.get("SF_SANITIZE", "none") != "none":
        return  # Debian's python cannot host a sanitizer runtime
    sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
    os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
    os.environ["SHARDFLOW_PLUGIN_PATH"] = PLUGIN_PATH
    import shardflow
    import torch
    field, data = VIDEOS["h264"]
    shard = write_shard(os.path.join(TMP, "python.tar"), [(f"v{i}", {"mp4": data}) for i in range(2)])
    graph = os.path.join(TMP, "python.yaml")
    with open(graph, "w") as f:
        f.write(f"plugins: [video]\nseed: 0\nstages:\n  - type: shard_source\n    urls: {shard}\n"
                f"    shuffle: false\n  - type: tar_split\n  - type: video\n    frames: 4\n"
                f"  - type: batch\n    batch_size: 2\n  - type: device_sink\n")
    ref = REFS["h264"]
    idx = uniform_indices(len(ref[0]), 4)
    with shardflow.Pipeline(graph, epochs=1, output="torch_dict") as p:
        batches = list(p)
    check(len(batches) == 1, f"one batch: {len(batches)}")
    clip, pts = batches[0]["mp4"], batches[0]["mp4.pts"]
    check(clip.dtype == torch.uint8 and tuple(clip.shape) == (2, 4) + ref[0].shape[1:]
          and pts.dtype == torch.float64 and tuple(pts.shape) == (2, 4), f"torch {clip.dtype} {clip.shape}, "
          f"{pts.dtype} {pts.shape}")
    check(np.array_equal(clip[1].numpy(), ref[0][idx]) and np.allclose(pts[1].numpy(), ref[1][idx], atol=1e-9),
          "torch sees PyAV's frames and times")


for test in (test_audio, test_augment, test_python, test_example_graph, test_uniform, test_random_clip, test_keyframe_seek, test_fps, test_short,
             test_damaged, test_containers, test_too_big):
    test()
check.done("video")
