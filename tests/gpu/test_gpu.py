"""device_sink's device: cuda on a real GPU (issue 29); tests/gpu/run.sh builds the project and runs this.

Checks, each printed as one PASS / FAIL / SKIP line:
  same-batches    1,000 CIFAR batches on the GPU equal the CPU path's bit for bit: the fields copied as they
                  are, and uint8 images normalised on the GPU (normalize: float32, and bfloat16 on 200) against
                  augment's own float32 / bfloat16 output
  no-leak         10,000 batches: device memory (cuMemGetInfo, through torch.cuda.mem_get_info) and the
                  process's resident memory back where they were, the sink's buffer allocations bounded
  overlap         a simulated training step (torch.cuda._sleep) with prefetch: 2: the GPU's wait for input
                  per step (CUDA events around next_batch) near zero, the copy hidden behind the step
  zero-copy       torch.from_dlpack and jax.dlpack.from_dlpack take the sink's device memory itself (same
                  pointer), with the batch's values; JAX is skipped with a message when it is not installed
  cli             `shardflow run` with device: cuda:0 and normalize
  normalize-cost  (INFO, measured) batches a second and bytes copied: augment's float32 copied, against uint8
                  normalised on the GPU

--dry-run runs the parts that need no GPU (the data and the CPU reference of same-batches, with the GPU's
normalisation done by NumPy from the same formula), to check the script itself on a machine without one.
Exit status: 0 when nothing failed.
"""
import argparse
import ctypes
import gc
import os
import statistics
import subprocess
import sys
import time
import traceback

parser = argparse.ArgumentParser()
parser.add_argument("--shards", required=True, help="shard pattern, e.g. DIR/cifar-train-{000000..000024}.tar")
parser.add_argument("--shardflow", required=True, help="the shardflow CLI of the build under test")
parser.add_argument("--batches", type=int, default=1000)
parser.add_argument("--leak-batches", type=int, default=10000)
parser.add_argument("--dry-run", action="store_true")
parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
args = parser.parse_args()

import shardflow  # noqa: E402  (SHARDFLOW_LIB from run.sh)

MEAN, STD = [0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]
DEVICE = "cpu" if args.dry_run else "cuda:0"
results = []


def report(name, status, detail):
    results.append((name, status))
    print(f"{status} {name}: {detail}", flush=True)


def graph(batch_size, batches, dtype=None, sink=None, seed=0):
    """CIFAR-10 (.ppm + .cls) as bench/cifar.sh writes it: crop, flip; exactly `batches` batches an epoch.
    dtype None: no augment (the decoded uint8 [32,32,3] images)."""
    lines = ["seed: %d" % seed, "error_policy: fail", "stages:",
             "  - type: shard_source", f"    urls: \"{args.shards}\"", "    shuffle: true",
             f"    samples_per_epoch: {batch_size * batches}",
             "  - type: tar_split", "  - type: decode"]
    if dtype:
        lines += ["  - type: augment", "    crop: random", "    size: 32", "    padding: 4", "    flip: 0.5",
                  "    layout: chw", f"    dtype: {dtype}"]
        if dtype != "uint8":
            lines += [f"    mean: {MEAN}", f"    std: {STD}"]
    lines += ["  - type: shuffle", "    buffer_size: 2000",
              "  - type: batch", f"    batch_size: {batch_size}", "    partial: false",
              "  - type: device_sink"]
    for k, v in (sink or {}).items():
        lines.append(f"    {k}: {v}")
    return "\n".join(lines) + "\n"


def gpu_sink(**extra):
    return dict(device=DEVICE, **extra) if not args.dry_run else {}


def check(name, fn):
    if args.only and name not in args.only.split(","):
        return
    try:
        fn()
    except Exception:  # a check that crashes is a failure of that check, the others still run
        report(name, "FAIL", "raised:\n" + traceback.format_exc())


# ---- same-batches ---------------------------------------------------------------------------------------

def numpy_normalize(u8, dtype):
    """The GPU normalisation's reference for --dry-run: augment's formula, x/255 then (x - mean)/std in
    double, rounded once to float32 (bfloat16: round to nearest even of that float32)."""
    import numpy as np
    x = u8.astype(np.float64) / 255.0
    out = ((x - np.array(MEAN)[None, :, None, None]) / np.array(STD)[None, :, None, None]).astype(np.float32)
    if dtype == "bfloat16":
        bits = out.view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return bits
    return out


def bits(t):
    """A tensor's bits as integers (on the CPU), so that -0.0 and NaN compare as bits."""
    import torch
    t = t.cpu() if hasattr(t, "cpu") else t
    if hasattr(t, "dtype") and str(t.dtype).startswith("torch."):
        return t.contiguous().view({4: torch.int32, 2: torch.int16, 8: torch.int64, 1: torch.uint8}[t.element_size()])
    return t


def same_batches():
    import numpy as np
    import torch
    n = args.batches
    out = "torch_dict" if not args.dry_run else "dict"
    ref = shardflow.Pipeline(graph(128, n, "float32"), output=out, epochs=1)
    copied = shardflow.Pipeline(graph(128, n, "float32", gpu_sink()), output=out, epochs=1)
    normed = shardflow.Pipeline(graph(128, n, "uint8", gpu_sink(normalize="float32", mean=MEAN, std=STD)),
                                output=out, epochs=1)
    count, bad = 0, []
    for a, b, c in zip(ref, copied, normed):
        if args.dry_run:
            c_img = numpy_normalize(c["ppm"], "float32")
            on_gpu = True
        else:
            c_img = c["ppm"]
            on_gpu = b["ppm"].device.type == "cuda" and c["ppm"].device.type == "cuda" and b["cls"].is_cuda
        same = (a["__key__"] == b["__key__"] == c["__key__"] and on_gpu
                and torch.equal(bits(torch.as_tensor(a["ppm"])), bits(torch.as_tensor(b["ppm"])))
                and torch.equal(torch.as_tensor(a["cls"]).cpu(), torch.as_tensor(b["cls"]).cpu())
                and torch.equal(torch.as_tensor(a["cls"]).cpu(), torch.as_tensor(c["cls"]).cpu())
                and torch.equal(bits(torch.as_tensor(a["ppm"])), bits(torch.as_tensor(c_img))))
        if not same and len(bad) < 3:
            bad.append(f"batch {count}: keys {a['__key__'][:2]} / {b['__key__'][:2]} / {c['__key__'][:2]}, "
                       f"on the GPU: {on_gpu}")
        count += 1
    for p in (ref, copied, normed):
        p.close()
    ok = count == n and not bad
    report("same-batches", "PASS" if ok else "FAIL",
           f"{count} batches of 128 (float32 copied; uint8 normalised to float32 on the device): "
           + ("equal to the CPU path bit for bit" if ok else f"{count} of {n} batches came; differ: {'; '.join(bad)}"))
    # bfloat16: augment's bf16 against the device's, fewer batches
    m = min(200, n)
    ref = shardflow.Pipeline(graph(128, m, "bfloat16", seed=3), output="torch_dict", epochs=1)  # NumPy has no bf16
    normed = shardflow.Pipeline(graph(128, m, "uint8", gpu_sink(normalize="bfloat16", mean=MEAN, std=STD), seed=3),
                                output=out, epochs=1)
    count, bad = 0, 0
    for a, c in zip(ref, normed):
        if args.dry_run:
            a_bits, c_bits = bits(a["ppm"]).numpy().view(np.uint16), numpy_normalize(c["ppm"], "bfloat16")
            same = np.array_equal(a_bits, c_bits)
        else:
            same = c["ppm"].is_cuda and c["ppm"].dtype == torch.bfloat16 and torch.equal(bits(a["ppm"]), bits(c["ppm"]))
        bad += not same
        count += 1
    ref.close()
    normed.close()
    report("same-batches-bf16", "PASS" if count == m and not bad else "FAIL",
           f"{count} batches normalised to bfloat16 on the device, {bad} differ from augment's bfloat16")


# ---- no-leak --------------------------------------------------------------------------------------------

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def counters(p):
    stats = [s for s in p.stats() if s.get("type") == "device_sink" or s.get("name") == "device_sink"]
    return stats[0].get("counters", {}) if stats else {}


def no_leak():
    import torch
    n = args.leak_batches
    prefetch = 2

    def run(batches):
        p = shardflow.Pipeline(graph(64, batches, None, dict(device=DEVICE, prefetch=prefetch)), output="torch_dict",
                               epochs=1)
        total = torch.zeros((), dtype=torch.int64, device=DEVICE)
        mid = None
        for i, b in enumerate(p):
            total += b["ppm"].sum()  # the trainer reads every batch on its stream
            if i == batches // 10:
                torch.cuda.synchronize()
                mid = torch.cuda.mem_get_info()[0]
        torch.cuda.synchronize()
        end = torch.cuda.mem_get_info()[0]
        c = counters(p)
        p.close()
        return int(total), mid, end, c

    run(100)  # the context, the kernel module, torch's own: before the baseline
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, rss0 = torch.cuda.mem_get_info()[0], rss_mib()
    start = time.monotonic()
    _, mid, end, c = run(n)
    seconds = time.monotonic() - start
    del _
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free1, rss1 = torch.cuda.mem_get_info()[0], rss_mib()
    lost = (free0 - free1) / 2**20
    grew = (mid - end) / 2**20 if mid is not None else 0.0
    gpu_buffers = c.get("gpu_buffers_allocated", -1)
    pinned = c.get("pinned_buffers_allocated", -1)
    ok = (abs(lost) <= 4 and grew <= 4 and 0 < gpu_buffers <= prefetch + 8 and 0 < pinned <= 4
          and rss1 - rss0 <= 128)
    report("no-leak", "PASS" if ok else "FAIL",
           f"{n} batches in {seconds:.1f} s: device memory free before {free0 / 2**20:.0f} MiB, after "
           f"{free1 / 2**20:.0f} MiB (lost {lost:.1f} MiB; from batch {n // 10} to the end {grew:.1f} MiB); "
           f"buffers allocated: {gpu_buffers} on the GPU, {pinned} pinned; resident memory {rss0:.0f} -> "
           f"{rss1:.0f} MiB")


# ---- overlap --------------------------------------------------------------------------------------------

def overlap():
    import torch
    batch = 1024
    steps = 150
    # The pipeline's own pace without a trainer (CPU decode/augment): the simulated step is longer than
    # that, so that a wait for input can only be the copy's.
    p = shardflow.Pipeline(graph(batch, 40, "float32", dict(device=DEVICE, prefetch=2)), output="torch", epochs=1)
    it = iter(p)
    for _ in range(5):
        next(it)
    t0 = time.perf_counter()
    k = 0
    for images, labels in it:
        k += 1
    interval_ms = (time.perf_counter() - t0) * 1000 / max(k, 1)
    p.close()
    # torch.cuda._sleep spins the GPU for a number of cycles: calibrate cycles per millisecond.
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    stop.record()
    stop.synchronize()
    cycles_per_ms = 10_000_000 / start.elapsed_time(stop)
    step_ms = max(10.0, 1.5 * interval_ms)
    # The copy alone, for the report: one batch's bytes from pinned memory.
    nbytes = batch * 3 * 32 * 32 * 4 + batch * 8
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    start.record()
    dev = host.to(DEVICE, non_blocking=True)
    stop.record()
    stop.synchronize()
    copy_ms = start.elapsed_time(stop)
    del dev, host
    p = shardflow.Pipeline(graph(batch, steps + 20, "float32", dict(device=DEVICE, prefetch=2)), output="torch",
                           epochs=1)
    waits, host_waits = [], []
    marks = []
    stream = torch.cuda.current_stream()
    for i in range(steps + 20):
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record(stream)  # the GPU reaches it when the previous step is done
        t = time.perf_counter()
        images, labels = p.next_batch()  # torch.from_dlpack: the stream waits for the batch's copy
        host_waits.append((time.perf_counter() - t) * 1000)
        after.record(stream)  # ... and reaches this once the batch is there
        images.float().mean()  # the step reads its input, then computes
        torch.cuda._sleep(int(step_ms * cycles_per_ms))
        marks.append((before, after))
        del images, labels
    torch.cuda.synchronize()
    p.close()
    waits = [b.elapsed_time(a) for b, a in marks[20:]]  # after a warm-up
    mean_wait, p90 = statistics.mean(waits), sorted(waits)[int(0.9 * len(waits))]
    ok = mean_wait <= max(0.5, 0.05 * step_ms)
    report("overlap", "PASS" if ok else "FAIL",
           f"step {step_ms:.1f} ms (the pipeline alone: {interval_ms:.1f} ms a batch of {batch}); the GPU waited "
           f"for input {mean_wait:.3f} ms a step on average (90th percentile {p90:.3f} ms), the host "
           f"{statistics.mean(host_waits[20:]):.2f} ms in next_batch; one batch's copy takes {copy_ms:.2f} ms "
           f"({nbytes / 2**20:.1f} MiB)")


# ---- normalize-cost (measured, not judged) --------------------------------------------------------------

def normalize_cost():
    """The same pipeline handing float32 batches made by augment, and uint8 batches normalised on the GPU:
    batches a second with the trainer waiting for each (its stream synchronised), and bytes copied a batch."""
    import torch
    batch, n = 1024, 60
    rates = {}
    for name, dtype, sink in (("augment float32, copied", "float32", dict(device=DEVICE)),
                              ("augment uint8, normalize float32 on the GPU", "uint8",
                               dict(device=DEVICE, normalize="float32", mean=MEAN, std=STD))):
        p = shardflow.Pipeline(graph(batch, n + 5, dtype, sink), output="torch", epochs=1)
        for _ in range(5):
            p.next_batch()
        t = time.perf_counter()
        for _ in range(n):
            images, labels = p.next_batch()
            torch.cuda.current_stream().synchronize()
        rates[name] = n / (time.perf_counter() - t)
        p.close()
    copied = {"augment float32, copied": batch * 3 * 32 * 32 * 4,
              "augment uint8, normalize float32 on the GPU": batch * 3 * 32 * 32}
    report("normalize-cost", "INFO", "; ".join(f"{k}: {v:.1f} batches/s of {batch}, {copied[k] / 2**20:.1f} MiB "
                                               f"copied a batch" for k, v in rates.items()))


# ---- zero-copy ------------------------------------------------------------------------------------------

class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


def address(field):
    """Where the producer's tensor lives (DLTensor.data + byte_offset), read before it is handed over."""
    t = _DLTensor.from_address(field._managed)
    return (t.data or 0) + t.byte_offset, (t.device_type, t.device_id)


def zero_copy():
    import torch
    p = shardflow.Pipeline(graph(128, 20, "float32", dict(device=DEVICE)), output="dlpack", epochs=1)
    ref = shardflow.Pipeline(graph(128, 20, "float32"), output="torch_dict", epochs=1)
    d, r = p.next_batch(), ref.next_batch()
    where, device = address(d["ppm"])
    t = torch.from_dlpack(d["ppm"])
    ok = (device == (2, 0) and t.is_cuda and t.data_ptr() == where and torch.equal(bits(t), bits(r["ppm"])))
    report("zero-copy-torch", "PASS" if ok else "FAIL",
           f"DLPack device {device}, torch tensor on {t.device} at 0x{t.data_ptr():x}, the sink's memory at 0x{where:x}"
           f", values {'equal' if torch.equal(bits(t), bits(r['ppm'])) else 'DIFFER'}")
    try:
        import jax
        import jax.dlpack
        import numpy as np
    except ImportError as e:
        report("zero-copy-jax", "SKIP", f"JAX is not installed here ({e})")
        p.close()
        ref.close()
        return
    gpus = [x for x in jax.devices() if x.platform == "gpu"]
    if not gpus:
        report("zero-copy-jax", "SKIP", f"JAX has no GPU backend here (devices: {jax.devices()}; install jax[cuda])")
        p.close()
        ref.close()
        return
    d, r = p.next_batch(), ref.next_batch()
    where, device = address(d["ppm"])
    try:
        a = jax.dlpack.from_dlpack(d["ppm"])
    except TypeError:  # an older JAX takes capsules only: order its work after the copy by hand
        a = jax.dlpack.from_dlpack(d["ppm"].__dlpack__(stream=1))
        torch.cuda.synchronize()
    a.block_until_ready()
    try:
        pointer = a.unsafe_buffer_pointer()
    except AttributeError:  # a JAX without it: the CUDA array interface says the same
        pointer = a.__cuda_array_interface__["data"][0]
    same = np.array_equal(np.asarray(a).view(np.int32), r["ppm"].numpy().view(np.int32))
    ok = pointer == where and same
    on = a.devices() if hasattr(a, "devices") else {a.device()}  # older JAX: device()
    report("zero-copy-jax", "PASS" if ok else "FAIL",
           f"jax {jax.__version__}: array on {list(on)} at 0x{pointer:x}, the sink's memory at 0x{where:x}, "
           f"values {'equal' if same else 'DIFFER'}")
    del a, d
    p.close()
    ref.close()


# ---- cli ------------------------------------------------------------------------------------------------

def cli():
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "sf-gpu-cli.yaml")
    with open(path, "w") as f:
        f.write(graph(256, 200, "uint8", dict(device=DEVICE, normalize="float32", mean=MEAN, std=STD)))
    p = subprocess.run([args.shardflow, "run", path], capture_output=True, text=True, timeout=300)
    ok = p.returncode == 0 and "device_sink" in p.stderr + p.stdout
    lines = [ln for ln in (p.stderr + p.stdout).splitlines() if "device_sink" in ln or "error" in ln]
    report("cli", "PASS" if ok else "FAIL", f"shardflow run with device {DEVICE}, normalize float32: exit "
           f"{p.returncode}; " + " | ".join(lines[-3:]))


if args.dry_run:
    check("same-batches", same_batches)
else:
    import torch
    if not torch.cuda.is_available():
        report("torch-cuda", "FAIL", f"torch {torch.__version__} sees no GPU")
        sys.exit(1)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    check("same-batches", same_batches)
    check("no-leak", no_leak)
    check("overlap", overlap)
    check("zero-copy", zero_copy)
    check("normalize-cost", normalize_cost)
    check("cli", cli)
failed = [n for n, s in results if s == "FAIL"]
print(f"{len(results) - len(failed)} of {len(results)} checks passed or skipped; failed: {', '.join(failed) or 'none'}")
sys.exit(1 if failed else 0)
