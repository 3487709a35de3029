"""az:// against Azurite (npm registry, installed and started by tools/azurite.sh), Microsoft's emulator, which
checks every Shared Key signature and SAS token itself.

Uploads with `shardflow cp` (Put Blob; Put Block + Put Block List forced with SF_OBJECT_PART_SIZE) and
`shardflow write`, read back byte for byte by this file's own Shared Key client (written from the spec, not from
shardflow); prefix listings (paged with markers) against List Blobs; a pipeline over an az:// prefix, its keys
against Python's tarfile; a download broken mid-way and resumed with a signed Range + If-Match; the shard cache's
signed If-None-Match; a wrong key and a bad SAS token refused with a message naming the URL and the credentials'
source, never the secret; a container SAS token (service SAS made here) from AZURE_STORAGE_SAS_TOKEN and in the
URL."""
import base64
import datetime
import hashlib
import hmac
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(__file__))
from fault_proxy import FaultProxy  # noqa: E402
from sfutil import (Checks, free_port, local_server, make_dataset, read_batches, read_urls, run, tar_keys,  # noqa: E402
                    write_graph)

check = Checks()
SOURCE = os.environ.get("SF_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
tmp = tempfile.mkdtemp(prefix="sf-azure-")
# Azurite's well-known development account and key (published in its documentation).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
VERSION = "2021-08-06"

try:
    subprocess.run([os.path.join(SOURCE, "tools", "azurite.sh"), "install"], capture_output=True, text=True,
                   timeout=300, check=True)
except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
    raise SystemExit(f"cannot install Azurite with tools/azurite.sh: {getattr(e, 'stderr', e)}")

port = free_port()
data_dir = os.path.join(tmp, "azurite")
os.makedirs(data_dir)


def azure(method, path, query="", body=b"", headers=None):
    """One request to Azurite signed with Shared Key by this file (the spec's string to sign, independently of
    shardflow's signer). path: "/container/blob" (unencoded). Returns (status, body bytes)."""
    wire_path = f"/{ACCOUNT}" + urllib.parse.quote(path)
    h = {"x-ms-date": datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT"),
         "x-ms-version": VERSION, **(headers or {})}
    params = urllib.parse.parse_qsl(query, keep_blank_values=True)
    resource = f"/{ACCOUNT}{wire_path}" + "".join(f"\n{k.lower()}:{v}" for k, v in sorted(params))
    std = ["Content-Encoding", "Content-Language", "Content-Length", "Content-MD5", "Content-Type", "Date",
           "If-Modified-Since", "If-Match", "If-None-Match", "If-Unmodified-Since", "Range"]
    lower = {k.lower(): v for k, v in h.items()}
    values = [str(len(body)) if s == "Content-Length" and body else lower.get(s.lower(), "") for s in std]
    ms = "".join(f"{k}:{v}\n" for k, v in sorted(lower.items()) if k.startswith("x-ms-"))
    to_sign = method + "\n" + "\n".join(values) + "\n" + ms + resource
    sig = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    h["Authorization"] = f"SharedKey {ACCOUNT}:{sig}"
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, wire_path + ("?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
                                   if params else ""), body=body or None, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def list_blobs(container, prefix):
    status, data = azure("GET", f"/{container}", f"restype=container&comp=list&prefix={prefix}")
    assert status == 200, data
    return [b.find("Name").text for b in ET.fromstring(data).iter("Blob")]


def container_sas(container, permissions="rl", expiry="2099-01-01T00:00:00Z"):
    """A service SAS for a container (version 2019-02-02's string to sign)."""
    sv = "2019-02-02"
    fields = [permissions, "", expiry, f"/blob/{ACCOUNT}/{container}", "", "", "https,http", sv, "c", "", "", "",
              "", "", ""]
    sig = base64.b64encode(hmac.new(base64.b64decode(KEY), "\n".join(fields).encode(), hashlib.sha256).digest())
    return urllib.parse.urlencode(dict(sv=sv, sr="c", sp=permissions, se=expiry, spr="https,http",
                                       sig=sig.decode()))


try:
    with local_server([os.path.join(SOURCE, "tools", "azurite.sh"), "run", data_dir, str(port)], port, "Azurite"):
        endpoint = f"http://127.0.0.1:{port}/{ACCOUNT}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "SF_OBJECT"))}
        env.update(AZURE_STORAGE_ENDPOINT=endpoint, AZURE_STORAGE_KEY=KEY, HOME=tmp)
        for c in ("shards", "written"):
            status, data = azure("PUT", f"/{c}", "restype=container")
            check(status == 201, f"container {c} created: {status} {data[:200]}")

        # Uploads: 4 shards under "train/" (a space and a '+' in names), one as two blocks; other blobs around.
        local_dir = os.path.join(tmp, "local")
        os.makedirs(local_dir)
        _, truth = make_dataset(local_dir, shards=4, per_shard=30, size=16)
        names = ["shard-000000.tar", "shard-000001.tar", "shard+000002.tar", "shard 000003.tar"]
        local = [os.path.join(local_dir, f"shard-{i:06d}.tar") for i in range(4)]
        base = f"az://{ACCOUNT}/shards"
        for i, (path, name) in enumerate(zip(local, names)):
            e = dict(env, SF_OBJECT_PART_SIZE="50000") if i == 1 else env  # 80 KiB: Put Block twice + Put Block List
            p = run(["cp", path, f"{base}/train/{name}"], env=e, check=False)
            check(p.returncode == 0, f"cp to az:// {name}: {p.stderr}")
        notes = os.path.join(tmp, "README.txt")
        with open(notes, "w") as f:
            f.write("not a shard\n")
        run(["cp", notes, f"{base}/train/README.txt"], env=env, check=False)
        run(["cp", local[0], f"{base}/trainset/elsewhere.tar"], env=env, check=False)
        for path, name in zip(local, names):
            status, data = azure("GET", f"/shards/train/{name}")
            check(status == 200 and data == open(path, "rb").read(), f"read back {name!r} byte for byte ({status})")
        status, data = azure("GET", "/shards/train/shard-000001.tar", "comp=blocklist&blocklisttype=committed")
        blocks = [b.find("Size").text for b in ET.fromstring(data).iter("Block")] if status == 200 else data
        check(blocks == ["50000", str(os.path.getsize(local[1]) - 50000)],
              f"the large shard is 2 committed blocks: {blocks}")

        # `shardflow write` straight to az://: the uploaded shards are byte for byte a local write's.
        import numpy as np
        from PIL import Image
        tree = os.path.join(tmp, "tree")
        rng = np.random.default_rng(3)
        for c in ("cat", "dog"):
            os.makedirs(os.path.join(tree, c))
            for i in range(5):
                Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(os.path.join(tree, c,
                                                                                                     f"{i}.png"))
        written = os.path.join(tmp, "written")
        run(["write", "--quiet", "--maxcount", "4", tree, os.path.join(written, "w-%06d.tar")], env=env)
        p = run(["write", "--quiet", "--maxcount", "4", tree, f"az://{ACCOUNT}/written/w-%06d.tar"], env=env,
                check=False)
        check(p.returncode == 0, "write to az://: " + p.stderr)
        for name in sorted(n for n in os.listdir(written) if n.endswith(".tar")):  # not the local shards' indexes
            status, data = azure("GET", f"/written/{name}")
            check(status == 200 and data == open(os.path.join(written, name), "rb").read(),
                  f"write uploads {name} intact")

        # Listing a prefix: the shards only, sorted, as List Blobs has them; paged (2 a page, with markers) alike.
        want = sorted(f"{base}/{n}" for n in list_blobs("shards", "train/") if n.endswith(".tar"))
        check(len(want) == 4, f"List Blobs sees the 4 shards: {want}")
        for e in (env, dict(env, SF_OBJECT_LIST_MAX_KEYS="2")):
            p = run(["ls", "--shards", f"{base}/train/"], env=e, check=False)
            check(p.stdout.splitlines() == want, f"ls --shards of the prefix:\n{p.stdout}{p.stderr}\nwanted {want}")
        p = run(["ls", "--shards", f"{base}/"], env=env, check=False)
        check(p.stdout.splitlines() == sorted(want + [f"{base}/trainset/elsewhere.tar"]), "the container: " + p.stdout)
        p = run(["ls", "--shards", f"{base}/nothing/"], env=env, check=False)
        check(p.returncode == 1 and "no .tar" in p.stderr and f"{base}/nothing/" in p.stderr,
              "empty prefix: " + p.stderr)

        # Downloads, and a missing blob.
        back = os.path.join(tmp, "back.tar")
        p = run(["cp", f"{base}/train/shard+000002.tar", back], env=env, check=False)
        check(p.returncode == 0 and open(back, "rb").read() == open(local[2], "rb").read(), "download: " + p.stderr)
        p = run(["cp", f"{base}/train/missing.tar", back], env=env, check=False)
        check(p.returncode == 1 and "404" in p.stderr and f"{base}/train/missing.tar" in p.stderr and
              "BlobNotFound" in p.stderr, "a missing blob: " + p.stderr)

        # A pipeline over the prefix: every sample once, the keys tarfile finds in the local shards.
        by_url = {f"{base}/train/{name}": path for path, name in zip(local, names)}
        want_keys = tar_keys(*[by_url[u] for u in want])
        p, keys, labels = read_urls(tmp, f"{base}/train/", env)
        check(p.returncode == 0, "the pipeline over az:// ran: " + p.stderr)
        check(keys == want_keys, f"pipeline keys equal tarfile's, in listing order ({len(keys)} of {len(want_keys)})")
        check(labels == [truth[k][1] for k in keys], "labels travel with their samples")

        # Ranged GETs: the connection breaks after 30000 bytes; the retry asks for the rest with Range and If-Match,
        # both signed (Azurite refuses the request otherwise), and the shard reads whole.
        blob_path = f"/{ACCOUNT}/shards/train/shard-000000.tar"
        with FaultProxy(port, {blob_path: [("reset", 30000)]}) as proxy:
            one = write_graph(os.path.join(tmp, "one.yaml"), [
                ("shard_source", dict(urls=f'"{base}/train/shard-000000.tar"', shuffle=False)),
                ("tar_split", dict(retries=3)),
                ("batch", dict(batch_size=10, partial=True)),
                ("device_sink", dict(npy_dir=os.path.join(tmp, "ranged"))),
            ], seed=1, epochs=1, error_policy="fail")
            p = run(["run", one, "--quiet", "--no-summary"], env=dict(env,
                                                                      AZURE_STORAGE_ENDPOINT=f"{proxy.base}/{ACCOUNT}"),
                    check=False)
            seen = proxy.requests(blob_path)
            keys = [k for _, _, ks, _ in read_batches(os.path.join(tmp,
                                                                   "ranged")) for k in ks] if p.returncode == 0 else []
            check(p.returncode == 0 and keys == tar_keys(local[0]), f"the broken download resumed: {p.stderr}")
            check(len(seen) == 2 and seen[1]["range"] and seen[1]["range"].startswith("bytes=") and seen[1]["if_match"],
                  f"the retry was a signed Range + If-Match request: {seen}")

        # The shard cache: the second run revalidates with a signed If-None-Match (304) and reads the cached shard.
        cached = write_graph(os.path.join(tmp, "cached.yaml"), [
            ("shard_source", dict(urls=f'"{base}/train/shard-000000.tar"', shuffle=False)),
            ("tar_split", dict(cache_dir=os.path.join(tmp, "shard-cache"))),
            ("batch", dict(batch_size=10, partial=True)),
            ("device_sink", {}),
        ], seed=1, epochs=1, error_policy="fail")
        for run_no, counts in enumerate(("0 hit(s), 0 stale, 1 miss(es)", "1 hit(s), 0 stale, 0 miss(es)")):
            p = run(["run", cached, "--quiet", "--no-summary"], env=env, check=False)
            check(p.returncode == 0 and f"shard cache: {counts}" in p.stderr,
                  f"cache run {run_no}: {counts}: {p.stderr}")

        # A wrong key: refused by Azurite; the message names the URL and the key's source, never the key.
        wrong = base64.b64encode(b"not-the-key-of-this-account-x9").decode()
        bad = dict(env, AZURE_STORAGE_KEY=wrong)
        for args in (["cp", notes, f"{base}/x.tar"], ["cp", f"{base}/train/shard-000000.tar", back],
                     ["ls", "--shards", f"{base}/train/"], ["run", one, "--quiet", "--no-summary"]):
            p = run(args, env=bad, check=False)
            msg = p.stdout + p.stderr
            check(p.returncode != 0 and "403" in msg and "the store refused the account key in AZURE_STORAGE_KEY" in msg
                  and "is a key of this account" in msg and f"{base}/" in msg, f"{args[:2]}: refused, explained: {msg}")
            check(wrong not in msg, f"{args[:2]}: the key is not in the message")
        check("x.tar" not in list_blobs("shards", ""), "the refused upload left nothing")
        p = run(["ls", "--shards", f"{base}/train/"], env=dict(env, AZURE_STORAGE_KEY="not base64!"), check=False)
        check(p.returncode == 1 and "AZURE_STORAGE_KEY is not base64" in p.stderr,
              "a key that is not base64: " + p.stderr)

        # SAS tokens: a container SAS (read, list) from AZURE_STORAGE_SAS_TOKEN, and in the URL; a bad one refused.
        sas = container_sas("shards")
        sas_env = {k: v for k, v in env.items() if k != "AZURE_STORAGE_KEY"}
        p = run(["ls", "--shards", f"{base}/train/"], env=dict(sas_env, AZURE_STORAGE_SAS_TOKEN="?" + sas), check=False)
        check(p.stdout.splitlines() == want, f"a listing with AZURE_STORAGE_SAS_TOKEN: {p.stdout}{p.stderr}")
        p = run(["cp", f"{base}/train/shard 000003.tar", back], env=dict(sas_env, AZURE_STORAGE_SAS_TOKEN=sas),
                check=False)
        check(p.returncode == 0 and open(back, "rb").read() == open(local[3], "rb").read(),
              "download with a SAS: " + p.stderr)
        p = run(["cp", f"{base}/train/shard-000001.tar?{sas}", back], env=sas_env, check=False)
        check(p.returncode == 0 and open(back, "rb").read() == open(local[1], "rb").read(),
              "a SAS in the URL: " + p.stderr)
        forged = re.sub(r"sig=[^&]+", "sig=" + urllib.parse.quote(base64.b64encode(b"x" * 32).decode()), sas)
        p = run(["cp", f"{base}/train/shard-000001.tar", back], env=dict(sas_env, AZURE_STORAGE_SAS_TOKEN=forged),
                check=False)
        check(p.returncode == 1 and "403" in p.stderr and "SAS" in p.stderr
              and f"{base}/train/shard-000001.tar" in p.stderr,
              "a forged SAS is refused, named: " + p.stderr)
        check(urllib.parse.parse_qs(forged)["sig"][0] not in p.stderr, "the SAS signature is not shown")
        p = run(["cp", f"{base}/train/shard-000001.tar?{forged}", back], env=sas_env, check=False)
        check(p.returncode == 1 and "the SAS token in the URL" in p.stderr and "sig=***" in p.stderr and
              urllib.parse.parse_qs(forged)["sig"][0] not in p.stderr, "a forged SAS in the URL, redacted: " + p.stderr)
        p = run(["cp", notes, f"{base}/y.tar"], env=dict(sas_env, AZURE_STORAGE_SAS_TOKEN=sas), check=False)
        check(p.returncode == 1 and "403" in p.stderr, "a read-only SAS cannot upload: " + p.stderr)
        # AZURE_STORAGE_CONNECTION_STRING (as Azurite's documentation gives it): its key and endpoint, alone.
        conn = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={endpoint};")
        p = run(["ls", "--shards", f"{base}/train/"], env=dict(sas_env, AZURE_STORAGE_ENDPOINT="",
                                                               AZURE_STORAGE_CONNECTION_STRING=conn), check=False)
        check(p.stdout.splitlines() == want, f"a listing with AZURE_STORAGE_CONNECTION_STRING: {p.stdout}{p.stderr}")
        other = conn.replace(f"AccountName={ACCOUNT}", "AccountName=someoneelse")
        p = run(["ls", "--shards", f"{base}/train/"], env=dict(sas_env, AZURE_STORAGE_CONNECTION_STRING=other),
                check=False)
        check(p.returncode == 1 and "not public" in p.stderr, "another account's connection string is not used: "
              + p.stderr)
        # No credentials at all: a private container refuses, and the message says what to set.
        p = run(["ls", "--shards", f"{base}/train/"], env=sas_env, check=False)
        check(p.returncode == 1 and "not public" in p.stderr and "set AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN" in
              p.stderr,
              "anonymous access to a private container: " + p.stderr)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

check.done("azure")
