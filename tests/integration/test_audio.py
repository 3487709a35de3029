#!/usr/bin/python3
"""Integration test of the audio plugin's audio_decode stage, run by the CLI in a graph (`plugins: [audio]`,
found on SHARDFLOW_PLUGIN_PATH): shard_source, tar_split, audio_decode, batch of 1, device_sink's .npy dumps.

Members are written by python3-soundfile (libsndfile) into tar shards with tarfile; the reference is
soundfile.read(dtype='float32') of the same bytes, transposed to [channels, frames]: exact for 16-bit WAV (1 and 2
channels) and FLAC, within 1e-4 for OGG/Vorbis. Resampling (libsamplerate) is checked against the analytic sine
at the new rate (length round(frames * ratio), samples away from the edges within 2e-3, FFT peak at the tone's
frequency). Crop start/center/random and zero padding against slices of the reference, the <field>.length field,
and a corrupt member skipped, counted and named (shard URL, key, libsndfile's message).
"""
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import soundfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, write_shard  # noqa: E402

PLUGIN_PATH = os.path.join(os.environ.get("SF_BUILD_ROOT", "build-test"), "plugins", "audio")
TMP = tempfile.mkdtemp(prefix="sf_test_audio_")
check = Checks()


def encode(data, rate, fmt, subtype):
    buf = io.BytesIO()
    soundfile.write(buf, data, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def reference(data_bytes):
    """[channels, frames] float32 as soundfile decodes the bytes."""
    ref, rate = soundfile.read(io.BytesIO(data_bytes), dtype="float32", always_2d=True)
    return ref.T, rate


def run_stage(name, samples, *options):
    """Writes a shard and runs it through audio_decode (options: "name=value") in a graph with the CLI.
    Returns (a "samples N errors N skipped N" line, then the CLI's stderr; {key.field: array of one sample})."""
    shard = write_shard(os.path.join(TMP, name + ".tar"), samples)
    out = os.path.join(TMP, name)
    graph = os.path.join(TMP, name + ".yaml")
    opts = "".join(f"    {o.split('=', 1)[0]}: {o.split('=', 1)[1]}\n" for o in options)
    with open(graph, "w") as f:
        f.write(f"plugins: [audio]\nseed: 0\nepochs: 1\nstages:\n  - type: shard_source\n    urls: {shard}\n"
                f"    shuffle: false\n  - type: tar_split\n  - type: audio_decode\n{opts}"
                f"  - type: batch\n    batch_size: 1\n  - type: device_sink\n    npy_dir: {out}\n")
    p = run(["run", graph, "--quiet", "--no-summary"], env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=PLUGIN_PATH))
    arrays = {f"{keys[0]}.{field}": a[0] for _, _, keys, fields in read_batches(out) for field, a in fields.items()}
    counted = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
    errors, skipped = counted.groups() if counted else ("0", "0")
    return f"samples {len(read_batches(out))} errors {errors} skipped {skipped}\n{p.stderr}", arrays


rng = np.random.default_rng(10)
noise_mono = (rng.uniform(-0.9, 0.9, 1000)).astype(np.float64)
noise_stereo = rng.uniform(-0.9, 0.9, (777, 2))
noise_long = rng.uniform(-0.9, 0.9, (4000, 2))
MEMBERS = {
    "mono": ("wav", encode(noise_mono, 16000, "WAV", "PCM_16")),
    "stereo": ("wav", encode(noise_stereo, 44100, "WAV", "PCM_16")),
    "flac": ("flac", encode(noise_stereo, 22050, "FLAC", "PCM_16")),
    "vorbis": ("ogg", encode(noise_long, 44100, "OGG", "VORBIS")),
}


def test_decode_matches_soundfile():
    out, got = run_stage("plain", [(k, {f: b}) for k, (f, b) in MEMBERS.items()])
    check("samples 4 errors 0 skipped 0" in out, f"all four decode: {out}")
    for key, (field, data) in MEMBERS.items():
        ref, _ = reference(data)
        a = got[f"{key}.{field}"]
        check(a.dtype == np.float32 and a.shape == ref.shape, f"{key}: {a.dtype} {a.shape} vs {ref.shape}")
        if field == "ogg":
            check(np.max(np.abs(a - ref)) < 1e-4, f"{key}: within 1e-4 of soundfile")
        else:
            check(np.array_equal(a, ref), f"{key}: equal to soundfile, max diff {np.max(np.abs(a - ref))}")
        length = got[f"{key}.{field}.length"]
        check(length.dtype == np.int64 and length.shape == () and int(length) == ref.shape[1],
              f"{key}: length field {length!r}, want {ref.shape[1]}")


def test_resample():
    rate, new_rate, hz, frames = 16000, 22050, 440.0, 8000
    t = np.arange(frames) / rate
    tone = encode(np.stack([0.5 * np.sin(2 * np.pi * hz * t), 0.25 * np.sin(2 * np.pi * hz * t)], 1),
                  rate, "WAV", "FLOAT")
    out, got = run_stage("resample", [("tone", {"wav": tone})], f"sample_rate={new_rate}")
    a = got["tone.wav"]
    want = round(frames * new_rate / rate)
    check(a.shape == (2, want), f"resampled shape {a.shape}, want (2, {want})")
    t2 = np.arange(want) / new_rate
    for c, amp in ((0, 0.5), (1, 0.25)):
        ref = amp * np.sin(2 * np.pi * hz * t2)
        err = np.max(np.abs(a[c, 300:-300] - ref[300:-300]))
        check(err < 2e-3, f"channel {c}: resampled sine within 2e-3 of the analytic one (max {err})")
    peak = np.argmax(np.abs(np.fft.rfft(a[0]))) * new_rate / want
    check(abs(peak - hz) < 2.0, f"FFT peak at {peak} Hz, want {hz}")
    check(int(got["tone.wav.length"]) == frames, "length field keeps the stored frame count")
    out, got = run_stage("resample_linear", [("tone", {"wav": tone})], f"sample_rate={new_rate}", "quality=linear")
    check(got["tone.wav"].shape == (2, want), "quality=linear gives the same length")


def test_crop_pad():
    data = MEMBERS["stereo"][1]  # 777 frames
    ref, _ = reference(data)
    _, got = run_stage("crop_start", [("s", {"wav": data})], "frames=500")
    check(np.array_equal(got["s.wav"], ref[:, :500]), "crop=start keeps the first 500 frames")
    _, got = run_stage("crop_center", [("s", {"wav": data})], "frames=500", "crop=center")
    check(np.array_equal(got["s.wav"], ref[:, 138:638]), "crop=center keeps frames 138..637")
    _, got = run_stage("pad", [("s", {"wav": data})], "frames=1000")
    a = got["s.wav"]
    check(a.shape == (2, 1000) and np.array_equal(a[:, :777], ref) and not a[:, 777:].any(),
          "frames=1000 pads with zeros at the end")
    check(int(got["s.wav.length"]) == 777, "length field is the stored frame count")
    keys = [(f"k{i}", {"wav": data}) for i in range(8)]
    _, got = run_stage("crop_random", keys, "frames=100", "crop=random")
    _, again = run_stage("crop_random2", keys, "frames=100", "crop=random")
    starts = set()
    for i in range(8):
        a = got[f"k{i}.wav"]
        check(np.array_equal(a, again[f"k{i}.wav"]), "crop=random is deterministic for a seed")
        hits = [s for s in range(0, 678) if np.array_equal(a, ref[:, s:s + 100])]
        check(len(hits) == 1, f"k{i}: a random crop is a window of the reference")
        starts.add(hits[0])
    check(len(starts) > 1, f"random crops start at different frames: {starts}")


def test_corrupt_member():
    samples = [("a", {"wav": MEMBERS["mono"][1]}), ("bad", {"wav": b"RIFF\x10\x00\x00\x00not a wave file"}),
               ("c", {"flac": MEMBERS["flac"][1]})]
    out, got = run_stage("corrupt", samples)
    check("samples 2 errors 1 skipped 1" in out, f"the corrupt member is skipped and counted: {out}")
    check("a.wav" in got and "c.flac" in got and not any(k.startswith("bad.") for k in got), "others pass")
    check(re.search(r"corrupt\.tar", out) and "bad" in out and "libsndfile" in out,
          f"the error names the shard, the key and libsndfile's message: {out}")


def test_shared_object():
    """audio.so loads next to libshardflow.so (the only symbols it needs) and its entry point describes the stage."""
    if os.environ.get("SF_SANITIZE", "none") != "none":
        return  # Debian's python cannot host a sanitizer runtime
    import ctypes
    build = os.environ.get("SF_BUILD_ROOT", "build-test")
    ctypes.CDLL(os.path.join(build, "libshardflow.so"), mode=ctypes.RTLD_GLOBAL)
    so = ctypes.CDLL(os.path.join(build, "plugins", "audio", "audio.so"))

    class Plugin(ctypes.Structure):
        _fields_ = [("abi_version", ctypes.c_uint32), ("name", ctypes.c_char_p), ("build_id", ctypes.c_char_p),
                    ("stages", ctypes.POINTER(ctypes.c_void_p))]

    class StageHead(ctypes.Structure):  # sf_stage_def's first two members
        _fields_ = [("abi_version", ctypes.c_uint32), ("name", ctypes.c_char_p)]

    so.sf_plugin_entry.restype = ctypes.POINTER(Plugin)
    plugin = so.sf_plugin_entry().contents
    abi = int(re.search(r"#define SF_STAGE_ABI_VERSION (\d+)", open(os.path.join(
        os.environ.get("SF_SOURCE_ROOT", "."), "include", "shardflow", "stage.h")).read()).group(1))
    check(plugin.abi_version == abi and plugin.name == b"audio" and plugin.build_id.startswith(b"audio "),
          f"descriptor: abi {plugin.abi_version} name {plugin.name} build_id {plugin.build_id}")
    stage = ctypes.cast(plugin.stages[0], ctypes.POINTER(StageHead)).contents
    check(stage.name == b"audio_decode" and stage.abi_version == abi and not plugin.stages[1],
          "one stage, audio_decode")


def test_shipped_graph():
    """graphs/audio_example.yaml through the CLI: `plugins: [audio]` found by name on SHARDFLOW_PLUGIN_PATH."""
    src = os.environ.get("SF_SOURCE_ROOT", ".")
    build = os.environ.get("SF_BUILD_ROOT", "build-test")
    clips = [(f"{i:07d}", {"flac": encode(rng.uniform(-0.9, 0.9, (n, 2)), 16000, "FLAC", "PCM_16")})
             for i, n in enumerate((20000, 9000, 16000))]
    shard = write_shard(os.path.join(TMP, "speech-000000.tar"), clips)
    out = os.path.join(TMP, "graph-out")
    env = dict(os.environ, SHARDFLOW_PLUGIN_PATH=os.path.join(build, "plugins", "audio"))
    p = subprocess.run([os.environ.get("SHARDFLOW", "build-test/shardflow"), "run",
                        os.path.join(src, "graphs", "audio_example.yaml"), "--quiet", "--no-summary",
                        "--set", f"shard_source.urls={shard}", "--set", "batch.batch_size=3",
                        "--set", f"device_sink.npy_dir={out}"], capture_output=True, text=True, env=env, timeout=120)
    check(p.returncode == 0, f"graphs/audio_example.yaml runs with the plugin: {p.stderr}")
    batch = np.load(os.path.join(out, "e000_b000000_flac.npy"))
    lengths = np.load(os.path.join(out, "e000_b000000_flac.length.npy"))
    keys = open(os.path.join(out, "e000_b000000_keys.txt")).read().split()
    check(batch.shape == (3, 2, 16000) and batch.dtype == np.float32, f"one second of stereo each: {batch.shape}")
    for row, key in enumerate(keys):
        ref, _ = reference(dict(clips)[key]["flac"])
        n = ref.shape[1]
        check(lengths[row] == n, f"{key}: length {lengths[row]} is the stored {n} frames")
        if n <= 16000:  # shorter: the clip, then zeros
            check(np.array_equal(batch[row, :, :n], ref) and not batch[row, :, n:].any(), f"{key}: padded")
        else:  # longer: a window of the clip (random crop)
            starts = [o for o in range(n - 16000 + 1) if np.array_equal(batch[row, :, :8], ref[:, o:o + 8])]
            check(any(np.array_equal(batch[row], ref[:, o:o + 16000]) for o in starts), f"{key}: a window of the clip")


def main():
    test_shared_object()
    test_shipped_graph()
    test_decode_matches_soundfile()
    test_resample()
    test_crop_pad()
    test_corrupt_member()
    shutil.rmtree(TMP, ignore_errors=True)
    check.done("audio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
