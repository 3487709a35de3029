"""The tokenize plugin against Debian's python3-sentencepiece, with a model spm_train makes here.

The built tokenize.so runs in a graph through the CLI (`plugins: [PATH]`: shard_source, tar_split, tokenize,
batch of 1, device_sink's .npy dumps); every ids field is compared with sentencepiece's own encode() of the
same text (padding, cut, length, bos/eos), and errors with the CLI's error records.
"""
import os
import random
import re
import subprocess
import sys
import tempfile

import numpy as np

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import read_batches, run, write_shard  # noqa: E402

PLUGIN = os.environ["SF_TOKENIZE_PLUGIN"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Sharded tar files feed the accelerators while the CPU decodes images.",
    "Café crème brûlée, naïve façade, jalapeño, smörgåsbord, Ærø and Łódź.",
    "Ein Würfel fällt über die Straße; où est la gare? ¿Dónde está?",
    "Tokens are integers; padding fills the rest of the row up to max_length.",
    "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation: ( ) [ ] { } , . ; !",
]

TEXTS = {
    "ascii": b"the lazy dog jumps over the quick brown fox",
    "accented": "Crème brûlée à la façade, naïve Łódź".encode(),
    "empty": b"",
    "newline": b"two lines\nof text\n",
    "long": b" ".join([b"sharded tar files feed the accelerators"] * 12),
    "unseen": "日本語 emoji \U0001F600 ok".encode(),  # characters outside the vocabulary: unk ids
}


def run_stage(shard, *options, check=True):
    """Runs the shard through tokenize (options: "name=value") in a graph. Returns (the CLI's process,
    {key: {field: {dtype, shape, values}}} of the int32/int64 fields, {errors, skipped, last_error} from stderr)."""
    out, graph = shard + ".out", shard + ".yaml"
    opts = "".join(f"    {o.split('=', 1)[0]}: {o.split('=', 1)[1]!r}\n" for o in options)
    with open(graph, "w") as f:
        f.write(f"plugins: [{PLUGIN}]\nseed: 0\nepochs: 1\nmax_error_rate: 1\nstages:\n"
                f"  - type: shard_source\n    urls: {shard}\n    shuffle: false\n  - type: tar_split\n"
                f"  - type: tokenize\n{opts}  - type: batch\n    batch_size: 1\n"
                f"  - type: device_sink\n    npy_dir: {out}\n")
    p = run(["run", graph, "--quiet", "--no-summary"], check=check, env=dict(os.environ, SHARDFLOW_PLUGIN_PATH=""))
    got = {}
    for _, _, keys, fields in read_batches(out):
        got[keys[0]] = {name: {"dtype": str(a.dtype), "shape": list(a.shape[1:]), "values": a[0].ravel().tolist()}
                        for name, a in fields.items() if a.dtype in (np.int32, np.int64)}
    counted = re.search(r"(\d+) error record\(s\), (\d+) sample\(s\) skipped", p.stderr)
    errors = re.findall(r"^shardflow: error: (tokenize: .*)$", p.stderr, re.M)
    return p, got, {"errors": int(counted.group(1)) if counted else 0,
                    "skipped": int(counted.group(2)) if counted else 0, "last_error": errors[-1] if errors else ""}


def expect(ref_ids, max_length, pad_id):
    return ref_ids[:max_length] + [pad_id] * (max_length - len(ref_ids[:max_length]))


def check_all(checks, got, sp, max_length, pad_id, output="tokens", bos=False, eos=False):
    for key, data in TEXTS.items():
        ref = sp.encode(data.decode(), add_bos=bos, add_eos=eos)
        fields = got.get(key)
        if fields is None:
            checks.append(f"{key}: missing from the output")
            continue
        tokens, length = fields[output], fields[output + ".length"]
        if tokens["dtype"] != "int32" or tokens["shape"] != [max_length]:
            checks.append(f"{key}: {output} is {tokens['dtype']} {tokens['shape']}, want int32 [{max_length}]")
        if tokens["values"] != expect(ref, max_length, pad_id):
            checks.append(f"{key}: ids {tokens['values']} != reference {expect(ref, max_length, pad_id)}")
        if length["dtype"] != "int64" or length["shape"] != [] or length["values"] != [len(ref)]:
            checks.append(f"{key}: {output}.length {length} != int64 scalar {len(ref)}")


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("\n".join(CORPUS) + "\n")
            rng = random.Random(10)  # made-up words, so that 200 pieces exist to learn
            syllables = "ka to ri mu sen da lo vé crè zu pha ñe gö ström bar qui lé".split()
            for _ in range(400):
                f.write(" ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
                                 for _ in range(rng.randint(3, 12))) + "\n")
        models = {}
        for model_type in ("unigram", "bpe"):
            prefix = os.path.join(tmp, model_type)
            p = subprocess.run(["spm_train", f"--input={corpus}", f"--model_prefix={prefix}", "--vocab_size=200",
                                f"--model_type={model_type}", "--character_coverage=1.0", "--minloglevel=2"],
                               capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                raise AssertionError(f"spm_train failed: {p.stderr[-2000:]}")
            models[model_type] = prefix + ".model"

        shard = write_shard(os.path.join(tmp, "text-000000.tar"),
                            [(k, {"txt": v, "cls": b"1"}) for k, v in TEXTS.items()] +
                            [("badutf8", {"txt": b"abc\xc3\x28 overlong \xc0\xaf", "cls": b"2"}),
                             ("notext", {"cls": b"3"})])

        # Defaults (field txt, output tokens, pad 0), unigram; the long text is cut at max_length.
        sp = spm.SentencePieceProcessor(model_file=models["unigram"])
        if len(sp.encode(TEXTS["long"].decode())) <= 16:
            failures.append("the long text does not exceed max_length: the cut is not tested")
        p, got, summary = run_stage(shard, f"model={models['unigram']}", "max_length=16")
        check_all(failures, got, sp, 16, 0)
        # Bad UTF-8 and a missing field are errors naming the shard and key; the samples are skipped and counted.
        if sorted(got) != sorted(TEXTS):
            failures.append(f"output keys {sorted(got)} != {sorted(TEXTS)}")
        if summary["errors"] != 2 or summary["skipped"] != 2:
            failures.append(f"errors/skipped {summary['errors']}/{summary['skipped']}, want 2/2")
        # The records as printed (with replicas, which of the two comes last varies).
        missing = [ln for ln in p.stderr.splitlines() if "key notext" in ln] + [summary["last_error"]]
        if not any(shard in ln and "no field 'txt'" in ln for ln in missing if "key notext" in ln):
            failures.append(f"missing-field error does not name shard, key and field: {missing}")

        # BPE, bos/eos, another pad id and output name, a max_length longer than every text.
        sp = spm.SentencePieceProcessor(model_file=models["bpe"])
        p, got, summary = run_stage(shard, f"model={models['bpe']}", "max_length=300", "pad_id=-1",
                                    "output=ids", "add_bos=true", "add_eos=true")
        check_all(failures, got, sp, 300, -1, output="ids", bos=True, eos=True)

        bad = write_shard(os.path.join(tmp, "bad-000000.tar"), [("badutf8", {"txt": b"abc\xc3\x28"})])
        p, got, summary = run_stage(bad, f"model={models['bpe']}", check=False)  # the epoch has no sample
        last = summary["last_error"]
        if got or summary["skipped"] != 1 or bad not in last or "key badutf8" not in last \
                or "invalid UTF-8 at byte 3" not in last:
            failures.append(f"bad UTF-8: output {got}, summary {summary}")

        # graphs/tokenize_example.yaml through the CLI: `plugins: [tokenize]` found by name on SHARDFLOW_PLUGIN_PATH.
        clean = write_shard(os.path.join(tmp, "clean-000000.tar"), [(k, {"txt": v}) for k, v in TEXTS.items()])
        out = os.path.join(tmp, "graph-out")
        build = os.environ.get("SF_BUILD_ROOT", "build-test")
        env = dict(os.environ, SHARDFLOW_PLUGIN_PATH=os.path.join(build, "plugins", "tokenize"))
        p = subprocess.run([os.environ.get("SHARDFLOW", "build-test/shardflow"), "run",
                            os.path.join(os.environ.get("SF_SOURCE_ROOT", "."), "graphs", "tokenize_example.yaml"),
                            "--quiet", "--no-summary", "--set", f"shard_source.urls={clean}",
                            "--set", f"tokenize.model={models['bpe']}", "--set", f"batch.batch_size={len(TEXTS)}",
                            "--set", f"device_sink.npy_dir={out}"], capture_output=True, text=True, env=env, timeout=120)
        if p.returncode != 0:
            failures.append(f"graphs/tokenize_example.yaml: exit {p.returncode}: {p.stderr[-2000:]}")
        else:
            ids = np.load(os.path.join(out, "e000_b000000_tokens.npy"))
            keys = open(os.path.join(out, "e000_b000000_keys.txt")).read().split()
            for row, key in enumerate(keys):
                want = expect([sp.bos_id()] + sp.encode(TEXTS[key].decode()) + [sp.eos_id()], 128, 0)
                if list(ids[row]) != list(want):
                    failures.append(f"graph: {key}: {list(ids[row])[:12]} != sentencepiece {list(want)[:12]}")

        # graphs/pretrain_packed.yaml: tokenize -> pack -> shuffle -> batch, sequences of 32 tokens. The segments of
        # all sequences are exactly sentencepiece's ids of the texts (bos/eos added; the empty text too: 2 ids),
        # each cut into pieces of 32 (overflow: split); segment ids, positions and cu_seqlens agree with them.
        out = os.path.join(tmp, "packed-out")
        p = subprocess.run([os.environ.get("SHARDFLOW", "build-test/shardflow"), "run",
                            os.path.join(os.environ.get("SF_SOURCE_ROOT", "."), "graphs", "pretrain_packed.yaml"),
                            "--quiet", "--no-summary", "--set", f"shard_source.urls={clean}",
                            "--set", f"tokenize.model={models['bpe']}", "--set", "pack.length=32",
                            "--set", f"device_sink.npy_dir={out}"], capture_output=True, text=True, env=env, timeout=120)
        if p.returncode != 0:
            failures.append(f"graphs/pretrain_packed.yaml: exit {p.returncode}: {p.stderr[-2000:]}")
        else:
            want, got = [], []
            for text in TEXTS.values():
                ids = [sp.bos_id()] + sp.encode(text.decode()) + [sp.eos_id()]
                want += [tuple(ids[i:i + 32]) for i in range(0, len(ids), 32)]
            for _, _, keys, f in read_batches(out):
                for j in range(len(keys)):
                    tokens, seg, pos = f["tokens"][j], f["tokens.segment_ids"][j], f["tokens.positions"][j]
                    cu = f["tokens.cu_seqlens"][f["tokens.cu_seqlens.offsets"][j]:f["tokens.cu_seqlens.offsets"][j + 1]]
                    if tokens.shape != (32,) or list(cu) != [0] + [int((seg <= k).sum() - (seg == 0).sum())
                                                                   for k in range(1, seg.max() + 1)]:
                        failures.append(f"packed: sample {keys[j]}: shape {tokens.shape}, cu_seqlens {cu}, seg {seg}")
                    for k in range(1, seg.max() + 1):
                        if list(pos[seg == k]) != list(range((seg == k).sum())):
                            failures.append(f"packed: sample {keys[j]} segment {k}: positions {pos[seg == k]}")
                        got.append(tuple(int(t) for t in tokens[seg == k]))
            if sorted(got) != sorted(want) or len(want) <= len(TEXTS):
                failures.append(f"packed: segments {sorted(got)} != sentencepiece's pieces {sorted(want)}")

        # A model that cannot be loaded fails init with a message naming the path.
        missing = os.path.join(tmp, "nope.model")
        p, got, summary = run_stage(shard, f"model={missing}", check=False)
        if p.returncode == 0 or missing not in p.stderr or "SentencePiece" not in p.stderr:
            failures.append(f"missing model: exit {p.returncode}, stderr {p.stderr!r}")

    # The plugin exports its entry point and nothing else (C++ and sentencepiece symbols stay hidden).
    nm = subprocess.run(["nm", "-D", "--defined-only", PLUGIN], capture_output=True, text=True)
    exported = [line.split()[-1] for line in nm.stdout.splitlines() if " T " in line or " D " in line]
    if nm.returncode == 0 and exported != ["sf_plugin_entry"]:
        failures.append(f"tokenize.so exports {exported}, want only sf_plugin_entry")

    for f in failures:
        print("FAIL:", f)
    print(f"{'FAIL' if failures else 'ok'}: tokenize plugin vs python3-sentencepiece ({len(failures)} failures)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
