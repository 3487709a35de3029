#!/usr/bin/python3
"""augment's resize against PIL on Debian's python: Image.resize(size, Image.BILINEAR,
reducing_gap=None) is torchvision's default (antialiased) resize of PIL images. shardflow's
resampler (engine/codec/resize.c) uses PIL's fixed-point coefficients and pass order, so uint8
results must equal PIL's bit for bit, over several sizes and aspect ratios, down (by up to 9x:
taps in several groups of 4) and up (CIFAR 32 -> 96), one axis only, 1 and 3 channels; float32
output is numpy's (x/255 - mean)/std of PIL's uint8 result within 1e-6. Everything runs twice:
with the AVX2 kernels (where the CPU has them) and with SF_RESIZE_PORTABLE=1 (the portable C ones)."""
import os
import shutil
import tempfile

import numpy as np
from PIL import Image

import sfutil
from sfutil import Checks

check = Checks()
TMP = tempfile.mkdtemp(prefix="sf_resize_")
MAX_DIFF, MEAN_DIFF = 0, 0.0
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
rng = np.random.default_rng(15)


def photo(h, w, c):
    """Smooth gradients plus noise: closer to photographs than pure noise, and still has edges."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], -1)[..., :c]
    return np.clip(base + rng.integers(-40, 41, (h, w, c)), 0, 255).astype(np.uint8)


def pil_resize(img, w, h, box=None):
    mode = "L" if img.shape[2] == 1 else "RGB"
    im = Image.fromarray(img[..., 0] if mode == "L" else img, mode)
    out = np.asarray(im.resize((w, h), Image.BILINEAR, box=box, reducing_gap=None))
    return out.reshape(h, w, img.shape[2])


def resized_size(h, w, short):
    """torchvision Resize(int): the shorter side to `short`, the longer truncated."""
    return (short, int(short * w / h)) if h <= w else (int(short * h / w), short)


runs = 0


def run(images, augment, mode):
    """Images through decode (mode rgb/gray) -> augment -> batch 1; returns the output arrays in order."""
    global runs
    runs += 1
    d = os.path.join(TMP, f"run{runs}")
    os.makedirs(d)
    shard = sfutil.write_shard(os.path.join(d, "s.tar"),
                               [(f"{i:04d}", {"ppm": sfutil.ppm_bytes(im)}) for i, im in enumerate(images)])
    graph = sfutil.write_graph(os.path.join(d, "g.yaml"), [
        ("shard_source", {"urls": shard, "shuffle": False}), ("tar_split", {}), ("decode", {"mode": mode}),
        ("augment", augment), ("batch", {"batch_size": 1}), ("device_sink", {"npy_dir": os.path.join(d, "out")})],
        seed=3, epochs=1)
    sfutil.run(["run", graph, "--quiet", "--no-summary"])
    batches = sfutil.read_batches(os.path.join(d, "out"))
    assert [b[2] for b in batches] == [[f"{i:04d}"] for i in range(len(images))], "batches out of order"
    return [b[3]["ppm"][0] for b in batches]


def compare(what, got, want):
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    print(f"  {what}: max |diff| {diff.max()} mean {diff.mean():.4f} levels")
    check(got.shape == want.shape, f"{what}: shape {got.shape}, PIL {want.shape}")
    check(diff.max() <= MAX_DIFF and diff.mean() <= MEAN_DIFF,
          f"{what}: max |diff| {diff.max()} (<= {MAX_DIFF}), mean {diff.mean():.4f} (<= {MEAN_DIFF}) against PIL")


# (h, w) of inputs and the `resize` target of the shorter side: down by 2.2x, 3x and a little, up 3x.
SHAPES = [((375, 500), 224), ((500, 333), 100), ((97, 131), 33), ((64, 48), 47), ((32, 32), 96), ((13, 17), 40),
          ((900, 1207), 100)]


def suite(kernels):
    print(f"{kernels} kernels")
    for c, mode in ((3, "rgb"), (1, "gray")):
        images = [photo(h, w, c) for (h, w), _ in SHAPES]
        for ((h, w), short), img in zip(SHAPES, images):
            out = run([img], {"resize": short, "dtype": "uint8", "layout": "hwc"}, mode)[0]
            oh, ow = resized_size(h, w, short)
            compare(f"{c} channel {h}x{w} -> {oh}x{ow}", out, pil_resize(img, ow, oh))

    # float32 CHW normalised: numpy's arithmetic on PIL's uint8 result.
    img = photo(300, 400, 3)
    out = run([img], {"resize": 128, "crop": "center", "size": 112, "mean": list(MEAN), "std": list(STD),
                      "dtype": "float32", "layout": "chw"}, "rgb")[0]
    ref = pil_resize(img, 170, 128)
    top, left = int(round((128 - 112) / 2)), int(round((170 - 112) / 2))
    ref = (ref[top:top + 112, left:left + 112] / 255.0 - np.array(MEAN)) / np.array(STD)
    err = np.abs(out - ref.transpose(2, 0, 1)).max()
    print(f"  float32 resize 128 -> center 112 -> normalise, chw: max |diff| {err:.2g}")
    check(out.dtype == np.float32 and out.shape == (3, 112, 112), f"float32 output {out.dtype} {out.shape}")
    check(err <= 1e-6, f"float32 normalised output differs from numpy on PIL's result by {err}")

    # bfloat16 HWC with a flip: the float32 values above rounded to bfloat16 (8 significant bits).
    out = run([img], {"resize": 128, "crop": "center", "size": 112, "mean": list(MEAN), "std": list(STD),
                      "flip": 1, "dtype": "bfloat16", "layout": "hwc"}, "rgb")[0]
    got = (out.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # bfloat16 bits as float32
    want = ref[:, ::-1]
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"  bfloat16 resize 128 -> center 112 -> flip -> normalise, hwc: max |diff| {err:.2g} of the largest value")
    check(out.shape == (112, 112, 3) and err <= 2 ** -8, f"bfloat16 output differs from PIL's by {err} (> 2^-8)")

    # random resized crop: a bh x bw box resampled to size x size (up, down, or along one axis only) equals
    # PIL's crop + resize at one of the box positions (torchvision's F.resized_crop on a PIL image).
    imgs = [photo(32, 32, 3) for _ in range(4)]
    for bh, bw, size in ((20, 20, 48), (20, 20, 9), (20, 25, 20), (25, 20, 20)):
        outs = run(imgs, {"crop": "random_resized", "size": size, "scale": f"{bh * bw / 1024},{bh * bw / 1024}",
                          "ratio": f"{bw / bh},{bw / bh}", "dtype": "uint8", "layout": "hwc"}, "rgb")
        for img, out in zip(imgs, outs):
            best = min(np.abs(out.astype(int) - pil_resize(img[t:t + bh, l:l + bw], size, size)).max()
                       for t in range(33 - bh) for l in range(33 - bw))
            check(best <= MAX_DIFF,
                  f"random_resized {bh}x{bw} -> {size}: no box position matches PIL (best max {best})")
        print(f"  random_resized {bh}x{bw} box -> {size}x{size}: every sample matches PIL at its box")


try:
    suite("default")
    os.environ["SF_RESIZE_PORTABLE"] = "1"
    suite("portable")
finally:
    shutil.rmtree(TMP, ignore_errors=True)
check.done("resize")
