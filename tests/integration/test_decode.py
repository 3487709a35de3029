#!/usr/bin/python3
"""Integration test of the decode stage: images written by PIL into a tar shard with tarfile,
run through `shardflow run`, and compared with what PIL decodes from the same bytes.

Checks: JPEG (sizes incl. odd ones, 4:4:4/4:2:2/4:2:0, grayscale, progressive) within +-1 of PIL;
PNG (RGB, L, 1-bit, RGBA, LA, palette with and without tRNS, gray/RGB with tRNS), PPM, PGM, a
.ppm.gz, WebP (lossless and lossy, with and without alpha: PIL uses libwebp too) and TIFF (raw, LZW,
deflate, PackBits, JPEG, group 4; RGB, RGBA, gray, palette, 1-bit, CMYK) and GIF (first frame: palette, transparent index, gray,
interlaced, animated, a frame smaller than the screen; with `frames: all` every frame as [T, H, W, C], equal to
PIL's ImageSequence frames: partial frames, transparency, each disposal method) and JPEG 2000 (.j2k codestream and .jp2, lossless, lossy, tiled;
RGB, RGBA, gray: PIL uses openjpeg too) exactly; AVIF (lossy 4:4:4 and 4:2:0, lossless, alpha, 10-bit;
made by avifenc) exactly equal to avifdec's decode with dav1d, truncated and oversized AVIF reported;
JPEG XL (lossless, lossy XYB, alpha, gray; made by cjxl) exactly equal to djxl's decode, truncated and
oversized JPEG XL reported; in the modes keep, rgb and gray; class labels and text fields; JPEG DCT-domain
downscaling (min_size); bad samples (not a JPEG, truncated JPEG, PNG with a bad CRC, an image over
max_pixels, a bad label, corrupt gzip, truncated WebP, WebP with a bad RIFF size, WebP over max_pixels,
truncated TIFF, TIFF cut in its pixels, TIFF with a bad IFD offset, TIFF over max_pixels, truncated GIF, GIF over max_pixels, truncated JPEG 2000, JPEG 2000 over max_pixels) under error_policy skip (sample missing, message naming
shard URL, key and byte offset) and fail (non-zero exit, same message); JPEGs on which libjpeg only
warns ("2 extraneous bytes before marker 0xd9", common in ImageNet) decode to PIL's pixels, while a
truncated JPEG stays corrupt even when such a warning comes first.
"""
import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import batch_row  # noqa: E402

SHARDFLOW = os.environ.get("SHARDFLOW", "shardflow")
TMP = tempfile.mkdtemp(prefix="sf_test_decode_")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


# ---- inputs --------------------------------------------------------------------------------

rng = np.random.default_rng(20240601)


def picture(h, w, c):
    """A smooth gradient with mild noise: realistic for JPEG, varied for PNG."""
    y, x = np.mgrid[0:h, 0:w]
    planes = [x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + 2 * y) * 5 % 256, (x * y) % 256]
    a = np.stack(planes[:c], -1).astype(np.int32) + rng.integers(-12, 13, (h, w, c))
    a = np.clip(a, 0, 255).astype(np.uint8)
    return a[..., 0] if c == 1 else a


def encode(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def good_images():
    """(field, bytes) pairs, one image per sample."""
    out = []
    for h, w in [(32, 32), (17, 33), (1, 1), (97, 63)]:
        rgb = Image.fromarray(picture(h, w, 3))
        for sub in (0, 1, 2):
            out.append(("jpg", encode(rgb, "JPEG", quality=90, subsampling=sub)))
        out.append(("jpeg", encode(rgb, "JPEG", quality=80, progressive=True)))
        out.append(("jpg", encode(Image.fromarray(picture(h, w, 1)), "JPEG", quality=90)))
        out.append(("png", encode(rgb, "PNG")))
        out.append(("png", encode(Image.fromarray(picture(h, w, 1)), "PNG")))
        out.append(("png", encode(Image.fromarray(picture(h, w, 1) > 128), "PNG")))
        out.append(("png", encode(Image.fromarray(picture(h, w, 4)), "PNG")))
        out.append(("png", encode(Image.fromarray(picture(h, w, 4)[..., :2], "LA"), "PNG")))
        pal = rgb.quantize(16)
        out.append(("png", encode(pal, "PNG")))
        out.append(("png", encode(pal, "PNG", transparency=3)))
        out.append(("png", encode(Image.fromarray(picture(h, w, 1)), "PNG", transparency=40)))
        out.append(("png", encode(rgb, "PNG", transparency=(10, 20, 30))))
        out.append(("ppm", encode(rgb, "PPM")))
        out.append(("pgm", encode(Image.fromarray(picture(h, w, 1)), "PPM")))
        out.append(("ppm.gz", gzip.compress(encode(rgb, "PPM"))))
        # WebP: lossless and lossy (PIL decodes with the same libwebp, so exact), with and without alpha.
        rgba = Image.fromarray(picture(h, w, 4))
        out.append(("webp", encode(rgb, "WEBP", lossless=True)))
        out.append(("webp", encode(rgba, "WEBP", lossless=True)))
        out.append(("webp", encode(rgb, "WEBP", quality=80)))
        out.append(("webp", encode(rgba, "WEBP", quality=70)))
        # TIFF: the compressions PIL writes (through libtiff), gray, RGBA, palette, 1-bit, CMYK.
        gray = Image.fromarray(picture(h, w, 1))
        for comp in ("raw", "tiff_lzw", "tiff_adobe_deflate", "packbits"):
            out.append(("tif", encode(rgb, "TIFF", compression=comp)))
        out.append(("tiff", encode(rgba, "TIFF", compression="tiff_lzw")))
        out.append(("tif", encode(gray, "TIFF")))
        out.append(("tif", encode(gray, "TIFF", compression="tiff_deflate")))
        out.append(("tif", encode(Image.fromarray(picture(h, w, 1) > 128), "TIFF", compression="group4")))
        out.append(("tif", encode(Image.fromarray(picture(h, w, 1) > 128), "TIFF")))
        out.append(("tif", encode(pal, "TIFF")))
        out.append(("tif", encode(rgb, "TIFF", compression="jpeg", quality=90)))
        out.append(("tif", encode(rgb.convert("CMYK"), "TIFF", compression="tiff_lzw")))
        # GIF, first frame: palette, palette with a transparent index, gray, interlaced.
        out.append(("gif", encode(pal, "GIF")))
        out.append(("gif", encode(pal, "GIF", transparency=3)))
        out.append(("gif", encode(gray, "GIF")))
        out.append(("gif", encode(rgb.quantize(200), "GIF", interlace=True)))
    # JPEG 2000, codestream (.j2k) and JP2 (.jp2), lossless and lossy: PIL uses openjpeg too.
    for h, w in [(32, 32), (17, 33), (1, 1)]:
        rgb = Image.fromarray(picture(h, w, 3))
        out.append(("j2k", encode(rgb, "JPEG2000", no_jp2=True)))
        out.append(("jp2", encode(rgb, "JPEG2000", quality_mode="rates", quality_layers=[20], irreversible=True)))
        out.append(("jp2", encode(Image.fromarray(picture(h, w, 4)), "JPEG2000")))
        out.append(("j2k", encode(Image.fromarray(picture(h, w, 1)), "JPEG2000", no_jp2=True)))
    out.append(("jp2", encode(Image.fromarray(picture(64, 80, 3)), "JPEG2000", tile_size=(32, 32))))
    # An animated GIF: the first frame only (PIL's first frame).
    frames = [Image.fromarray(picture(20, 24, 3)).quantize(32) for _ in range(3)]
    out.append(("gif", encode(frames[0], "GIF", save_all=True, append_images=frames[1:])))
    # A frame smaller than the screen, placed at (2, 1): the rest is the transparent index (or 0).
    for kw in ({}, {"transparency": 5}):
        small = bytearray(encode(Image.fromarray(picture(3, 4, 3)).quantize(8), "GIF", **kw))
        at = small.index(b",\0\0\0\0\x04\0\x03\0")
        small[6:10] = b"\x0a\0\x08\0"  # screen 10x8
        small[at + 1 : at + 5] = b"\x02\0\x01\0"
        out.append(("gif", bytes(small)))
    out.append(("seg.png", encode(Image.fromarray(picture(9, 11, 3)), "PNG")))
    # Content decides, as in PIL: a PNG stored under .jpg decodes as the PNG it is.
    out.append(("jpg", encode(Image.fromarray(picture(6, 5, 3)), "PNG")))
    # A header with comments.
    a = picture(5, 7, 3)
    out.append(("ppm", b"P6\n# made by hand\n7 # width\n5\n#x\n255\n" + a.tobytes()))
    return out


def write_shard(path, samples):
    """samples: list of (key, [(field, bytes)]). Returns {key: byte offset of its first header}."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in samples:
            for field, data in fields:
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                info.mtime = 1700000000
                tar.addfile(info, io.BytesIO(data))
    offsets = {}
    with tarfile.open(path, "r") as tar:
        for m in tar.getmembers():
            offsets.setdefault(m.name.split(".", 1)[0], m.offset)
    return offsets


def write_graph(shard, out_dir, mode="keep", policy="fail", extra=None, replicas=1, settings=None):
    lines = [f"{k}: {v}" for k, v in (settings or {}).items()]
    lines += [
        "seed: 1",
        "epochs: 1",
        f"error_policy: {policy}",
        "stages:",
        "  - type: shard_source",
        f"    urls: {shard}",
        "    shuffle: false",
        "  - type: tar_split",
        "  - type: decode",
        f"    replicas: {replicas}",
        f"    mode: {mode}",
    ]
    lines += [f"    {k}: {v}" for k, v in (extra or {}).items()]
    lines += [
        "  - type: batch",
        "    batch_size: 1",
        "  - type: device_sink",
        f"    npy_dir: {out_dir}",
    ]
    path = out_dir + ".yaml"
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def run(graph):
    p = subprocess.run([SHARDFLOW, "run", graph, "--quiet"], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def read_output(out_dir):
    """{key: {field: array}} from the device sink's .npy dumps (batch_size 1; a ragged field's own values)."""
    result = {}
    if not os.path.isdir(out_dir):
        return result
    for name in sorted(os.listdir(out_dir)):
        if not name.endswith("_keys.txt"):
            continue
        prefix = name[: -len("keys.txt")]
        with open(os.path.join(out_dir, name)) as f:
            keys = f.read().split()
        fields = {}
        for other in os.listdir(out_dir):
            if other.startswith(prefix) and other.endswith(".npy"):
                fields[other[len(prefix) : -4]] = np.load(os.path.join(out_dir, other))
        for i, key in enumerate(keys):
            result[key] = batch_row(fields, i)  # txt: ragged by default
    return result


# ---- references (PIL) ------------------------------------------------------------------------


def reference(data, mode):
    """What PIL makes of these bytes in our mode, as uint8 [H, W, C]."""
    im = Image.open(io.BytesIO(data))
    if im.format == "JPEG":
        if mode == "gray":
            im.draft("L", im.size)  # libjpeg's own YCbCr->gray, as TurboJPEG's TJPF_GRAY
            target = "L"
        elif mode == "keep":
            target = "L" if im.mode == "L" else "RGB"
        else:
            target = "RGB"
    else:
        alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
        if mode == "keep":
            target = "RGBA" if alpha else ("L" if im.mode in ("L", "1") else "RGB")
        else:
            target = "RGB" if mode == "rgb" else "L"
    a = np.array(im.convert(target))
    return a[..., None] if a.ndim == 2 else a


def compare(got, ref, tolerance, what):
    if not check(got.shape == ref.shape and got.dtype == np.uint8,
                 f"{what}: shape {got.shape} {got.dtype} vs PIL {ref.shape}"):
        return
    diff = int(np.abs(got.astype(np.int32) - ref.astype(np.int32)).max()) if got.size else 0
    check(diff <= tolerance, f"{what}: max difference {diff} to PIL (allowed {tolerance})")


# ---- tests ---------------------------------------------------------------------------------


def test_good_images():
    images = good_images()
    samples = []
    for i, (field, data) in enumerate(images):
        fields = [(field, data), ("cls", f" {i * 7 - 3}\n".encode())]
        if i % 5 == 0:
            fields.append(("txt", f"caption {i}".encode()))
        samples.append((f"{i:07d}", fields))
    shard = os.path.join(TMP, "good-000.tar")
    write_shard(shard, samples)
    for mode, replicas in (("keep", 1), ("rgb", 2), ("gray", 1)):
        out = os.path.join(TMP, f"good_{mode}")
        code, _, err = run(write_graph(shard, out, mode=mode, replicas=replicas))
        if not check(code == 0, f"mode {mode}: run succeeds (exit {code})"):
            print(err)
            continue
        got = read_output(out)
        check(sorted(got) == [k for k, _ in samples], f"mode {mode}: every sample arrives ({len(got)})")
        for (key, fields), (field, data) in zip(samples, images):
            if key not in got:
                continue
            name = field[:-3] if field.endswith(".gz") else field
            raw = gzip.decompress(data) if field.endswith(".gz") else data
            if not check(name in got[key], f"mode {mode} key {key}: field {name} present"):
                continue
            fmt = Image.open(io.BytesIO(raw)).format
            compare(got[key][name], reference(raw, mode), 1 if fmt == "JPEG" else 0,
                    f"mode {mode} key {key} {name} ({fmt})")
            label = got[key].get("cls")
            check(label is not None and label.dtype == np.int64 and label.shape == ()
                  and int(label) == int(key) * 7 - 3, f"mode {mode} key {key}: cls is int64 {int(key) * 7 - 3}")
            if "txt" in dict(fields):
                txt = got[key].get("txt")
                check(txt is not None and txt.tobytes() == dict(fields)["txt"], f"mode {mode} key {key}: txt bytes kept")


def expected_scaled(w, h, min_size):
    """TurboJPEG scales by n/8; the smallest n whose both sides stay >= min_size (never up)."""
    for n in range(1, 9):
        sw, sh = -(-w * n // 8), -(-h * n // 8)
        if sw >= min_size and sh >= min_size:
            return sw, sh
    return w, h


def test_min_size():
    min_size = 50
    cases = [(256, 200), (160, 160), (40, 30), (333, 517)]
    samples = []
    for i, (w, h) in enumerate(cases):
        samples.append((f"{i:07d}", [("jpg", encode(Image.fromarray(picture(h, w, 3)), "JPEG", quality=90))]))
    samples.append(("0000099", [("png", encode(Image.fromarray(picture(120, 90, 3)), "PNG"))]))
    shard = os.path.join(TMP, "scale-000.tar")
    write_shard(shard, samples)
    out = os.path.join(TMP, "scale")
    code, _, err = run(write_graph(shard, out, mode="rgb", extra={"min_size": min_size}))
    if not check(code == 0, f"min_size: run succeeds (exit {code})"):
        print(err)
        return
    got = read_output(out)
    for i, (w, h) in enumerate(cases):
        key = f"{i:07d}"
        sw, sh = expected_scaled(w, h, min_size)
        a = got.get(key, {}).get("jpg")
        if not check(a is not None and a.shape == (sh, sw, 3),
                     f"min_size {min_size}: {w}x{h} decodes to {sw}x{sh} (got {None if a is None else a.shape})"):
            continue
        if w % sw == 0 and h % sh == 0 and (w // sw) in (1, 2, 4, 8) and w // sw == h // sh:
            # PIL's draft() uses the same libjpeg DCT scaling for 1/2, 1/4, 1/8.
            im = Image.open(io.BytesIO(samples[i][1][0][1]))
            im.draft("RGB", (sw, sh))
            compare(a, np.array(im.convert("RGB")), 1, f"min_size {w}x{h} pixels vs PIL draft")
    png = got.get("0000099", {}).get("png")
    check(png is not None and png.shape == (120, 90, 3), "min_size leaves PNGs at full size")


def bad_cases():
    jpg = encode(Image.fromarray(picture(64, 48, 3)), "JPEG", quality=90)
    png = bytearray(encode(Image.fromarray(picture(40, 30, 3)), "PNG"))
    i = png.index(b"IDAT")
    length = int.from_bytes(png[i - 4 : i], "big")
    png[i + 4 + length] ^= 0xFF  # first byte of the IDAT chunk's CRC
    big = encode(Image.fromarray(picture(400, 300, 3)), "PNG")  # 120,000 pixels > max_pixels 100000
    webp = encode(Image.fromarray(picture(40, 30, 3)), "WEBP", quality=80)
    tif = encode(Image.fromarray(picture(40, 30, 3)), "TIFF", compression="tiff_lzw")
    tif_raw = encode(Image.fromarray(picture(40, 30, 3)), "TIFF")
    gif = encode(Image.fromarray(picture(40, 30, 3)).quantize(64), "GIF")
    jp2 = encode(Image.fromarray(picture(40, 30, 3)), "JPEG2000")
    return [
        ("not a JPEG", [("jpg", b"this is not a JPEG at all\n")]),
        ("truncated JPEG", [("jpg", jpg[: len(jpg) // 2])]),
        # Fails inside the header; the good JPEG after it must still decode (decoder state reset).
        ("JPEG cut before its first scan", [("jpg", jpg[: jpg.index(b"\xff\xda")])]),
        ("PNG with a bad CRC", [("png", bytes(png))]),
        ("image over max_pixels", [("png", big)]),
        ("truncated WebP", [("webp", webp[: len(webp) // 2])]),
        ("WebP with a bad RIFF size", [("webp", webp[:4] + b"\xff\xff\xff\x7f" + webp[8:])]),
        ("WebP over max_pixels", [("webp", encode(Image.fromarray(picture(400, 300, 3)), "WEBP", lossless=True))]),
        ("truncated TIFF", [("tif", tif[: len(tif) * 2 // 3])]),
        # PIL's own writer puts the IFD first: this one is cut inside its pixels.
        ("TIFF cut in its pixels", [("tif", tif_raw[: len(tif_raw) * 2 // 3])]),
        ("truncated GIF", [("gif", gif[: len(gif) // 2])]),
        ("GIF over max_pixels", [("gif", encode(Image.fromarray(picture(400, 300, 1)), "GIF"))]),
        ("truncated JPEG 2000", [("jp2", jp2[: len(jp2) * 2 // 3])]),
        ("JPEG 2000 over max_pixels", [("j2k", encode(Image.fromarray(picture(400, 300, 1)), "JPEG2000", no_jp2=True))]),
        ("TIFF with a bad first IFD offset", [("tif", tif[:4] + b"\xff\xff\xff\x7f" + tif[8:])]),
        ("TIFF over max_pixels", [("tif", encode(Image.fromarray(picture(400, 300, 1)), "TIFF", compression="tiff_lzw"))]),
        ("bad class label", [("ppm", encode(Image.fromarray(picture(4, 4, 3)), "PPM")), ("cls", b"seven")]),
        ("corrupt gzip", [("ppm.gz", gzip.compress(b"P6 4 4 255\n" + bytes(48))[:-9] + b"garbage!!")]),
    ]


def good_sample(i):
    return [("jpg", encode(Image.fromarray(picture(8 + i, 9, 3)), "JPEG")), ("cls", str(i).encode())]


def message_line(stderr, url, key, offset):
    """The stderr line naming the shard URL, the key and the byte offset, or None."""
    for line in stderr.splitlines():
        if url in line and key in line and re.search(rf"\b{offset}\b", line.replace(url, "").replace(key, "")):
            return line
    return None


def test_bad_input_skip():
    cases = bad_cases()
    samples, bad_keys = [], []
    for i, (what, fields) in enumerate(cases):
        samples.append((f"{2 * i:07d}", good_sample(i)))
        samples.append((f"{2 * i + 1:07d}", fields))
        bad_keys.append((f"{2 * i + 1:07d}", what))
    samples.append(("0000999", good_sample(99)))
    shard = os.path.join(TMP, "bad-000.tar")
    offsets = write_shard(shard, samples)
    out = os.path.join(TMP, "bad_skip")
    code, _, err = run(write_graph(shard, out, policy="skip", extra={"max_pixels": 100000}))
    if not check(code == 0, f"skip: run succeeds (exit {code})"):
        print(err)
    got = read_output(out)
    good_keys = sorted(k for k, _ in samples if k not in dict(bad_keys))
    check(sorted(got) == good_keys, f"skip: exactly the good samples arrive ({sorted(got)})")
    for key, what in bad_keys:
        line = message_line(err, shard, key, offsets[key])
        check(line is not None, f"skip: {what} reported with URL, key {key} and offset {offsets[key]}: {line}")


def test_bad_input_fail():
    for i, (what, fields) in enumerate(bad_cases()):
        samples = [("0000000", good_sample(0)), ("0000001", fields), ("0000002", good_sample(2))]
        shard = os.path.join(TMP, f"fail{i}-000.tar")
        offsets = write_shard(shard, samples)
        out = os.path.join(TMP, f"bad_fail{i}")
        code, _, err = run(write_graph(shard, out, policy="fail", extra={"max_pixels": 100000}))
        check(code != 0, f"fail: {what} stops the run (exit {code})")
        line = message_line(err, shard, "0000001", offsets["0000001"])
        check(line is not None, f"fail: {what} message names URL, key and offset {offsets['0000001']}: {line}")


def avif_encode(im, *args):
    """An AVIF made by libavif's own avifenc from a PNG of im (PIL does not write AVIF)."""
    src, dst = os.path.join(TMP, "avif_in.png"), os.path.join(TMP, "avif_out.avif")
    im.save(src)
    subprocess.run(["avifenc", "-s", "10", *args, src, dst], check=True, capture_output=True)
    with open(dst, "rb") as f:
        return f.read()


def avif_reference(data, mode):
    """What libavif's avifdec (dav1d, 8-bit PNG out) makes of these bytes, in our mode."""
    src, dst = os.path.join(TMP, "ref_in.avif"), os.path.join(TMP, "ref_out.png")
    with open(src, "wb") as f:
        f.write(data)
    subprocess.run(["avifdec", "-c", "dav1d", "-d", "8", src, dst], check=True, capture_output=True)
    im = Image.open(dst)
    target = {"keep": im.mode if im.mode in ("RGB", "RGBA") else "RGB", "rgb": "RGB", "gray": "L"}[mode]
    a = np.array(im.convert(target))
    return a[..., None] if a.ndim == 2 else a


def test_avif():
    """AVIF (libavif with dav1d) equals avifdec's decode exactly; damaged and oversized ones are error records."""
    images = []
    for h, w in [(32, 32), (17, 33), (1, 1)]:
        rgb = Image.fromarray(picture(h, w, 3))
        images.append(avif_encode(rgb))                          # lossy 4:4:4
        images.append(avif_encode(rgb, "-y", "420"))             # lossy 4:2:0: chroma upsampled
        images.append(avif_encode(rgb, "-l"))                    # lossless
        images.append(avif_encode(Image.fromarray(picture(h, w, 4)), "-y", "420"))
        images.append(avif_encode(rgb, "-d", "10"))              # 10-bit, decoded to 8
    samples = [(f"{i:07d}", [("avif", data)]) for i, data in enumerate(images)]
    good = avif_encode(Image.fromarray(picture(40, 30, 3)))
    bad = {"0000900": ("truncated AVIF", good[: len(good) * 2 // 3]),
           "0000901": ("AVIF over max_pixels", avif_encode(Image.fromarray(picture(400, 300, 3))))}
    samples += [(k, [("avif", data)]) for k, (_, data) in bad.items()]
    shard = os.path.join(TMP, "avif-000.tar")
    offsets = write_shard(shard, samples)
    for mode in ("keep", "rgb", "gray"):
        out = os.path.join(TMP, f"avif_{mode}")
        code, _, err = run(write_graph(shard, out, mode=mode, policy="skip", extra={"max_pixels": 100000}))
        check(code == 0, f"avif {mode}: run succeeds (exit {code})")
        got = read_output(out)
        check(sorted(got) == [f"{i:07d}" for i in range(len(images))], f"avif {mode}: the good samples arrive")
        for i, data in enumerate(images):
            a = got.get(f"{i:07d}", {}).get("avif")
            if check(a is not None, f"avif {mode} {i}: decoded"):
                compare(a, avif_reference(data, mode), 0, f"avif {mode} {i} vs avifdec")
        for key, (what, _) in bad.items():
            line = message_line(err, shard, key, offsets[key])
            check(line is not None, f"avif {mode}: {what} reported with URL, key and offset: {line}")


def jxl_encode(im, *args):
    """A JPEG XL made by libjxl's own cjxl from a PNG of im (PIL does not write JPEG XL)."""
    src, dst = os.path.join(TMP, "jxl_in.png"), os.path.join(TMP, "jxl_out.jxl")
    im.save(src)
    subprocess.run(["cjxl", "-e", "3", *args, src, dst], check=True, capture_output=True)
    with open(dst, "rb") as f:
        return f.read()


def jxl_reference(data, mode):
    """What libjxl's djxl (PNG out) makes of these bytes, in our mode."""
    src, dst = os.path.join(TMP, "ref_in.jxl"), os.path.join(TMP, "ref_out.png")
    with open(src, "wb") as f:
        f.write(data)
    subprocess.run(["djxl", src, dst], check=True, capture_output=True)
    im = Image.open(dst)
    alpha = im.mode in ("RGBA", "LA")
    target = {"keep": "RGBA" if alpha else ("L" if im.mode == "L" else "RGB"), "rgb": "RGB", "gray": "L"}[mode]
    a = np.array(im.convert(target))
    return a[..., None] if a.ndim == 2 else a


def test_jxl():
    """JPEG XL (libjxl) equals djxl's decode; damaged and oversized ones are error records."""
    images = []
    for h, w in [(32, 32), (17, 33), (1, 1)]:
        rgb = Image.fromarray(picture(h, w, 3))
        images.append(jxl_encode(rgb, "-d", "0"))                               # lossless
        images.append(jxl_encode(rgb, "-d", "1"))                               # lossy (XYB)
        images.append(jxl_encode(Image.fromarray(picture(h, w, 4)), "-d", "0"))  # alpha
        images.append(jxl_encode(Image.fromarray(picture(h, w, 1)), "-d", "0"))  # gray
    samples = [(f"{i:07d}", [("jxl", data)]) for i, data in enumerate(images)]
    good = jxl_encode(Image.fromarray(picture(40, 30, 3)), "-d", "0")
    bad = {"0000900": ("truncated JPEG XL", good[: len(good) * 2 // 3]),
           "0000901": ("JPEG XL over max_pixels", jxl_encode(Image.fromarray(picture(400, 300, 3)), "-d", "1"))}
    samples += [(k, [("jxl", data)]) for k, (_, data) in bad.items()]
    shard = os.path.join(TMP, "jxl-000.tar")
    offsets = write_shard(shard, samples)
    for mode in ("keep", "rgb", "gray"):
        out = os.path.join(TMP, f"jxl_{mode}")
        code, _, err = run(write_graph(shard, out, mode=mode, policy="skip", extra={"max_pixels": 100000}))
        check(code == 0, f"jxl {mode}: run succeeds (exit {code})")
        got = read_output(out)
        check(sorted(got) == [f"{i:07d}" for i in range(len(images))], f"jxl {mode}: the good samples arrive")
        for i, data in enumerate(images):
            a = got.get(f"{i:07d}", {}).get("jxl")
            if check(a is not None, f"jxl {mode} {i}: decoded"):
                compare(a, jxl_reference(data, mode), 0, f"jxl {mode} {i} vs djxl")
        for key, (what, _) in bad.items():
            line = message_line(err, shard, key, offsets[key])
            check(line is not None, f"jxl {mode}: {what} reported with URL, key and offset: {line}")


def with_slack(jpeg, at):
    """The JPEG with 16 extraneous bytes at `at` (just before a marker): libjpeg warns "Corrupt JPEG
    data: N extraneous bytes before marker" (N < 16 before EOI, where the Huffman decoder's bit
    buffer swallows a few), PIL does not mind."""
    return jpeg[:at] + bytes(range(1, 17)) + jpeg[at:]


def test_jpeg_warnings():
    rgb = Image.fromarray(picture(37, 45, 3))
    gray = Image.fromarray(picture(37, 45, 1))
    clean = [encode(rgb, "JPEG", quality=90), encode(rgb, "JPEG", quality=85, progressive=True),
             encode(gray, "JPEG", quality=90)]
    good = [with_slack(j, len(j) - 2) for j in clean]  # ImageNet's case: slack before EOI (0xd9)
    base, prog = clean[0], clean[1]
    second_scan = prog.index(b"\xff\xda", prog.index(b"\xff\xda") + 2)
    bad = [
        ("truncated JPEG", base[: len(base) - 40]),
        ("truncated progressive JPEG", prog[: len(prog) * 2 // 3]),
        # The data runs out inside the scan, though an EOI marker follows ("premature end of data segment").
        ("JPEG missing the end of its scan", base[: len(base) * 2 // 3] + b"\xff\xd9"),
        # A harmless warning first must not hide the truncation after it.
        ("slack between scans, then truncated", with_slack(prog, second_scan)[: len(prog) * 2 // 3]),
    ]
    samples = [(f"{i:07d}", [("jpg", data)]) for i, data in enumerate(good)]
    samples += [(f"{10 + i:07d}", [("jpg", data)]) for i, (_, data) in enumerate(bad)]
    shard = os.path.join(TMP, "warn-000.tar")
    offsets = write_shard(shard, samples)
    for i, (data, ref) in enumerate(zip(good, clean)):
        # The reference itself: PIL decodes the slack version to the clean version's pixels.
        same = np.array_equal(np.array(Image.open(io.BytesIO(data))), np.array(Image.open(io.BytesIO(ref))))
        check(same, f"jpeg warnings: PIL decodes slack JPEG {i} like the clean one")
    out = os.path.join(TMP, "warn")
    # 4 of 7 samples are bad on purpose: lift the error budget that would stop such a run
    code, _, err = run(write_graph(shard, out, mode="keep", policy="skip", settings={"max_error_rate": 1}))
    check(code == 0, f"jpeg warnings: run succeeds (exit {code})")
    got = read_output(out)
    check(sorted(got) == [f"{i:07d}" for i in range(len(good))],
          f"jpeg warnings: the slack JPEGs arrive, the truncated ones do not ({sorted(got)})")
    for i, data in enumerate(good):
        a = got.get(f"{i:07d}", {}).get("jpg")
        if check(a is not None, f"jpeg warnings: slack JPEG {i} decoded"):
            compare(a, reference(data, "keep"), 1, f"jpeg warnings: slack JPEG {i}")
    for i, (what, _) in enumerate(bad):
        key = f"{10 + i:07d}"
        line = message_line(err, shard, key, offsets[key])
        check(line is not None and "corrupt JPEG" in line, f"jpeg warnings: {what} reported as corrupt: {line}")
    counted = re.search(r"(\d+) sample\(s\) skipped", err)
    check(counted is not None and int(counted.group(1)) == len(bad),
          f"jpeg warnings: {len(bad)} skipped samples counted ({counted and counted.group(0)})")


def test_libraries_on_first_use():
    """libavif and libjxl are opened when the first AVIF / JPEG XL arrives, not at start-up: a run of PPM and PNG
    fields never loads them (the loader's own log, LD_DEBUG=libs, says which libraries it initialised)."""
    rgb = Image.fromarray(picture(24, 20, 3))
    plain = os.path.join(TMP, "plain-000.tar")
    write_shard(plain, [(f"{i:07d}", [("ppm", encode(rgb, "PPM")), ("png", encode(rgb, "PNG"))]) for i in range(3)])
    avif = os.path.join(TMP, "lazy-avif-000.tar")
    write_shard(avif, [("0000000", [("avif", avif_encode(rgb))])])
    for shard, loaded, absent in ((plain, [], ["libavif", "libjxl"]), (avif, ["libavif"], ["libjxl"])):
        graph = write_graph(shard, os.path.join(TMP, "lazy_out"))
        p = subprocess.run([SHARDFLOW, "run", graph, "--quiet"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "LD_DEBUG": "libs"})
        check(p.returncode == 0, f"first use {os.path.basename(shard)}: run succeeds ({p.stderr[-300:]})")
        inits = [l for l in p.stderr.splitlines() if "calling init:" in l]
        check(any("libc.so" in l for l in inits), f"first use: the loader's log is there ({len(inits)} inits)")
        for lib in loaded:
            check(any(lib in l for l in inits), f"first use {os.path.basename(shard)}: {lib} loaded")
        for lib in absent:
            check(not any(lib in l for l in inits), f"first use {os.path.basename(shard)}: {lib} not loaded")


def gif_sequences():
    """Animated GIFs as PIL writes them: whole frames; frames that PIL crops to what changed (smaller than the
    screen); transparent indices with each disposal method (none, background, previous, and a frame that gives
    none after one that did); an interlaced one."""
    out = []
    base = picture(24, 30, 3)
    moving = []
    for t in range(4):
        a = base.copy()
        a[4 + t * 3: 10 + t * 3, 5 + t * 4: 13 + t * 4] = [250, 20 * t, 40]  # a box that moves: partial frames
        moving.append(Image.fromarray(a).quantize(64))
    out.append(encode(moving[0], "GIF", save_all=True, append_images=moving[1:]))
    whole = [Image.fromarray(picture(16, 20, 3)).quantize(32) for _ in range(3)]
    out.append(encode(whole[0], "GIF", save_all=True, append_images=whole[1:], interlace=True))
    for disposal in (0, 1, 2, 3, [2, 0, 3, 1]):
        frames = []
        for t in range(4):
            a = np.zeros((20, 26, 4), np.uint8)
            a[..., :3] = picture(20, 26, 3)
            a[..., 3] = 255
            a[2 + t: 12 + t, 3 + 2 * t: 15 + 2 * t, 3] = 0  # a transparent hole that moves
            frames.append(Image.fromarray(a, "RGBA"))
        out.append(encode(frames[0], "GIF", save_all=True, append_images=frames[1:], disposal=disposal,
                          transparency=0, optimize=False))
    return out


def test_gif_frames():
    """decode frames: all turns a GIF into uint8 [T, H, W, C], each frame what PIL's ImageSequence gives
    (converted to RGB, to L in mode gray, to RGBA in mode keep when the first frame has a transparent index);
    the default stays the first frame [H, W, C]."""
    from PIL import ImageSequence
    gifs = gif_sequences()
    shard = os.path.join(TMP, "gif-frames-000.tar")
    write_shard(shard, [(f"{i:07d}", [("gif", data)]) for i, data in enumerate(gifs)])
    for mode, target in (("rgb", "RGB"), ("gray", "L"), ("keep", None)):
        out = os.path.join(TMP, f"gif_frames_{mode}")
        code, _, err = run(write_graph(shard, out, mode=mode, extra={"frames": "all"}))
        if not check(code == 0, f"gif frames {mode}: run succeeds (exit {code}): {err.strip()[-300:]}"):
            continue
        got = read_output(out)
        for i, data in enumerate(gifs):
            im = Image.open(io.BytesIO(data))
            # keep: RGBA when the first frame has a transparent index (PIL's frames are RGBA then), else RGB.
            want = target or ("RGBA" if "transparency" in im.info else "RGB")
            ref = np.stack([np.array(f.convert(want)) for f in ImageSequence.Iterator(im)])
            ref = ref[..., None] if ref.ndim == 3 else ref
            check(ref.shape[0] > 1, f"gif {i}: PIL sees {ref.shape[0]} frames")
            compare(got.get(f"{i:07d}", {}).get("gif", np.zeros(0, np.uint8)), ref, 0, f"gif frames {mode} {i}")
    out = os.path.join(TMP, "gif_first")
    code, _, err = run(write_graph(shard, out, mode="rgb"))
    got = read_output(out)
    for i, data in enumerate(gifs):
        compare(got.get(f"{i:07d}", {}).get("gif", np.zeros(0, np.uint8)), reference(data, "rgb"), 0,
                f"gif {i}: the first frame by default")


def main():
    if not os.path.exists(SHARDFLOW):
        print(f"SHARDFLOW={SHARDFLOW} does not exist; build the CLI first")
        return 1
    test_good_images()
    test_min_size()
    test_bad_input_skip()
    test_bad_input_fail()
    test_jpeg_warnings()
    test_avif()
    test_jxl()
    test_libraries_on_first_use()
    test_gif_frames()
    if failures:
        print(f"{len(failures)} failure(s); temp files kept in {TMP}")
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    print("all decode checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
