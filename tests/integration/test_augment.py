#!/usr/bin/python3
"""Integration test of the augment stage: known PPM images through a real pipeline, checked
against an independent numpy implementation of torchvision's crop / flip / normalise / resize
semantics (resize: PIL's antialiased bilinear, as torchvision on PIL images; test_resize checks it closely)."""
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

SHARDFLOW = os.environ.get("SHARDFLOW")
TMP = tempfile.mkdtemp(prefix="sf_augment_")
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)
failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        failures.append(name)


# ---- inputs ---------------------------------------------------------------------------------

def write_tar(name, images):
    path = os.path.join(TMP, name)
    with tarfile.open(path, "w") as tf:
        for i, img in enumerate(images):
            h, w, _ = img.shape
            data = b"P6\n%d %d\n255\n" % (w, h) + img.tobytes()
            info = tarfile.TarInfo("img%04d.ppm" % i)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


rng = np.random.default_rng(20240611)
CIFAR = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(40)]
MIXED = [rng.integers(0, 256, s + (3,), dtype=np.uint8)
         for s in [(32, 32), (35, 29), (33, 40), (13, 17), (20, 20), (27, 44)]]
CIFAR_TAR = write_tar("cifar.tar", CIFAR)
MIXED_TAR = write_tar("mixed.tar", MIXED)


# ---- running the pipeline ------------------------------------------------------------------

runs = 0


def run(tar, augment, seed=1, expect_ok=True):
    """Runs shard_source -> tar_split -> decode -> augment -> batch(1) -> device_sink and
    returns the per-sample arrays in shard order (or the completed process on failure)."""
    global runs
    runs += 1
    out = os.path.join(TMP, "out%03d" % runs)
    opts = "".join("    %s: %s\n" % (k, v) for k, v in augment.items())
    graph = (f"seed: {seed}\nepochs: 1\nstages:\n"
             f"  - type: shard_source\n    urls: {tar}\n    shuffle: false\n"
             f"  - type: tar_split\n  - type: decode\n"
             f"  - type: augment\n{opts}"
             f"  - type: batch\n    batch_size: 1\n"
             f"  - type: device_sink\n    npy_dir: {out}\n")
    path = os.path.join(TMP, "graph%03d.yaml" % runs)
    with open(path, "w") as f:
        f.write(graph)
    p = subprocess.run([SHARDFLOW, "run", path, "--quiet", "--no-summary"], capture_output=True, text=True,
                       timeout=300)
    if not expect_ok:
        return p
    if p.returncode != 0:
        raise SystemExit("shardflow run failed (%d) for %s:\n%s%s" % (p.returncode, augment, p.stdout, p.stderr))
    arrays, keys = [], []
    b = 0
    while os.path.exists(os.path.join(out, "e000_b%06d_ppm.npy" % b)):
        a = np.load(os.path.join(out, "e000_b%06d_ppm.npy" % b))
        with open(os.path.join(out, "e000_b%06d_keys.txt" % b)) as f:
            keys.append(f.read().split())
        assert a.shape[0] == 1, a.shape
        arrays.append(a[0])
        b += 1
    expected = [["img%04d" % i] for i in range(b)]
    if keys != expected:
        raise SystemExit("batches are not in shard order: %s" % keys)
    return arrays


def raw_bytes(out_arrays):
    return b"".join(a.tobytes() for a in out_arrays)


# ---- the numpy reference -------------------------------------------------------------------

def normalise(img, mean=None, std=None):
    """uint8 [H,W,C] (or float pixel values) -> float64 x/255, then (x-mean)/std."""
    x = img.astype(np.float64) / 255.0
    if mean is not None:
        x = (x - np.array(mean)) / np.array(std)
    return x


def pad(img, p):
    return np.pad(img, ((p, p), (p, p), (0, 0))) if p else img


def center_crop(img, size):
    """torchvision CenterCrop: zero-pads a smaller image, offsets rounded half to even."""
    h, w, _ = img.shape
    if size > h or size > w:
        pt, pl = max(size - h, 0) // 2, max(size - w, 0) // 2
        pb, pr = max(size - h + 1, 0) // 2, max(size - w + 1, 0) // 2
        img = np.pad(img, ((pt, pb), (pl, pr), (0, 0)))
        h, w, _ = img.shape
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return img[top:top + size, left:left + size]


def bilinear(img, oh, ow):
    """torchvision's default resize of a PIL image: PIL's antialiased bilinear
    (Image.resize(..., Image.BILINEAR, reducing_gap=None)), uint8 values as float64."""
    im = Image.fromarray(img).resize((ow, oh), Image.BILINEAR, reducing_gap=None)
    return np.asarray(im).astype(np.float64)


def resized_size(h, w, short):
    """torchvision Resize(int): the shorter side to `short`, the longer truncated."""
    if w <= h:
        return int(short * h / w), short
    return short, int(short * w / h)


def chw(x):
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def bf16_bits(f32):
    """Round-to-nearest-even of float32 to bfloat16, as raw uint16 bits."""
    u = f32.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def maxdiff(a, b):
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def crop_candidates(img, size, p, mean=None, std=None):
    """Every (2p+1)^2 crop of the zero-padded image, unflipped and flipped, normalised (CHW):
    a dict (top, left, flipped) -> array."""
    x = normalise(pad(img, p), mean, std)
    out = {}
    for top in range(x.shape[0] - size + 1):
        for left in range(x.shape[1] - size + 1):
            c = x[top:top + size, left:left + size]
            out[(top, left, False)] = chw(c)
            out[(top, left, True)] = chw(c[:, ::-1])
    return out


def match_candidate(got, candidates, tol):
    best = min(candidates.items(), key=lambda kv: maxdiff(got, kv[1]))
    return best[0], maxdiff(got, best[1])


# ---- the checks ----------------------------------------------------------------------------

def test_center_crop():
    for size, p in [(24, 0), (36, 2)]:
        out = run(MIXED_TAR, {"crop": "center", "size": size, "padding": p, "layout": "hwc"})
        worst = max(maxdiff(o, normalise(center_crop(pad(img, p), size))) for o, img in zip(out, MIXED))
        shapes = {o.shape for o in out}
        check("center crop size %d padding %d: shape and values (max diff %.2g)" % (size, p, worst),
              len(out) == len(MIXED) and shapes == {(size, size, 3)} and worst <= 1e-6,
              "shapes %s, max diff %g" % (shapes, worst))
        check("center crop size %d: float32 output" % size, all(o.dtype == np.float32 for o in out))


def test_flip():
    out = run(MIXED_TAR, {"flip": 1, "dtype": "uint8", "layout": "hwc"})
    check("flip=1, uint8 hwc: every image mirrored exactly",
          len(out) == len(MIXED) and all(o.dtype == np.uint8 and np.array_equal(o, img[:, ::-1])
                                         for o, img in zip(out, MIXED)))
    out = run(MIXED_TAR, {"flip": 0, "dtype": "uint8", "layout": "hwc"})
    check("flip=0, uint8 hwc: every image unchanged",
          len(out) == len(MIXED) and all(np.array_equal(o, img) for o, img in zip(out, MIXED)))
    out = run(MIXED_TAR, {"flip": 1, "mean": "[%s]" % ", ".join(map(str, CIFAR_MEAN)),
                          "std": "[%s]" % ", ".join(map(str, CIFAR_STD))})
    worst = max(maxdiff(o, chw(normalise(img[:, ::-1], CIFAR_MEAN, CIFAR_STD))) for o, img in zip(out, MIXED))
    check("flip=1 + CIFAR normalise, float32 chw (max diff %.2g <= 1e-6)" % worst, worst <= 1e-6)


def test_normalise_and_layout():
    norm = {"mean": ",".join(map(str, CIFAR_MEAN)), "std": ",".join(map(str, CIFAR_STD))}
    hwc = run(MIXED_TAR, dict(norm, layout="hwc"))
    chw_out = run(MIXED_TAR, dict(norm, layout="chw"))
    worst = max(maxdiff(o, normalise(img, CIFAR_MEAN, CIFAR_STD)) for o, img in zip(hwc, MIXED))
    check("CIFAR normalise, float32 hwc (max diff %.2g <= 1e-6)" % worst,
          len(hwc) == len(MIXED) and worst <= 1e-6)
    check("layout chw is exactly hwc transposed",
          len(chw_out) == len(hwc) and all(c.shape == (h.shape[2], h.shape[0], h.shape[1])
                                           and np.array_equal(c, chw(h)) for c, h in zip(chw_out, hwc)))


CIFAR_TRAIN = {"crop": "random", "size": 32, "padding": 4, "flip": 0.5,
               "mean": ",".join(map(str, CIFAR_MEAN)), "std": ",".join(map(str, CIFAR_STD))}


def test_random_crop():
    out = run(CIFAR_TAR, CIFAR_TRAIN, seed=7)
    worst, seen = 0.0, []
    for o, img in zip(out, CIFAR):
        where, diff = match_candidate(o, crop_candidates(img, 32, 4, CIFAR_MEAN, CIFAR_STD), 1e-6)
        worst = max(worst, diff)
        seen.append(where)
    check("random crop 32 padding 4 + flip + normalise: each output is one of the 81 crops x 2 flips "
          "(max diff %.2g <= 1e-6)" % worst, len(out) == len(CIFAR) and worst <= 1e-6)
    flips = sum(1 for s in seen if s[2])
    check("flip=0.5 over %d samples: both flipped (%d) and unflipped (%d) occur" % (len(seen), flips,
          len(seen) - flips), 0 < flips < len(seen))
    offsets = {s[:2] for s in seen}
    check("random crop offsets vary (%d distinct of %d)" % (len(offsets), len(seen)), len(offsets) > len(seen) // 2)

    again = run(CIFAR_TAR, CIFAR_TRAIN, seed=7)
    check("same seed: identical bytes", raw_bytes(again) == raw_bytes(out))
    replicas = run(CIFAR_TAR, dict(CIFAR_TRAIN, replicas=3), seed=7)
    check("augment with replicas: 3 gives identical bytes (per-sample random streams)",
          raw_bytes(replicas) == raw_bytes(out))
    other = run(CIFAR_TAR, CIFAR_TRAIN, seed=8)
    differ = sum(1 for a, b in zip(out, other) if not np.array_equal(a, b))
    check("different seed: different crops (%d of %d samples differ)" % (differ, len(out)),
          len(other) == len(out) and differ > len(out) // 2)

    layout = run(CIFAR_TAR, dict(CIFAR_TRAIN, layout="hwc"), seed=7)
    check("random crop with layout hwc: same draws, transposed",
          all(np.array_equal(chw(h), c) for h, c in zip(layout, out)))

    bf = run(CIFAR_TAR, dict(CIFAR_TRAIN, dtype="bfloat16"), seed=7)
    check("bfloat16 written as raw uint16 [3,32,32]", all(b.dtype == np.uint16 and b.shape == (3, 32, 32) for b in bf))
    exact = all(np.array_equal(b, bf16_bits(f)) for b, f in zip(bf, out))
    check("bfloat16 bits == numpy round-to-nearest-even of the float32 output", exact)
    # And against the float64 reference, within one bfloat16 step.
    worst = 0.0
    for b, img in zip(bf, CIFAR):
        v = (b.astype(np.uint32) << 16).view(np.float32)
        where, _ = match_candidate(v, crop_candidates(img, 32, 4, CIFAR_MEAN, CIFAR_STD), 1)
        ref = crop_candidates(img, 32, 4, CIFAR_MEAN, CIFAR_STD)[where]
        worst = max(worst, float(np.max(np.abs(v - ref) / np.maximum(np.abs(ref), 1e-3))))
    check("bfloat16 within one bfloat16 step of the reference (rel %.2g <= 2^-7)" % worst, worst <= 2 ** -7)

    u8 = run(CIFAR_TAR, {"crop": "random", "size": 28, "padding": 2, "flip": 0.5, "dtype": "uint8",
                         "layout": "hwc"}, seed=3)
    ok = True
    for o, img in zip(u8, CIFAR):
        p = pad(img, 2)
        ok &= any(np.array_equal(o, c) for t in range(36 - 28 + 1) for l in range(36 - 28 + 1)
                  for c in (p[t:t + 28, l:l + 28], p[t:t + 28, l:l + 28][:, ::-1]))
    check("uint8 random crop 28 padding 2: bytes equal one crop of the padded image", ok and len(u8) == len(CIFAR))


def test_resize():
    out = run(MIXED_TAR, {"resize": 20, "layout": "hwc"})
    worst, shapes_ok = 0.0, True
    for o, img in zip(out, MIXED):
        oh, ow = resized_size(img.shape[0], img.shape[1], 20)
        shapes_ok &= o.shape == (oh, ow, 3)
        worst = max(worst, maxdiff(o, bilinear(img, oh, ow) / 255.0))
    check("resize 20 (shorter side, torchvision sizes): PIL antialiased bilinear reference (max diff %.2g <= 1e-4)"
          % worst, shapes_ok and len(out) == len(MIXED) and worst <= 1e-4)

    out = run(MIXED_TAR, {"resize": 24, "crop": "center", "size": 20, "flip": 1,
                          "mean": ",".join(map(str, CIFAR_MEAN)), "std": ",".join(map(str, CIFAR_STD))})
    worst = 0.0
    for o, img in zip(out, MIXED):
        oh, ow = resized_size(img.shape[0], img.shape[1], 24)
        ref = center_crop(bilinear(img, oh, ow), 20)[:, ::-1]
        worst = max(worst, maxdiff(o, chw(normalise(ref, CIFAR_MEAN, CIFAR_STD))))
    check("resize 24 -> center crop 20 -> flip -> normalise, chw (max diff %.2g <= 1e-4)" % worst,
          len(out) == len(MIXED) and worst <= 1e-4)

    out = run(MIXED_TAR, {"resize": 20, "dtype": "uint8", "layout": "hwc"})
    worst = 0.0
    for o, img in zip(out, MIXED):
        oh, ow = resized_size(img.shape[0], img.shape[1], 20)
        worst = max(worst, maxdiff(o, bilinear(img, oh, ow)))
    check("resize 20 to uint8: PIL's bytes (max diff %.4g <= 0.5)" % worst,
          worst <= 0.5 + 1e-3 and all(o.dtype == np.uint8 for o in out) and len(out) == len(MIXED))


def test_random_resized():
    out = run(MIXED_TAR, {"crop": "random_resized", "size": 24})
    check("random_resized size 24: every output is float32 [3,24,24]",
          len(out) == len(MIXED) and all(o.shape == (3, 24, 24) and o.dtype == np.float32 for o in out))
    check("random_resized size 24: values stay within [0,1]",
          all(o.min() >= 0 and o.max() <= 1 for o in out))

    out = run(CIFAR_TAR, {"crop": "random_resized", "size": 24, "scale": "1,1", "ratio": "1,1"})
    worst = max(maxdiff(o, chw(bilinear(img, 24, 24) / 255.0)) for o, img in zip(out, CIFAR))
    check("random_resized with scale 1,1 ratio 1,1 = bilinear resize of the whole image (max diff %.2g)" % worst,
          len(out) == len(CIFAR) and worst <= 1e-4)

    out = run(CIFAR_TAR, {"crop": "random_resized", "size": 16, "scale": "0.25,0.25", "ratio": "1,1",
                          "dtype": "uint8", "layout": "hwc"}, seed=5)
    ok, tops = True, set()
    for o, img in zip(out, CIFAR):
        found = [(t, l) for t in range(17) for l in range(17) if np.array_equal(o, img[t:t + 16, l:l + 16])]
        ok &= bool(found)
        tops.update(found)
    check("random_resized with a 16x16 box to size 16: output is one 16x16 window of the image",
          ok and len(out) == len(CIFAR))
    check("random_resized box positions vary (%d distinct)" % len(tops), len(tops) > len(CIFAR) // 2)
    rows, cols = [t for t, _ in tops], [l for _, l in tops]
    check("random_resized box positions cover the image (top %d..%d, left %d..%d of 0..16)"
          % (min(rows), max(rows), min(cols), max(cols)),
          min(rows) <= 4 and max(rows) >= 12 and min(cols) <= 4 and max(cols) >= 12)


def test_option_errors():
    p = run(CIFAR_TAR, {"dtype": "uint8", "mean": "0.5,0.5,0.5", "std": "0.5,0.5,0.5"}, expect_ok=False)
    check("mean/std with dtype uint8 is refused with a message about mean",
          p.returncode != 0 and "mean" in p.stderr, "rc %d, stderr %r" % (p.returncode, p.stderr))
    p = run(CIFAR_TAR, {"mean": "0.5,0.5", "std": "0.5,0.5"}, expect_ok=False)
    check("2 mean values fit no decoded image: refused when the graph is loaded, before any sample",
          p.returncode != 0 and "channels" in p.stderr and "img0000" not in p.stderr,
          "rc %d, stderr %r" % (p.returncode, p.stderr))


def main():
    if not SHARDFLOW or not os.access(SHARDFLOW, os.X_OK):
        print("SHARDFLOW must name the built shardflow binary")
        return 1
    print("temp dir", TMP)
    test_center_crop()
    test_flip()
    test_normalise_and_layout()
    test_random_crop()
    test_resize()
    test_random_resized()
    test_option_errors()
    print("%d pipeline runs, %d failed checks" % (runs, len(failures)))
    if failures:
        print("inputs and outputs kept in", TMP)
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
