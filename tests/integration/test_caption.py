"""The shipped graphs/caption_example.yaml (image + caption + JSON), through the CLI and from Python.

40 samples with 40 different caption lengths, written by `shardflow write` from a JSON-lines manifest (JPEG
files made by PIL, captions and JSON inline), read back with --set / keyword overrides of the urls and the
SentencePiece model (spm_train makes one here). References: tarfile for the keys the shards hold, PIL for the
images (each a solid colour of its own size, so any random resized crop of it is that colour, next to its
caption), python3-sentencepiece's encode() for the token ids, json.loads for meta.
"""
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
os.environ["SHARDFLOW_PLUGIN_PATH"] = os.path.join(os.environ["SF_BUILD_ROOT"], "plugins", "tokenize")
from sfutil import Checks, read_batches, run  # noqa: E402

import shardflow  # noqa: E402

GRAPH = os.path.join(os.environ["SF_SOURCE_ROOT"], "graphs", "caption_example.yaml")
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])  # the graph's normalisation
N, BATCH, SIZE, MAX_LEN = 40, 8, 224, 64

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-caption-")
try:
    rng = random.Random(13)
    syllables = "ka to ri mu sen da lo vé crè zu pha ñe gö ström bar qui lé".split()
    word = lambda: "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))  # noqa: E731
    with open(os.path.join(tmp, "corpus.txt"), "w", encoding="utf-8") as f:
        for _ in range(400):
            f.write(" ".join(word() for _ in range(rng.randint(3, 12))) + "\n")
    p = subprocess.run(["spm_train", f"--input={tmp}/corpus.txt", f"--model_prefix={tmp}/spm", "--vocab_size=200",
                        "--character_coverage=1.0", "--minloglevel=2"], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"spm_train: {p.stderr[-1000:]}")
    model = os.path.join(tmp, "spm.model")
    sp = spm.SentencePieceProcessor(model_file=model)

    # The manifest: one JPEG file per sample, the caption (i + 1 words: 40 lengths) and the JSON inline.
    truth, lines = {}, []
    for i in range(N):
        key = f"cap{i:03d}"
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        path = os.path.join(tmp, f"{key}.jpg")
        Image.new("RGB", (48 + 3 * i, 40 + (7 * i) % 50), colour).save(path, quality=95)
        caption = " ".join(word() for _ in range(i + 1))
        meta = {"id": i, "tags": ["t"] * (i % 5), "source": {"w": 48 + 3 * i, "note": "ünïcode"}}
        truth[key] = {"caption": caption, "meta": meta}
        lines.append(json.dumps({"__key__": key, "jpg": f"{key}.jpg", "txt": {"inline": caption},
                                 "json": {"inline": meta}}))
    with open(os.path.join(tmp, "captions.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    run(["write", os.path.join(tmp, "captions.jsonl"), os.path.join(tmp, "cap-%06d.tar"), "--maxcount", "20", "-q"])
    urls = os.path.join(tmp, "cap-{000000..000001}.tar")

    # The shards as tarfile reads them: the keys, and each image decoded by PIL (its colour).
    members = {}
    for s in range(2):
        with tarfile.open(os.path.join(tmp, f"cap-{s:06d}.tar")) as tf:
            for m in tf:
                key, field = m.name.split(".", 1)
                members.setdefault(key, {})[field] = tf.extractfile(m).read()
    check(sorted(members) == sorted(truth), f"the shards hold the manifest's keys: {sorted(members)[:5]}")
    for key, fields in members.items():
        pixels = np.asarray(Image.open(io.BytesIO(fields["jpg"])).convert("RGB"), dtype=np.float64)
        truth[key]["colour"] = pixels.reshape(-1, 3).mean(0)
        check(sorted(fields) == ["jpg", "json", "txt"], f"{key}: members {sorted(fields)}")

    def check_sample(what, key, image, tokens, length, meta):
        t = truth[key]
        check(tuple(image.shape) == (3, SIZE, SIZE) and str(image.dtype).endswith("float32"),
              f"{what} {key}: image {image.dtype} {tuple(image.shape)}, want float32 (3, {SIZE}, {SIZE})")
        got = (np.asarray(image, dtype=np.float64).reshape(3, -1).mean(1) * STD + MEAN) * 255
        check(np.abs(got - t["colour"]).max() < 3, f"{what} {key}: image colour {got} != PIL's {t['colour']}")
        ids = [sp.bos_id()] + sp.encode(t["caption"]) + [sp.eos_id()]
        want = ids[:MAX_LEN] + [0] * (MAX_LEN - len(ids[:MAX_LEN]))
        check(list(np.asarray(tokens)) == want, f"{what} {key}: tokens {list(np.asarray(tokens))[:8]} != {want[:8]}")
        check(int(length) == len(ids), f"{what} {key}: tokens.length {int(length)} != {len(ids)}")
        check(json.loads(meta) == t["meta"], f"{what} {key}: meta {meta!r} != the manifest's JSON")

    # Through the CLI: the shipped graph, overridden with --set.
    out = os.path.join(tmp, "out")
    run(["run", GRAPH, "--quiet", "--no-summary", "--set", f"shard_source.urls={urls}", "--set",
         f"tokenize.model={model}", "--set", f"batch.batch_size={BATCH}", "--set", f"device_sink.npy_dir={out}"])
    seen = []
    for _, _, keys, f in read_batches(out):
        check(sorted(f) == ["image", "meta", "meta.offsets", "tokens", "tokens.length"], f"CLI fields {sorted(f)}")
        o = f["meta.offsets"]
        for j, key in enumerate(keys):
            check_sample("CLI", key, f["image"][j], f["tokens"][j], f["tokens.length"][j],
                         bytes(f["meta"][o[j]:o[j + 1]]))
        seen += keys
    check(sorted(seen) == sorted(truth), f"CLI: every sample once ({len(seen)})")
    check(len({len(truth[k]["caption"].split()) for k in seen}) == N, "CLI: 40 caption lengths")

    # From Python: keyword overrides; no output given, so rename's order as a tuple.
    seen = []
    with shardflow.Pipeline(GRAPH, urls=urls, model=model, batch_size=BATCH, epochs=1) as pipe:
        for batch in pipe:
            check(isinstance(batch, tuple) and len(batch) == 4, f"Python: a 4-tuple: {type(batch)}")
            image, tokens, length, meta = batch
            check(len(meta) == len(image), "Python: meta is one entry per sample")
            # the tuple carries no keys: find each sample by its meta id (checked against the manifest below)
            for j in range(len(meta)):
                key = f"cap{json.loads(meta[j])['id']:03d}"
                check_sample("Python", key, image[j], tokens[j], length[j], meta[j])
                seen.append(key)
    check(sorted(seen) == sorted(truth), f"Python: every sample once ({len(seen)})")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
check.done("caption")
