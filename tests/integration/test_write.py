#!/usr/bin/python3
"""`shardflow write` against independent references (tarfile, GNU tar, PIL, numpy), and a
round trip through `shardflow run` with the device sink's .npy dumps and preview grid."""
import glob
import gzip
import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

SF = os.environ.get("SHARDFLOW")
if not SF or not os.access(SF, os.X_OK):
    sys.exit("SHARDFLOW must name the built shardflow binary")
TMP = tempfile.mkdtemp(prefix="sf_test_write_")
CHECKS = 0


def check(cond, what):
    global CHECKS
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    CHECKS += 1


def run(*args, expect=0):
    p = subprocess.run([SF, *args], capture_output=True, text=True)
    if p.returncode != expect:
        print("command:", SF, " ".join(args))
        print("stdout:", p.stdout)
        print("stderr:", p.stderr)
        check(False, f"exit status {p.returncode}, expected {expect}")
    return p


# ---------------------------------------------------------------- inputs

def smooth_image(rng, h, w, channels):
    """A gradient plus mild noise: JPEG-friendly, distinct per image."""
    y, x = np.mgrid[0:h, 0:w]
    base = [(x * rng.integers(1, 8) + y * rng.integers(1, 8) + rng.integers(0, 255)) % 256
            for _ in range(channels)]
    a = np.stack(base, axis=-1).astype(np.int32) + rng.integers(-6, 7, (h, w, channels))
    a = np.clip(a, 0, 255).astype(np.uint8)
    return a[:, :, 0] if channels == 1 else a


def make_tree(root, sizes, seed):
    """ImageFolder tree; returns [(relpath, class_index)] in ImageFolder order."""
    rng = np.random.default_rng(seed)
    classes = {  # deliberately unsorted; sorted order is Apple, mango, zebra
        "zebra": ["img10.jpg", "img2.png", "b.jpg", "A.png"],
        "Apple": ["x.JPEG", "gray.jpg", "c.png"],
        "mango": ["m1.jpg", "m0.jpg", "graypng.png", "m3.jpg"],
    }
    for ci, (cls, names) in enumerate(classes.items()):
        os.makedirs(os.path.join(root, cls))
        for ni, name in enumerate(names):
            h, w = sizes(ci, ni)
            gray = name.startswith("gray")
            img = Image.fromarray(smooth_image(rng, h, w, 1 if gray else 3))
            path = os.path.join(root, cls, name)
            if name.lower().endswith(("jpg", "jpeg")):
                img.save(path, format="JPEG", quality=90)
            else:
                img.save(path, format="PNG")
    # noise that ImageFolder ignores: non-images, hidden files, files at the top
    open(os.path.join(root, "zebra", "notes.txt"), "w").write("not an image")
    open(os.path.join(root, "mango", ".hidden.jpg"), "wb").write(b"junk")
    open(os.path.join(root, "README.jpg"), "wb").write(b"junk")
    order = []
    for ci, cls in enumerate(sorted(classes)):
        for name in sorted(classes[cls]):
            order.append((os.path.join(cls, name), ci))
    return order


def reference_rgb(path):
    return np.asarray(Image.open(path).convert("RGB"))


def is_jpeg(path):
    return path.lower().endswith(("jpg", "jpeg"))


# ---------------------------------------------------------------- reading shards

def shard_files(pattern_glob):
    return sorted(glob.glob(pattern_glob))


def read_samples(pattern_glob, maxcount=None, start=0):
    """Reads every shard with tarfile and GNU tar; checks names, order, keys and counts.
    Returns [(key, ext, image_bytes, cls_int)] over all shards, and the per-shard counts."""
    samples, counts = [], []
    expect_key = start
    for shard in shard_files(pattern_glob):
        with tarfile.open(shard) as tf:
            members = tf.getmembers()
            names = [m.name for m in members]
            check(len(members) % 2 == 0, f"{shard}: an even number of members")
            for m in members:
                check(m.isreg() and m.mode == 0o644 and m.uid == 0 and m.gid == 0 and m.mtime == 0,
                      f"{shard}: {m.name} is a plain 0644 file owned by 0/0 at mtime 0")
            for i in range(0, len(members), 2):
                img, cls = members[i], members[i + 1]
                key, _, ext = img.name.partition(".")
                check(key == f"{expect_key:07d}", f"{shard}: key {key} follows {expect_key - 1}")
                check(cls.name == f"{key}.cls", f"{shard}: {cls.name} follows {img.name}")
                text = tf.extractfile(cls).read()
                check(text.isdigit(), f"{shard}: {cls.name} holds ASCII digits only ({text!r})")
                samples.append((key, ext, tf.extractfile(img).read(), int(text)))
                expect_key += 1
        counts.append(len(members) // 2)
        gnu = subprocess.run(["tar", "-tvf", shard], capture_output=True, text=True)
        check(gnu.returncode == 0 and not gnu.stderr, f"GNU tar reads {shard}: {gnu.stderr}")
        lines = gnu.stdout.splitlines()
        check([ln.split()[-1] for ln in lines] == names, f"GNU tar lists the same members in {shard}")
        check(all(ln.startswith("-rw-r--r-- 0/0 ") for ln in lines), f"GNU tar modes/owners in {shard}")
    if maxcount:
        check(all(c <= maxcount for c in counts), f"shards hold at most {maxcount} samples: {counts}")
        check(all(c == maxcount for c in counts[:-1]), f"all shards but the last are full: {counts}")
    return samples, counts


def decode(data):
    return np.asarray(Image.open(io.BytesIO(data)))


def check_pixels(got, src, what):
    ref = reference_rgb(src)
    check(got.shape == ref.shape, f"{what}: shape {got.shape} == PIL's {ref.shape}")
    diff = np.abs(got.astype(int) - ref.astype(int)).max()
    tol = 1 if is_jpeg(src) else 0
    check(diff <= tol, f"{what}: pixels within {tol} of PIL's decode of {src} (max diff {diff})")


# ---------------------------------------------------------------- tests

def test_imagefolder(tree, order):
    out = os.path.join(TMP, "ppm")
    p = run("write", "--format", "ppm", "--no-shuffle", "--maxcount", "4", tree, out + "/s-%03d.tar")
    check(p.stdout.strip() != "", "a summary without --quiet")
    samples, counts = read_samples(out + "/s-*.tar", maxcount=4)
    check(len(samples) == len(order), f"{len(order)} samples ({len(samples)})")
    check(len(counts) == 3 and os.path.exists(out + "/s-000.tar"), "shards s-000..s-002")
    for (key, ext, data, cls), (rel, ci) in zip(samples, order):
        src = os.path.join(tree, rel)
        check(ext == "ppm", f"{key}: field .ppm ({ext})")
        check(data.startswith(b"P6"), f"{key}: binary P6")
        check(cls == ci, f"{key}: cls {cls} is the sorted class index {ci} of {rel}")
        check_pixels(decode(data), src, f"{key} ({rel}) as ppm")
    print(f"ok  ImageFolder -> ppm, --no-shuffle: {len(samples)} samples in {counts}, class-sorted")

    out = os.path.join(TMP, "png")
    p = run("write", "--quiet", "--format", "png", "--no-shuffle", tree, out + "/p-%d.tar")
    check(p.stdout == "", "--quiet prints nothing")
    samples, counts = read_samples(out + "/p-*.tar")
    check(counts == [len(order)], "one shard with the default maxcount")
    for (key, ext, data, cls), (rel, ci) in zip(samples, order):
        check(ext == "png" and data.startswith(b"\x89PNG"), f"{key}: a .png field")
        check_pixels(decode(data), os.path.join(tree, rel), f"{key} ({rel}) as png")
    print("ok  ImageFolder -> png")

    out = os.path.join(TMP, "orig")
    run("write", "--quiet", "--format", "orig", "--no-shuffle", "--start-index", "100", tree,
        out + "/o-%06d.tar")
    samples, _ = read_samples(out + "/o-*.tar", start=100)
    for (key, ext, data, cls), (rel, ci) in zip(samples, order):
        check(ext == rel.rsplit(".", 1)[1].lower(), f"{key}: orig keeps the extension of {rel}")
        check(data == open(os.path.join(tree, rel), "rb").read(), f"{key}: orig keeps the bytes of {rel}")
    print("ok  ImageFolder -> orig (bytes and extensions kept), --start-index 100")

    out = os.path.join(TMP, "jpg")
    run("write", "--quiet", "--format", "jpg", "--no-shuffle", tree, out + "/j-%d.tar")
    samples, _ = read_samples(out + "/j-*.tar")
    for (key, ext, data, cls), (rel, ci) in zip(samples, order):
        ref = reference_rgb(os.path.join(tree, rel))
        got = decode(data).astype(int)
        check(ext == "jpg" and data.startswith(b"\xff\xd8\xff"), f"{key}: a .jpg field")
        # not bit-exact: compare with PIL's own quality-95 re-encode of the same pixels
        buf = io.BytesIO()
        Image.fromarray(ref).save(buf, format="JPEG", quality=95)
        pil = decode(buf.getvalue()).astype(int)
        ours_err, pil_err = np.abs(got - ref).mean(), np.abs(pil - ref).mean()
        check(got.shape == ref.shape and ours_err <= pil_err + 1 and np.abs(got - pil).mean() < 3,
              f"{key}: jpg re-encode of {rel} as close as PIL's q95 ({ours_err:.2f} vs {pil_err:.2f})")
    print("ok  ImageFolder -> jpg (quality 95)")


def identify(samples, tree, order):
    """Maps orig-format samples back to their source by bytes."""
    by_bytes = {open(os.path.join(tree, rel), "rb").read(): (rel, ci) for rel, ci in order}
    check(len(by_bytes) == len(order), "source images are distinct")
    out = []
    for key, ext, data, cls in samples:
        check(data in by_bytes, f"{key}: bytes come from a source image")
        rel, ci = by_bytes[data]
        check(cls == ci, f"{key}: cls {cls} matches {rel}'s class {ci}")
        out.append(rel)
    return out


def test_repeat_and_shuffle(tree, order):
    n = len(order)
    sorted_rels = [rel for rel, _ in order]
    out = os.path.join(TMP, "rep")
    run("write", "--quiet", "--format", "orig", "--repeat", "3", "--maxcount", "5", tree,
        out + "/r-%04d.tar")
    samples, counts = read_samples(out + "/r-*.tar", maxcount=5)
    check(len(samples) == 3 * n, f"--repeat 3 gives {3 * n} samples ({len(samples)})")
    rels = identify(samples, tree, order)
    blocks = [rels[i * n:(i + 1) * n] for i in range(3)]
    for b in blocks:
        check(sorted(b) == sorted(sorted_rels), "each repeat holds every image exactly once")
    check(any(b != sorted_rels for b in blocks), "the default order is shuffled")
    check(len({tuple(b) for b in blocks}) > 1, "each repeat gets a fresh order")
    first_shard_classes = {order[sorted_rels.index(r)][1] for r in rels[:5]}
    print(f"ok  --repeat 3, shuffled: {counts}, classes in the first shard {sorted(first_shard_classes)}")

    again = os.path.join(TMP, "rep2")
    run("write", "--quiet", "--format", "orig", "--repeat", "3", "--maxcount", "5", tree,
        again + "/r-%04d.tar")
    check([open(f, "rb").read() for f in shard_files(out + "/r-*.tar")] ==
          [open(f, "rb").read() for f in shard_files(again + "/r-*.tar")],
          "the same seed writes byte-identical shards")
    seeded = os.path.join(TMP, "rep3")
    run("write", "--quiet", "--format", "orig", "--repeat", "3", "--shuffle-seed", "7", tree,
        seeded + "/r-%04d.tar")
    s7, _ = read_samples(seeded + "/r-*.tar")
    check(identify(s7, tree, order) != rels, "--shuffle-seed 7 gives another order")
    print("ok  shuffle is deterministic per seed")

    out = os.path.join(TMP, "rep_sorted")
    run("write", "--quiet", "--format", "orig", "--repeat", "2", "--no-shuffle", tree,
        out + "/r-%d.tar")
    samples, _ = read_samples(out + "/r-*.tar")
    check(identify(samples, tree, order) == sorted_rels * 2, "--no-shuffle --repeat 2: class-sorted twice")
    print("ok  --no-shuffle --repeat 2 is class-sorted in both repeats")

    out = os.path.join(TMP, "maxsize")
    run("write", "--quiet", "--maxsize", "20k", tree, out + "/m-%d.tar")
    files = shard_files(out + "/m-*.tar")
    samples, counts = read_samples(out + "/m-*.tar")
    check(len(files) > 1 and all(os.path.getsize(f) <= 20000 for f in files),
          f"--maxsize 20k keeps every shard within 20000 bytes: {[os.path.getsize(f) for f in files]}")
    check(sum(counts) == n, "--maxsize loses no samples")
    print(f"ok  --maxsize 20k: shards of {[os.path.getsize(f) for f in files]} bytes")


def test_archives(tree, order):
    parent, name = os.path.split(tree)
    zst = os.path.join(TMP, "tree.tar.zst")
    tgz = os.path.join(TMP, "tree.tar.gz")
    subprocess.run(["tar", "--zstd", "-cf", zst, "-C", parent, name], check=True)
    subprocess.run(["tar", "-czf", tgz, "-C", parent, name], check=True)
    for opts in (["--no-shuffle", "--maxcount", "4"], ["--repeat", "2", "--maxcount", "3"]):
        ref = os.path.join(TMP, "arch_dir")
        shutil.rmtree(ref, ignore_errors=True)
        run("write", "--quiet", *opts, tree, ref + "/a-%03d.tar")
        want = [open(f, "rb").read() for f in shard_files(ref + "/a-*.tar")]
        for src in (zst, tgz):
            out = os.path.join(TMP, "arch_" + os.path.basename(src))
            shutil.rmtree(out, ignore_errors=True)
            run("write", "--quiet", "--subdir", name, *opts, src, out + "/a-%03d.tar")
            got = [open(f, "rb").read() for f in shard_files(out + "/a-*.tar")]
            check(got == want, f"{os.path.basename(src)} --subdir {name} {' '.join(opts)}: "
                               "the same shards as the directory")
    p = run("write", "--quiet", "--subdir", "nosuch", zst, os.path.join(TMP, "x-%d.tar"), expect=1)
    check("nosuch" in p.stderr and name in p.stderr, f"a missing --subdir names the top-level entries: {p.stderr}")
    print("ok  .tar.zst and .tar.gz with --subdir give the directory's shards")


def write_idx(path, arr, gz):
    magic = bytes([0, 0, 8, arr.ndim])
    data = magic + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.astype(np.uint8).tobytes()
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(data)


def parse_idx(path):
    raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    ndim = raw[3]
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def test_idx():
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (7, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5, 9, 2], np.uint8)
    ipath, lpath = os.path.join(TMP, "imgs-idx3-ubyte.gz"), os.path.join(TMP, "labels-idx1-ubyte")
    write_idx(ipath, images, gz=True)
    write_idx(lpath, labels, gz=False)
    out = os.path.join(TMP, "idx")
    run("write", "--quiet", "--no-shuffle", "--maxcount", "3", f"idx:{ipath},{lpath}", out + "/i-%d.tar")
    samples, counts = read_samples(out + "/i-*.tar", maxcount=3)
    check(len(samples) == 7, "7 IDX samples")
    for i, (key, ext, data, cls) in enumerate(samples):
        check(ext == "pgm" and data.startswith(b"P5"), f"{key}: gray IDX images become .pgm")
        check(np.array_equal(decode(data), images[i]), f"{key}: pgm pixels equal the IDX image")
        check(cls == labels[i], f"{key}: cls equals the IDX label")
    out = os.path.join(TMP, "idx_png")
    run("write", "--quiet", "--format", "png", f"idx:{ipath},{lpath}", out + "/i-%d.tar")
    samples, _ = read_samples(out + "/i-*.tar")
    seen = []
    for key, ext, data, cls in samples:
        a = decode(data)
        hits = [i for i in range(7) if np.array_equal(a, images[i])]
        check(ext == "png" and len(hits) == 1 and labels[hits[0]] == cls, f"{key}: png of one IDX image")
        seen.append(hits[0])
    check(sorted(seen) == list(range(7)), "shuffled IDX holds each image once")
    p = run("write", f"idx:{lpath},{ipath}", os.path.join(TMP, "bad-%d.tar"), expect=1)
    check(lpath in p.stderr and "IDX" in p.stderr, f"bad IDX magic names the file: {p.stderr.strip()}")
    print(f"ok  IDX (gzip + plain): pgm and png, {counts}")

    fm = "/usr/share/datasets/fashion-mnist"
    fi, fl = f"{fm}/t10k-images-idx3-ubyte.gz", f"{fm}/t10k-labels-idx1-ubyte.gz"
    if not os.path.exists(fi):
        check(False, f"{fi} is missing (Debian's fashion-mnist data)")
    out = os.path.join(TMP, "fmnist")
    run("write", "--quiet", "--no-shuffle", "--maxcount", "4000", f"idx:{fi},{fl}", out + "/f-%02d.tar")
    files = shard_files(out + "/f-*.tar")
    total, spot, spot_cls = 0, None, None
    for f in files:
        with tarfile.open(f) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".pgm"):
                    total += 1
                if m.name == "0001234.pgm":
                    spot = decode(tf.extractfile(m).read())
                if m.name == "0001234.cls":
                    spot_cls = int(tf.extractfile(m).read())
    check(total == 10000 and len(files) == 3, f"Fashion-MNIST test: 10000 samples in 3 shards ({total})")
    check(spot is not None and np.array_equal(spot, parse_idx(fi)[1234]), "image 1234 equals numpy's parse")
    check(spot_cls == parse_idx(fl)[1234], "label 1234 equals numpy's parse")
    print("ok  Fashion-MNIST t10k: 10000 samples, image 1234 checked")


def test_errors(tree):
    for bad in ("out.tar", "out-%d-%d.tar", "out-%s.tar", "out-%x.tar", "out-%5.tar"):
        p = run("write", tree, os.path.join(TMP, "err", bad), expect=2)
        check("OUTPUT_PATTERN" in p.stderr, f"pattern {bad} is a usage error")
    run("write", "--quiet", "--no-shuffle", tree, os.path.join(TMP, "pct", "100%%-%d.tar"))
    check(os.path.exists(os.path.join(TMP, "pct", "100%-0.tar")), "%% is a literal percent")
    run("write", "--format", "gif", tree, os.path.join(TMP, "x-%d.tar"), expect=2)
    run("write", "--maxsize", "12parsecs", tree, os.path.join(TMP, "x-%d.tar"), expect=2)
    run("write", tree, expect=2)

    broken = os.path.join(TMP, "broken")
    shutil.copytree(tree, broken)
    victim = os.path.join(broken, "mango", "m1.jpg")
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) // 3])
    p = run("write", broken, os.path.join(TMP, "b", "b-%d.tar"), expect=1)
    check("m1.jpg" in p.stderr, f"a corrupt image is named: {p.stderr.strip()}")

    blocker = os.path.join(TMP, "a_file")
    open(blocker, "w").write("x")
    p = run("write", tree, os.path.join(blocker, "s-%d.tar"), expect=1)
    check(blocker in p.stderr, f"an unwritable output is named: {p.stderr.strip()}")
    p = run("write", os.path.join(TMP, "nosuchdir"), os.path.join(TMP, "s-%d.tar"), expect=1)
    check("nosuchdir" in p.stderr, "a missing input is named")
    print("ok  usage errors (exit 2), corrupt image / unwritable output / missing input (exit 1)")


def test_pipeline_round_trip():
    tree = os.path.join(TMP, "uniform")
    order = make_tree(tree, lambda ci, ni: (14, 20), seed=11)
    shards = os.path.join(TMP, "rt")
    run("write", "--quiet", "--no-shuffle", "--maxcount", "5", tree, shards + "/shard-%06d.tar")
    check(len(shard_files(shards + "/shard-*.tar")) == 3, "round trip: 3 shards")
    expected = {f"{i:07d}": (os.path.join(tree, rel), ci) for i, (rel, ci) in enumerate(order)}

    npy_dir, preview = os.path.join(TMP, "rt_out", "npy"), os.path.join(TMP, "rt_out", "preview.png")
    os.makedirs(os.path.dirname(preview))
    graph = os.path.join(TMP, "graph.yaml")
    with open(graph, "w") as f:
        f.write(f"""seed: 1
epochs: 1
stages:
  - type: shard_source
    urls: {shards}/shard-{{000000..000002}}.tar
    shuffle: false
  - type: tar_split
  - type: decode
  - type: batch
    batch_size: 4
  - type: device_sink
    npy_dir: {npy_dir}
    preview_png: {preview}
""")
    run("run", graph, "--quiet")
    keys_files = sorted(glob.glob(npy_dir + "/e000_b*_keys.txt"))
    check(len(keys_files) == 3, f"3 batches dumped ({keys_files})")
    seen = []
    for kf in keys_files:
        stem = kf[: -len("keys.txt")]
        keys = open(kf).read().split()
        imgs = np.load(stem + "ppm.npy")
        cls = np.load(stem + "cls.npy")
        check(imgs.shape == (len(keys), 14, 20, 3) and imgs.dtype == np.uint8,
              f"{stem}ppm.npy is uint8 [B,14,20,3] ({imgs.shape} {imgs.dtype})")
        check(cls.shape == (len(keys),) and cls.dtype == np.int64, f"{stem}cls.npy is int64 [B]")
        for j, key in enumerate(keys):
            src, ci = expected[key]
            check(int(cls[j]) == ci, f"{key}: label {cls[j]} as written ({ci})")
            check_pixels(imgs[j], src, f"{key} through the pipeline")
            seen.append(key)
    check(sorted(seen) == sorted(expected), "every written sample comes back once")

    grid = Image.open(preview)
    grid.load()
    first = np.load(keys_files[0][: -len("keys.txt")] + "ppm.npy")
    b = first.shape[0]
    cols = int(np.ceil(np.sqrt(b)))
    rows = (b + cols - 1) // cols
    # cells: the image at 2x, a 9-pixel label band under it; 2-pixel gaps around every cell
    want = (cols * 40 + (cols + 1) * 2, rows * (28 + 9) + (rows + 1) * 2)
    check(grid.size == want and grid.mode == "RGB", f"preview is {want} RGB ({grid.size} {grid.mode})")
    g = np.asarray(grid)
    tile = g[2:30, 2:42]
    check(np.array_equal(tile, first[0].repeat(2, 0).repeat(2, 1)), "preview tile 0 is image 0 at 2x")
    check((g[30:39, 2:42] == 255).any(), "preview draws a label under tile 0")
    print(f"ok  round trip through shardflow run: {len(seen)} samples, .npy equal PIL, preview {grid.size}")

    # float32 CHW, normalised by augment: the preview undoes mean/std, or min-max scales without them
    mean, std = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]
    for sink_norm in (True, False):
        out = os.path.join(TMP, f"rt_float_{sink_norm}")
        os.makedirs(out)  # preview_png writes into a directory that exists
        sink_opts = f"    mean: {mean}\n    std: {std}\n" if sink_norm else ""
        with open(graph, "w") as f:
            f.write(f"""seed: 1
epochs: 1
stages:
  - type: shard_source
    urls: {shards}/shard-{{000000..000002}}.tar
    shuffle: false
  - type: tar_split
  - type: decode
  - type: augment
    mean: {mean}
    std: {std}
    dtype: float32
    layout: chw
  - type: batch
    batch_size: 4
  - type: device_sink
    npy_dir: {out}
    npy_batches: 1
    preview_png: {out}/preview.png
{sink_opts}""")
        run("run", graph, "--quiet")
        check(sorted(os.listdir(out)) == ["e000_b000000_cls.npy", "e000_b000000_keys.txt",
                                          "e000_b000000_ppm.npy", "preview.png"],
              f"npy_batches 1 dumps only the first batch: {sorted(os.listdir(out))}")
        x = np.load(out + "/e000_b000000_ppm.npy")
        keys = open(out + "/e000_b000000_keys.txt").read().split()
        check(x.dtype == np.float32 and x.shape == (4, 3, 14, 20), f"float32 [B,C,H,W] ({x.shape})")
        src = reference_rgb(expected[keys[0]][0]).astype(np.float64)
        normed = (src / 255 - np.array(mean)) / np.array(std)
        check(np.abs(x[0].transpose(1, 2, 0) - normed).max() < 0.05, "the dump holds augment's output")
        tile = np.asarray(Image.open(out + "/preview.png").convert("RGB"))[2:30, 2:42].astype(int)
        if sink_norm:
            want = src
        else:
            v = x[0].transpose(1, 2, 0).astype(np.float64)
            want = (v - v.min()) / (v.max() - v.min()) * 255
        want = np.rint(want).repeat(2, 0).repeat(2, 1)
        diff = np.abs(tile - want).max()
        check(diff <= 2, f"preview of float CHW {'un-normalised' if sink_norm else 'min-max'}: max diff {diff}")
    print("ok  device_sink preview of normalised float32 CHW (mean/std undone, or min-max), npy_batches")

    with open(graph, "w") as f:
        f.write(f"""seed: 1
epochs: 1
error_policy: fail
stages:
  - type: shard_source
    urls: {shards}/shard-000000.tar
  - type: tar_split
  - type: decode
  - type: batch
    batch_size: 4
  - type: device_sink
    npy_dir: {blocker_dir()}/npy
""")
    p = run("run", graph, "--quiet", expect=1)
    check(blocker_dir() in p.stderr, f"an unwritable npy_dir is named: {p.stderr.strip()}")
    print("ok  device_sink: an unwritable npy_dir fails under error_policy: fail, naming the path")


def blocker_dir():
    """A path below a regular file: no directory can be made there."""
    path = os.path.join(TMP, "plain_file")
    if not os.path.exists(path):
        open(path, "w").write("x")
    return path


def main():
    tree = os.path.join(TMP, "tree")
    order = make_tree(tree, lambda ci, ni: (12 + 3 * ni + ci, 17 + 5 * ci + ni), seed=1)
    test_imagefolder(tree, order)
    test_repeat_and_shuffle(tree, order)
    test_archives(tree, order)
    test_idx()
    test_errors(tree)
    test_pipeline_round_trip()
    shutil.rmtree(TMP)
    print(f"test_write: all {CHECKS} checks passed")


if __name__ == "__main__":
    main()
