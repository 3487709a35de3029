#!/usr/bin/python3
"""Integration test of decode's newer decoders against independent references.

.npy/.npz: arrays written by numpy (np.save with format versions 1.0/2.0/3.0, Fortran order, a
hand-made header that misaligns the data, np.savez and np.savez_compressed) must come out of the
device sink equal to numpy.load of the same bytes; float64 and big-endian arrays are refused with a
message naming the key, the field and the dtype. 16-bit PNG, PGM, TIFF and JPEG 2000 at depth 16/native: equal to
PIL (mode I) or to numpy reading the raw big-endian samples ('>u2'), and a 16-bit RGB PNG made here
with zlib (not libspng); depth 16 on an 8-bit image is PIL's pixels times 257. CMYK JPEG (written by
PIL) within +-1 of PIL's convert('RGB') (0 seen: the formula is Pillow's; YCCK is not tested, PIL
cannot write it). txt: accepted exactly when Python's bytes.decode('utf-8') accepts, the error's
byte offset is UnicodeDecodeError.start; json: accepted exactly when Python's json.loads accepts
(documents without NaN/Infinity, which Python allows and JSON does not), the error names Python's
line. A stored .npz with a flipped data byte is refused (libzip's CRC check).
"""
import io
import json
import os
import shutil
import re
import struct
import sys
import tempfile
import zlib

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sfutil import Checks, batch_row, read_batches, run, write_graph, write_shard  # noqa: E402

TMP = tempfile.mkdtemp(prefix="sf_test_decoders_")
check = Checks()


def decode(name, samples, policy="fail", **opts):
    """Runs shard_source -> tar_split -> decode(opts) -> batch 1 -> device_sink on samples.
    Returns ({key: {field: array}}, stderr, exit code)."""
    shard = write_shard(os.path.join(TMP, name + ".tar"), samples)
    out = os.path.join(TMP, name)
    graph = write_graph(out + ".yaml", [
        ("shard_source", dict(urls=shard, shuffle=False)), ("tar_split", {}), ("decode", opts),
        ("batch", dict(batch_size=1)), ("device_sink", dict(npy_dir=out))], seed=1, epochs=1, error_policy=policy,
        max_error_rate=1)
    p = run(["run", graph, "--quiet"], check=False)
    got = {keys[0]: batch_row(fields, 0) for _, _, keys, fields in read_batches(out)}
    return got, p.stderr, p.returncode


def npy_bytes(a, version=None):
    b = io.BytesIO()
    np.lib.format.write_array(b, a, version=version)
    return b.getvalue()


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_npy():
    rng = np.random.default_rng(3)
    arrays = {
        "u1": rng.integers(0, 256, (4, 5, 3)).astype("|u1"),
        "u2": rng.integers(0, 65536, (7,)).astype("<u2"),
        "i4": rng.integers(-2**31, 2**31, (2, 3)).astype("<i4"),
        "i8": np.array(-1234567890123, "<i8"),  # a scalar
        "f4": rng.standard_normal((3, 2, 2, 2)).astype("<f4"),
        "fortran": np.asfortranarray(rng.standard_normal((3, 4, 2)).astype("<f4")),
        "empty": np.zeros((0, 3), "<i4"),
    }
    samples = [(k, {"npy": npy_bytes(a)}) for k, a in arrays.items()]
    samples += [("v2", {"npy": npy_bytes(arrays["f4"], (2, 0))}), ("v3", {"npy": npy_bytes(arrays["i4"], (3, 0))})]
    # A valid header of odd length (numpy pads to 64; the format does not require it): misaligned data.
    a = arrays["f4"]
    d = repr({"descr": "<f4", "fortran_order": False, "shape": a.shape}).encode() + b"\n"
    d += b" " * (1 - (10 + len(d)) % 2)  # odd total: the floats start at an odd offset
    odd = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d + a.tobytes()
    samples.append(("odd", {"npy": odd}))
    got, err, code = decode("npy", samples)
    check(code == 0, f"npy: run succeeds: {err}")
    for key, fields in samples:
        ref = np.load(io.BytesIO(fields["npy"]))
        check(key in got and same(got[key]["npy"], ref), f"npy {key}: equals numpy.load ({ref.dtype} {ref.shape})")


def test_npz():
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 1000, (5, 6)).astype("<i4"), rng.standard_normal((2, 3)).astype("<f4")
    samples = []
    for key, save in (("stored", np.savez), ("deflated", np.savez_compressed)):
        b = io.BytesIO()
        save(b, x=x, y=y, fortran=np.asfortranarray(y))
        samples.append((key, {"npz": b.getvalue()}))
    got, err, code = decode("npz", samples)
    check(code == 0, f"npz: run succeeds: {err}")
    for key, fields in samples:
        ref = np.load(io.BytesIO(fields["npz"]))
        check(key in got and sorted(got[key]) == ["npz.fortran", "npz.x", "npz.y"],
              f"npz {key}: one field FIELD.ARRAY per array: {sorted(got.get(key, {}))}")
        for name in ref.files:
            check(same(got[key]["npz." + name], ref[name]), f"npz {key}: array {name} equals numpy.load")


def crc_broken():
    """A stored .npz with one data byte changed: libzip's CRC check must catch it."""
    b = io.BytesIO()
    np.savez(b, x=np.arange(64, dtype="<i4"))
    data = bytearray(b.getvalue())
    at = data.index(np.arange(64, dtype="<i4").tobytes())
    data[at + 9] ^= 0xFF
    return bytes(data)


def test_refused():
    b = io.BytesIO()
    np.savez(b, ok=np.arange(3, dtype="<i4"), bad=np.arange(3, dtype="<f8"))
    cases = [("f8", "npy", npy_bytes(np.arange(3.0)), "'<f8'"), ("be", "npy", npy_bytes(np.arange(3, dtype=">i4")), "'>i4'"),
             ("npzf8", "npz", b.getvalue(), "'<f8'"), ("trunc", "npy", npy_bytes(np.arange(30, dtype="<i4"))[:-5], "truncated"),
             ("notzip", "npz", b"PK\x03\x04 nothing here", "npz"), ("crc", "npz", crc_broken(), "CRC")]
    samples = [(k, {f: data}) for k, f, data, _ in cases] + [("good", {"npy": npy_bytes(np.arange(3, dtype="<i4"))})]
    got, err, code = decode("refused", samples, policy="skip")
    check(code == 0 and sorted(got) == ["good"], f"refused: only the good sample arrives ({sorted(got)})")
    for key, field, _, what in cases:
        line = next((ln for ln in err.splitlines() if f"(key {key})" in ln and f"field {field}" in ln), "")
        check(what in line, f"refused {key}: message names key, field and {what}: {line!r}")


def png16(a):
    """A 16-bit PNG written here with zlib and struct (PNG spec, filter 0): independent of libspng."""
    h, w, c = a.shape
    color = {1: 0, 3: 2, 4: 6}[c]
    raw = b"".join(b"\0" + a[y].astype(">u2").tobytes() for y in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def tiff16(a):
    """An uncompressed 16-bit little-endian TIFF written here with struct (TIFF 6.0): independent of libtiff."""
    h, w, c = a.shape
    data = a.astype("<u2").tobytes()
    entries = [(256, 4, 1, w), (257, 4, 1, h), (258, 3, c, None), (259, 3, 1, 1), (262, 3, 1, 2 if c >= 3 else 1),
               (273, 4, 1, None), (277, 3, 1, c), (278, 4, 1, h), (279, 4, 1, len(data))]
    if c in (2, 4):
        entries.append((338, 3, 1, 2))  # unassociated alpha
    ifd_size = 2 + 12 * len(entries) + 4
    bits_at = 8 + ifd_size
    data_at = bits_at + 2 * c
    ifd = struct.pack("<H", len(entries))
    for tag, typ, count, value in entries:
        if tag == 258:
            value = struct.pack("<HH", 16, 16) if c <= 2 else struct.pack("<I", bits_at)
            if c == 1:
                value = struct.pack("<HH", 16, 0)
        elif tag == 273:
            value = struct.pack("<I", data_at)
        else:
            value = struct.pack("<HH", value, 0) if typ == 3 else struct.pack("<I", value)
        ifd += struct.pack("<HHI", tag, typ, count) + value
    ifd += struct.pack("<I", 0)
    return b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<" + "H" * c, *[16] * c) + data


def tiff_tiled(a, tile=16):
    """An uncompressed 8-bit RGB TIFF in tile x tile tiles (edge tiles padded), written with struct: PIL 9.4
    cannot write tiles."""
    h, w, c = a.shape
    tiles = []
    for y0 in range(0, h, tile):
        for x0 in range(0, w, tile):
            t = np.zeros((tile, tile, c), np.uint8)
            part = a[y0 : y0 + tile, x0 : x0 + tile]
            t[: part.shape[0], : part.shape[1]] = part
            tiles.append(t.tobytes())
    n = len(tiles)
    entries = 11
    at = 8 + 2 + 12 * entries + 4
    bits_at, offsets_at, counts_at = at, at + 2 * c, at + 2 * c + 4 * n
    data_at = counts_at + 4 * n
    def entry(tag, typ, count, value):
        return struct.pack("<HHI", tag, typ, count) + (struct.pack("<HH", value, 0) if typ == 3 and count == 1
                                                       else struct.pack("<I", value))
    ifd = struct.pack("<H", entries) + b"".join([
        entry(256, 4, 1, w), entry(257, 4, 1, h), entry(258, 3, c, bits_at), entry(259, 3, 1, 1), entry(262, 3, 1, 2),
        entry(277, 3, 1, c), entry(284, 3, 1, 1), entry(322, 4, 1, tile), entry(323, 4, 1, tile),
        entry(324, 4, n, offsets_at), entry(325, 4, n, counts_at)]) + struct.pack("<I", 0)
    offsets = [data_at + i * len(tiles[0]) for i in range(n)]
    return (b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack(f"<{c}H", *[8] * c)
            + struct.pack(f"<{n}I", *offsets) + struct.pack(f"<{n}I", *[len(t) for t in tiles]) + b"".join(tiles))


def test_tiff_tiles():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (37, 21, 3), dtype=np.uint8)  # edge tiles partly outside the image both ways
    data = tiff_tiled(a)
    got, err, code = decode("tiles", [("t", {"tif": data})], mode="keep")
    check(code == 0, f"tiled TIFF: run succeeds: {err}")
    ref = np.asarray(Image.open(io.BytesIO(data)))
    check(same(ref, a), "tiled TIFF: PIL reads the hand-made tiles as written (the reference is sound)")
    check(same(got.get("t", {}).get("tif"), a), "tiled TIFF: decode equals the image and PIL")


def test_16bit():
    rng = np.random.default_rng(5)
    gray = rng.integers(0, 65536, (6, 7), dtype=np.uint16)
    b = io.BytesIO()
    Image.fromarray(gray).save(b, "PNG")  # PIL writes mode I;16 as a 16-bit grayscale PNG
    gray_png = b.getvalue()
    rgb = rng.integers(0, 65536, (5, 4, 3), dtype=np.uint16)
    rgba = rng.integers(0, 65536, (3, 5, 4), dtype=np.uint16)
    pgm = b"P5\n7 6\n65535\n" + gray.astype(">u2").tobytes()
    pgm1000 = b"P5 7 6 1000\n" + (gray % 1001).astype(">u2").tobytes()
    ppm = b"P6\n4 5\n65535\n" + rgb.astype(">u2").tobytes()
    eight = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(eight).save(b, "PNG")
    samples = [("gray", {"png": gray_png}), ("rgb", {"png": png16(rgb)}), ("rgba", {"png": png16(rgba)}),
               ("pgm", {"pgm": pgm}), ("pgm1000", {"pgm": pgm1000}), ("ppm", {"ppm": ppm}), ("eight", {"png": b.getvalue()}),
               ("tifrgb", {"tif": tiff16(rgb)}), ("tifrgba", {"tif": tiff16(rgba)})]
    b = io.BytesIO()
    Image.fromarray(gray).save(b, "TIFF")  # mode I;16
    samples.append(("tifgray", {"tif": b.getvalue()}))
    b = io.BytesIO()
    Image.fromarray(gray).save(b, "JPEG2000", no_jp2=True)  # mode I;16, lossless
    samples.append(("j2kgray", {"j2k": b.getvalue()}))
    pil = lambda data: np.asarray(Image.open(io.BytesIO(data))).astype(np.uint16)[..., None]  # mode I
    for depth in ("16", "native"):
        got, err, code = decode("d" + depth, samples, mode="keep", depth=depth)
        check(code == 0, f"depth {depth}: run succeeds: {err}")
        check(same(got["gray"]["png"], pil(gray_png)), f"depth {depth}: 16-bit gray PNG equals PIL (mode I)")
        check(same(got["rgb"]["png"], rgb), f"depth {depth}: 16-bit RGB PNG equals its samples")
        check(same(got["rgba"]["png"], rgba), f"depth {depth}: 16-bit RGBA PNG equals its samples")
        check(same(got["pgm"]["pgm"], pil(pgm)), f"depth {depth}: PGM maxval 65535 equals PIL")
        check(same(got["pgm1000"]["pgm"], np.frombuffer(pgm1000[12:], ">u2").reshape(6, 7, 1).astype(np.uint16)),
              f"depth {depth}: PGM maxval 1000 equals its stored samples")
        check(same(got["ppm"]["ppm"], rgb), f"depth {depth}: PPM maxval 65535 equals its samples")
        check(same(got["tifgray"]["tif"], pil(dict(samples)["tifgray"]["tif"])), f"depth {depth}: 16-bit gray TIFF equals PIL (mode I;16)")
        check(same(got["tifrgb"]["tif"], rgb), f"depth {depth}: 16-bit RGB TIFF equals its samples")
        check(same(got["j2kgray"]["j2k"], pil(dict(samples)["j2kgray"]["j2k"])) and same(got["j2kgray"]["j2k"], gray[..., None]),
              f"depth {depth}: 16-bit gray JPEG 2000 equals PIL (mode I;16) and the image")
        check(same(got["tifrgba"]["tif"], rgba), f"depth {depth}: 16-bit RGBA TIFF equals its samples")
        want = eight.astype(np.uint16) * 257 if depth == "16" else eight
        check(same(got["eight"]["png"], want), f"depth {depth}: an 8-bit PNG is {want.dtype}")
    got, _, _ = decode("drgb", samples[:1], mode="rgb", depth="16")
    check(same(got["gray"]["png"], np.repeat(pil(gray_png), 3, -1)), "depth 16 mode rgb: gray repeated to 3 channels")
    # depth 8 (the default) keeps today's behaviour: 16-bit gray PNG and PGM refused, RGB cut to the high byte.
    got, err, _ = decode("d8", samples, policy="skip", mode="keep")
    check(sorted(got) == ["eight", "rgb", "rgba", "tifrgb", "tifrgba"],
          f"depth 8: 16-bit gray and PNM refused ({sorted(got)})")
    check(same(got["rgb"]["png"], (rgb >> 8).astype(np.uint8)), "depth 8: 16-bit RGB PNG is its high byte")
    check(same(got["tifrgb"]["tif"], (rgb >> 8).astype(np.uint8)), "depth 8: 16-bit RGB TIFF is its high byte")
    check(same(got["tifrgba"]["tif"], (rgba >> 8).astype(np.uint8)), "depth 8: 16-bit RGBA TIFF is its high byte")
    check("depth 16 or native" in err, "depth 8: the refusal says which depth to use")


def test_cmyk():
    rng = np.random.default_rng(6)
    y, x = np.mgrid[0:24, 0:30]
    rgb = np.clip(np.stack([x * 8, y * 10, (x + y) * 4], -1) + rng.integers(-10, 11, (24, 30, 3)), 0, 255).astype(np.uint8)
    b = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(b, "JPEG", quality=95)
    data = b.getvalue()
    check(Image.open(io.BytesIO(data)).mode == "CMYK", "cmyk: PIL wrote a CMYK JPEG")
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    for mode in ("rgb", "gray"):
        got, err, code = decode("cmyk_" + mode, [("c", {"jpg": data})], mode=mode)
        check(code == 0, f"cmyk {mode}: run succeeds: {err}")
        want = ref if mode == "rgb" else np.asarray(Image.open(io.BytesIO(data)).convert("RGB").convert("L")).astype(int)[..., None]
        diff = np.abs(got["c"]["jpg"].astype(int) - want).max()
        check(got["c"]["jpg"].shape == want.shape and diff <= 1, f"cmyk {mode}: within 1 of PIL (max diff {diff})")
        print(f"cmyk {mode}: largest difference from PIL {diff}")


def test_text():
    rng = np.random.default_rng(7)
    texts = [b"plain", "caf\u00e9 \u65e5\u672c \U0001f600".encode(), b"", b"abc\xff", b"ab\xc3", b"\xc0\xaf",
             b"x\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok \xe2\x82", b"\xe2\x82\xac\xe2\x28\xa1"]
    alphabet = [b"a", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\x80", b"\xc3", b"\xe2\x82", b"\xf5", b"\xed\xbf\xbf"]
    weights = np.array([6, 3, 3, 3, 1, 1, 1, 1, 1], float)  # mostly valid pieces: both outcomes occur
    texts += [b"".join(alphabet[i] for i in rng.choice(len(alphabet), 4, p=weights / weights.sum())) for _ in range(40)]
    docs = ['{"a": [1, 2.5, "x"], "b": null}', "[]", '"caf\u00e9"', "3", '{"a": 1,}', "[1, 2", '{"a" 1}', "",
            '{\n  "a": 1,\n  "b": tru\n}', '{"k": "\\u00e9"}', "nul", '[1]\n\n  x', '{"a":1}{"b":2}']
    samples = [(f"t{i:03d}", {"txt": t}) for i, t in enumerate(texts)] + [(f"j{i:03d}", {"json": d.encode()}) for i, d in enumerate(docs)]
    # Runs of 15 samples: the CLI prints the first 20 error records and counts the rest.
    for n in range(0, len(samples), 15):
        text_run(f"text{n}", samples[n:n + 15] + [(f"g{n:03d}", {"txt": b"a good one"})])
    got, _, _ = decode("text_off", [("t", {"txt": b"abc\xff"})], check_text="false")
    check("t" in got, "check_text false passes broken UTF-8 on")


def text_run(name, samples):
    got, err, code = decode(name, samples, policy="skip")
    check(code == 0, f"text: run succeeds under skip: {err}")
    for key, fields in samples:
        data = next(iter(fields.values()))
        try:
            data.decode("utf-8") if "txt" in fields else json.loads(data)
            ok, py = True, None
        except (UnicodeDecodeError, ValueError) as e:
            ok, py = False, e
        check((key in got) == ok, f"{key} {data!r}: accepted={key in got}, Python accepts={ok}")
        if ok:
            check(bytes(got[key][next(iter(fields))]) == data, f"{key}: bytes passed on unchanged")
            continue
        line = next((ln for ln in err.splitlines() if f"(key {key})" in ln), "")
        if "txt" in fields:
            check(f"field txt" in line and f"byte offset {py.start} " in line, f"{key}: names field txt and offset {py.start}: {line!r}")
        else:
            check("field json" in line and f"line {py.lineno}," in line, f"{key}: names field json and line {py.lineno}: {line!r}")


def test_python():
    """The same fields reach Python (DLPack -> NumPy): uint16 images and .npz arrays keep dtype and values."""
    sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
    os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
    import shardflow

    rng = np.random.default_rng(8)
    img = rng.integers(0, 65536, (4, 5, 3), dtype=np.uint16)
    b = io.BytesIO()
    np.savez_compressed(b, ids=rng.integers(0, 50000, (7,)).astype("<i8"))
    shard = write_shard(os.path.join(TMP, "py.tar"), [("k0", {"png": png16(img), "npz": b.getvalue()})])
    graph = write_graph(os.path.join(TMP, "py.yaml"), [
        ("shard_source", dict(urls=shard, shuffle=False)), ("tar_split", {}), ("decode", dict(depth="16")),
        ("batch", dict(batch_size=1))], seed=1, epochs=1)
    with shardflow.Pipeline(graph, output="dict") as p:
        batches = list(p)
    ids = np.load(io.BytesIO(b.getvalue()))["ids"]
    check(len(batches) == 1 and same(np.asarray(batches[0]["png"])[0], img), "python: uint16 image through DLPack")
    check(same(np.asarray(batches[0]["npz.ids"])[0], ids), "python: npz.ids int64 through DLPack")


if __name__ == "__main__":
    test_npy()
    test_npz()
    test_refused()
    test_16bit()
    test_tiff_tiles()
    test_cmyk()
    test_text()
    # Set by meson test; a sanitizer build's library cannot load into python.
    if "SF_BUILD_ROOT" in os.environ and os.environ.get("SF_SANITIZE", "none") == "none":
        test_python()
    check.done("decoders")
    shutil.rmtree(TMP)
