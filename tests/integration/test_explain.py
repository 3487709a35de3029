"""The plan (`shardflow run --explain`): replicas for map stages the graph file leaves unset (one per CPU of the
process's budget, which taskset narrows), and where a JPEG may travel undecoded from decode to augment. Where
the plan defers, a JPEG corrupt past its header is augment's error record (augment decoded it); where it does not
(a group boundary, a plugin stage between them, defer_jpeg: false), decode's. Batches of the graph as written equal
those of the same graph with replicas 1 and no deferral written out, and a field augment's `fields` leaves out is
decoded by augment, equal to decode's pixels, instead of reaching the batch undecoded."""
import io
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, read_batches, run, write_graph, write_shard  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-explain-")
PLUGIN = os.environ.get("SF_EXAMPLE_PLUGIN")
try:
    rng = np.random.default_rng(3)

    def jpeg(h, w, **kw):
        b = io.BytesIO()
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(b, "JPEG", quality=90, **kw)
        return b.getvalue()

    good = [jpeg(120, 160) for _ in range(6)]
    clean = write_shard(os.path.join(tmp, "clean.tar"),
                        [(f"k{i}", {"jpg": j, "png": j, "cls": b"%d" % i}) for i, j in enumerate(good)] +
                        [("prog", {"jpg": jpeg(100, 90, progressive=True), "png": good[0], "cls": b"7"})])
    # Truncated past a valid header: the region augment reads (the whole image: scale 1) reaches the cut.
    broken = write_shard(os.path.join(tmp, "broken.tar"), [("ok", {"jpg": good[0], "cls": b"0"}),
                                                           ("cut", {"jpg": good[1][:-2000], "cls": b"1"})])

    def graph(name, urls, decode=None, augment=None, between=None, group=False, **settings):
        g = {"group": "decoders"} if group else {}
        stages = [("shard_source", dict(urls=urls, shuffle=False)), ("tar_split", {}), ("decode", dict(decode or {}, **g))]
        if between:
            stages.append(between)
        aug = dict(crop="random_resized", size=32, scale=[1, 1], ratio=[0.5, 2], flip=0.5, dtype="float32",
                   layout="chw")
        stages += [("augment", dict(aug, **(augment or {}))), ("batch", dict(batch_size=2, partial=True)),
                   ("device_sink", dict(npy_dir=os.path.join(tmp, name)))]
        groups = {"decoders": {"processes": 1}} if group else None
        if between and between[0] == "scale":
            settings["plugins"] = [PLUGIN]
        return write_graph(os.path.join(tmp, name + ".yaml"), stages, groups=groups, seed=4, epochs=1, **settings)

    def explain(path, *extra, cpus=None):
        cmd = ([] if cpus is None else ["taskset", "-c", cpus]) + [os.environ["SHARDFLOW"], "run", "--explain", path]
        p = subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"--explain {os.path.basename(path)}: status {p.returncode} {p.stderr}")
        return p.stdout

    def node_line(text, name):
        return next((ln for ln in text.splitlines() if ln.split()[:1] == [name]), "")

    def first_record(path, *extra):
        p = run(["run", path, "--quiet", "--no-summary", *extra], check=False)
        lines = [ln for ln in p.stderr.splitlines() if "(key cut)" in ln]
        return lines[0].split("error: ", 1)[-1].split(":", 1)[0] if lines else f"none: {p.stderr[-400:]}"

    # 1. As a user writes it: decode and augment planned one replica per CPU, decode -> augment deferred.
    cpus = len(os.sched_getaffinity(0))
    plain = graph("plain", broken, error_policy="skip")
    text = explain(plain)
    check(f"replicas {cpus} " in node_line(text, "decode") and "planned" in node_line(text, "decode"),
          f"decode planned at {cpus} replica(s): {node_line(text, 'decode')!r}")
    check(f"replicas {cpus} " in node_line(text, "augment"), f"augment too: {node_line(text, 'augment')!r}")
    check("replicas 1 " in node_line(text, "tar_split") and "keeps state" in node_line(text, "tar_split"),
          f"tar_split keeps one: {node_line(text, 'tar_split')!r}")
    check("-> augment: may carry deferred fields" in text, f"decode -> augment deferred:\n{text}")
    # The deferred edge holds a few images' worth (4 MiB as pixels), or queue_bytes where that says less.
    check("the edge holds at most 4 MiB of them" in text, f"deferred edge: 4 MiB cap:\n{text}")
    small = graph("small_budget", broken, error_policy="skip", queue_bytes="1MiB")
    check("the edge holds at most 1 MiB of them" in explain(small), "deferred edge: queue_bytes 1MiB is less")
    check(first_record(small) == "augment", "deferred under a small budget: the corrupt JPEG is augment's record")
    check(first_record(plain) == "augment", "deferred: the corrupt JPEG is augment's record")
    drawn = run(["dot", plain]).stdout
    check('"decode" -> "augment" [label="deferred fields"]' in drawn and f"replicas {cpus} (planned)" in drawn,
          f"shardflow dot draws the plan:\n{drawn}")
    check(first_record(plain, "--set", "decode.defer_jpeg=false") == "decode",
          "defer_jpeg false: decode's record")

    # 2. The budget: one CPU by taskset plans one replica; written replicas are kept, a neighbour agrees.
    one = explain(plain, cpus="0")
    check("1 CPU(s)" in one and "replicas 1 " in node_line(one, "decode"), f"taskset -c 0: one replica:\n{one}")
    pinned = explain(plain, "--set", "decode.replicas=3")
    check("replicas 3 " in node_line(pinned, "decode") and "override" in node_line(pinned, "decode"),
          f"--set replicas kept: {node_line(pinned, 'decode')!r}")
    check("replicas 3 " in node_line(pinned, "augment") or cpus == 1,
          f"the planned neighbour agrees: {node_line(pinned, 'augment')!r}")
    # Planned stages between two written counts (3 and 4) cannot take both: one of them gets one replica, and the
    # plan ends (it traded the counts back and forth for ever before).
    between_written = write_graph(os.path.join(tmp, "between.yaml"), [
        ("shard_source", dict(urls=clean)), ("tar_split", {}), ("decode", dict(replicas=3)),
        ("rename", dict(names="a=jpg,b=cls")), ("augment", dict(fields=["a"])),
        ("rename", dict(name="r2", names="x=a,y=b")), ("rename", dict(name="r3", names="x=x,y=y", replicas=4)),
        ("batch", dict(batch_size=2, partial=True)), ("device_sink", {})], epochs=1)
    text = explain(between_written)
    counts = [int(node_line(text, n).split("replicas")[1].split()[0]) for n in ("decode", "rename", "augment", "r2", "r3")]
    check(counts[0] == 3 and counts[4] == 4 and all(a == b or 1 in (a, b) for a, b in zip(counts, counts[1:])),
          f"planned between written 3 and 4: adjacent counts agree {counts}")
    run(["run", between_written, "--quiet", "--no-summary"], timeout=60)
    written = graph("written", broken, decode=dict(replicas=1))
    check("written in the graph file" in node_line(explain(written), "decode"), "replicas written: kept")

    # 3. No deferral across a group boundary (decode in a group, augment in the head) ...
    grouped = graph("grouped", broken, error_policy="skip", group=True)
    text = explain(grouped)
    check("may carry deferred" not in text and "does not take deferred fields" in text,
          f"group boundary: decoded in the worker:\n{text}")
    check(first_record(grouped) == "decode", "group boundary: decode's record")
    check("deferred fields" not in run(["dot", grouped]).stdout, "shardflow dot: no deferred edge into the head")
    # ... nor with a plugin stage between decode and augment.
    if PLUGIN:
        between = graph("between", broken, error_policy="skip", between=("scale", dict(field="jpg", factor=1)))
        text = explain(between)
        check("may carry deferred" not in text and "decoded here" in text, f"plugin between: no deferral:\n{text}")
        check(first_record(between) == "decode", "plugin between: decode's record")

    # 4. The same batches as replicas 1 without deferral, progressive JPEG (decoded by decode) included; a
    #    field augment leaves out (png kept, jpg not in `fields`) is decoded by augment as decode would.
    def batches(name, **kw):
        path = graph(name, clean, **kw)
        run(["run", path, "--quiet", "--no-summary"])
        return read_batches(os.path.join(tmp, name))

    def same(a, b):
        return len(a) > 0 and len(a) == len(b) and all(
            x[2] == y[2] and set(x[3]) == set(y[3]) and all(np.array_equal(x[3][k], y[3][k]) for k in x[3])
            for x, y in zip(a, b))

    pinned_one = dict(replicas=1, defer_jpeg=False)
    check(same(batches("as_written"), batches("by_hand", decode=pinned_one, augment=dict(replicas=1))),
          "as written (planned replicas, deferred) = replicas 1, no deferral")
    left_out = batches("left_out", augment=dict(fields=["png"]))
    reference = batches("left_out_ref", decode=pinned_one, augment=dict(fields=["png"], replicas=1))
    check(same(left_out, reference), "a JPEG augment's fields leave out: augment decodes it as decode would")
    check(all(b[3]["jpg"].dtype == np.uint8 and b[3]["jpg"].ndim == 4 for b in left_out),
          "the left-out JPEG reaches the batch decoded (uint8 [B,H,W,3])")

    # 5. What a group sends (group option wire_form): a group whose results cross a socket (listen:) and whose last
    #    stage is an augment with float output sends uint8 HWC crops and a planned augment on the head normalises
    #    them: batches equal to one process's and to wire_form: as_written, for float32 CHW with mean/std and for
    #    bfloat16 HWC with padding; kept as written when the augment already makes uint8, when it is not the group's
    #    last stage, and when as_written pins it. The group starts its one worker itself and listens too.
    from sfutil import free_port, stage_table  # noqa: E402

    def wire_graph(name, augment, group=None, after=None, grouped=True):
        g = {"group": "decoders"} if grouped else {}
        stages = [("shard_source", dict(urls=clean, shuffle=False)), ("tar_split", {}), ("decode", dict(g)),
                  ("augment", dict(augment, **g))]
        if after:
            stages.append((after[0], dict(after[1], **g)))
        stages += [("batch", dict(batch_size=2, partial=True)), ("device_sink", dict(npy_dir=os.path.join(tmp, name)))]
        opts = dict({"processes": 1, "listen": f"tcp://127.0.0.1:{free_port()}", "plaintext": True}, **(group or {}))
        return write_graph(os.path.join(tmp, name + ".yaml"), stages, groups={"decoders": opts} if grouped else None,
                           seed=4, epochs=1)

    normalised = dict(crop="random_resized", size=24, scale=[0.3, 1], flip=0.5, mean=[0.4, 0.5, 0.6],
                      std=[0.2, 0.25, 0.3], layout="chw", dtype="float32")
    padded = dict(crop="random", size=100, padding=8, flip=0.5, layout="hwc", dtype="bfloat16")
    for label, aug, factor in (("float32 CHW, mean/std", normalised, "4x fewer bytes than float32"),
                               ("bfloat16 HWC, padding", padded, "2x fewer bytes than bfloat16")):
        tag = aug["dtype"]
        path = wire_graph(f"wire_{tag}", aug)
        text = explain(path)
        check(f"decoders -> head: uint8 HWC crops over the wire ({factor})" in text and
              "augment_normalize" in node_line(text, "augment_normalize"), f"{label}: planned uint8 crops:\n{text}")
        # What crossed from the worker: the head counts result bytes (the two image fields of 7 samples; cls, 8
        # bytes, goes by the socket), uint8 crops planned, the float output as written.
        crop = 7 * 2 * 3 * (24 * 24 if tag == "float32" else 100 * 100)

        def sent(stderr):
            line = next((ln for ln in stderr.splitlines() if "bytes through shared memory" in ln), "")
            return int(line.split("results: ")[1].split()[0]) if line else -1

        p = run(["run", path, "--log-steps", "0"], check=False)
        table = stage_table(p.stderr)
        check(p.returncode == 0 and table.get("augment_normalize", {}).get("items") == 7,
              f"{label}: the stage table has the head's augment_normalize (7 samples): {sorted(table)}\n{p.stderr[-600:]}")
        check(sent(p.stderr) == crop, f"{label}: {crop} bytes of uint8 crops sent, not {sent(p.stderr)}")
        planned = read_batches(os.path.join(tmp, f"wire_{tag}"))
        pinned_path = wire_graph(f"pinned_{tag}", aug, group={"wire_form": "as_written"})
        check("wire_form: as_written" in explain(pinned_path) and
              "augment_normalize" not in explain(pinned_path), f"{label}: as_written keeps the float output")
        p = run(["run", pinned_path, "--no-summary", "--log-steps", "0"])
        check(sent(p.stderr) == crop * (4 if tag == "float32" else 2), f"{label}: as written, {tag} sent")
        run(["run", wire_graph(f"alone_{tag}", aug, grouped=False), "--quiet", "--no-summary"])
        alone = read_batches(os.path.join(tmp, f"alone_{tag}"))
        check(same(planned, alone) and same(read_batches(os.path.join(tmp, f"pinned_{tag}")), alone),
              f"{label}: batches of the planned wire form = as_written = one process")
        want = (np.float32, (3, 24, 24)) if tag == "float32" else (np.uint16, (100, 100, 3))  # bfloat16's bits
        check(all(b[3]["jpg"].dtype == want[0] and b[3]["jpg"].shape[1:] == want[1] for b in planned),
              f"{label}: the trainer gets {tag} {want[1]}, not the uint8 crops")
    uint8 = wire_graph("wire_uint8", dict(crop="center", size=24, layout="hwc", dtype="uint8"))
    text = explain(uint8)
    check("uint8, as the group's augment writes it" in text and "_normalize" not in text,
          f"augment already uint8: nothing added:\n{text}")
    not_last = wire_graph("wire_not_last", normalised, after=("rename", dict(names="image=jpg,label=cls")))
    text = explain(not_last)
    check("as the group's last stage makes them" in text and "_normalize" not in text,
          f"augment not the group's last stage: nothing added:\n{text}")

    # 6. The pool spends the budget where the work is: as written (replicas planned for decode and augment), a
    #    decode-bound graph (large PNGs, a small crop) keeps decode the busiest, an augment-bound one (tiny PNGs
    #    resized up, float32) augment; the stages' busy seconds together never exceed the pool's threads x the
    #    run's time, also with one CPU by taskset.
    import json

    def png(side):
        b = io.BytesIO()
        Image.fromarray((rng.random((side, side, 3)) * 255).astype(np.uint8)).save(b, "PNG", compress_level=1)
        return b.getvalue()

    big_png, tiny_png = png(900), png(16)
    for bound, blob, aug in [("decode", big_png, dict(crop="center", size=16, dtype="uint8", layout="hwc")),
                             ("augment", tiny_png, dict(crop="center", size=448, resize=448, dtype="float32",
                                                        layout="chw", mean=[0.5] * 3, std=[0.25] * 3))]:
        shard = write_shard(os.path.join(tmp, f"{bound}-bound.tar"), [(f"{i:04d}", {"png": blob, "cls": b"1"})
                                                                       for i in range(24 if bound == "decode" else 200)])
        path = write_graph(os.path.join(tmp, f"{bound}-bound.yaml"), [
            ("shard_source", dict(urls=shard, shuffle=False)), ("tar_split", {}), ("decode", {}),
            ("augment", aug), ("batch", dict(batch_size=4, partial=True)), ("device_sink", {})], epochs=1)
        for cpus_arg in (None, "0"):
            stats = os.path.join(tmp, f"{bound}-{cpus_arg}.jsonl")
            cmd = ([] if cpus_arg is None else ["taskset", "-c", cpus_arg]) + [
                os.environ["SHARDFLOW"], "run", path, "--quiet", "--no-summary", "--stats-json", stats]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            check(p.returncode == 0, f"{bound}-bound run: {p.stderr[-500:]}")
            last = [json.loads(line) for line in open(stats)][-1]
            nodes = {n["name"]: n for n in last["nodes"]}
            threads = 1 if cpus_arg else cpus
            other = "augment" if bound == "decode" else "decode"
            check(nodes[bound]["busy_seconds"] > 2 * nodes[other]["busy_seconds"] and nodes["decode"]["replicas"]
                  == threads, f"{bound}-bound ({threads} CPU(s)): {bound} busiest, replicas planned: "
                  f"{[(n, nodes[n]['busy_seconds'], nodes[n]['replicas']) for n in ('decode', 'augment')]}")
            busy = sum(n["busy_seconds"] for n in last["nodes"])
            check(busy <= threads * last["elapsed_seconds"] * 1.05 + 0.05,
                  f"{bound}-bound ({threads} CPU(s)): stages busy {busy:.2f} s within {threads} thread(s) x "
                  f"{last['elapsed_seconds']:.2f} s")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.done("explain")
