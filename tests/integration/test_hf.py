"""hf://datasets/ORG/NAME[@REVISION]/PATH against a local server that answers as the Hugging Face Hub does
(its documented URL scheme): /datasets/ORG/NAME/resolve/REVISION/PATH answers 302 to a CDN on another port
(another host to libcurl), which serves the bytes; /api/datasets/ORG/NAME/tree/REVISION/PATH lists files as
JSON, paged with a Link: rel="next" header; 401 without the token for a private dataset, 404 with
X-Error-Code otherwise.

Checks: downloads equal the files; @revision (and a %2F-encoded one) picks the revision; HF_TOKEN (and the
token file huggingface-cli login writes) goes to the Hub as a bearer token and never to the CDN; listings and a
pipeline over a prefix, keys against Python's tarfile; errors name the URL and HF_TOKEN, never the token."""
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_urls, run, tar_keys  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-hf-")
TOKEN = "hf_testtoken_x9Q2"
REPO = "datasets/someorg/private-set"

local_dir = os.path.join(tmp, "local")
os.makedirs(local_dir)
_, truth = make_dataset(local_dir, shards=5, per_shard=20, size=8)
local = [os.path.join(local_dir, f"shard-{i:06d}.tar") for i in range(5)]
# The repository's files by revision: main has 4 shards under data/ and a README; v1 an older shard 0;
# refs/convert/parquet one file.
files = {
    "main": {f"data/shard-{i:06d}.tar": open(local[i], "rb").read() for i in range(4)},
    "v1": {"data/shard-000000.tar": open(local[4], "rb").read()},
    "refs/convert/parquet": {"x/y.tar": open(local[1], "rb").read()},
}
files["main"]["README.md"] = b"# a dataset card\n"
blobs = {hashlib.sha256(d).hexdigest(): d for rev in files.values() for d in rev.values()}
seen = []  # (server, method, path, authorization)


class Cdn(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        seen.append(("cdn", "GET", self.path, self.headers.get("Authorization")))
        data = blobs.get(self.path.split("?")[0].rsplit("/", 1)[-1])
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        self.end_headers()
        self.wfile.write(data)


class Hub(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        seen.append(("hub", self.command, self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.answer(401, b'{"error":"Invalid username or password."}', [("X-Error-Code", "RepoNotFound")])
            return
        parts = url.path.split("/")
        api = parts[1] == "api"
        if api:
            parts = parts[1:]
        # /datasets/ORG/NAME/{resolve|tree}/REVISION/PATH...
        if "/".join(parts[1:4]) != REPO or len(parts) < 6 or parts[4] != ("tree" if api else "resolve"):
            self.answer(404, b'{"error":"Repository not found"}', [("X-Error-Code", "RepoNotFound")])
            return
        rev = urllib.parse.unquote(parts[5])
        path = urllib.parse.unquote("/".join(parts[6:]))
        if rev not in files:
            self.answer(404, b'{"error":"Revision not found"}', [("X-Error-Code", "RevisionNotFound")])
            return
        if api:
            q = urllib.parse.parse_qs(url.query)
            listed = sorted(p for p in files[rev] if not path or p.startswith(path + "/"))
            entries = [{"type": "file", "path": p, "size": len(files[rev][p]), "oid": "0"} for p in listed]
            dirs = sorted({p.rsplit("/", 1)[0] for p in listed if "/" in p})
            entries += [{"type": "directory", "path": d, "oid": "0", "size": 0} for d in dirs]
            start = int(q.get("cursor", ["0"])[0])
            page = entries[start:start + 2]  # 2 entries a page: pagination is exercised
            links = []
            if start + 2 < len(entries):
                nxt = f"http://127.0.0.1:{hub.server_port}{url.path}?recursive=true&cursor={start + 2}"
                links = [("Link", f'<{nxt}>; rel="next"')]
            self.answer(200, json.dumps(page).encode(), [("Content-Type", "application/json")] + links)
            return
        data = files[rev].get(path)
        if data is None:
            self.answer(404, b'{"error":"Entry not found"}', [("X-Error-Code", "EntryNotFound")])
            return
        sha = hashlib.sha256(data).hexdigest()
        # As the Hub answers for LFS files: a redirect to the CDN, with the file's hash as X-Linked-Etag.
        self.answer(302, b"", [("Location", f"http://127.0.0.1:{cdn.server_port}/repos/{sha}?Expires=1"),
                               ("X-Linked-Etag", f'"{sha}"'), ("X-Linked-Size", str(len(data)))])


hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
cdn = ThreadingHTTPServer(("127.0.0.1", 0), Cdn)
for s in (hub, cdn):
    threading.Thread(target=s.serve_forever, daemon=True).start()

try:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{hub.server_port}", HF_TOKEN=TOKEN, HOME=tmp)
    base = f"hf://{REPO}"
    back = os.path.join(tmp, "back.tar")

    # Downloads through the redirect: the bytes, the token to the Hub only.
    for url, want in ((f"{base}/data/shard-000002.tar", files["main"]["data/shard-000002.tar"]),
                      (f"hf://{REPO}@v1/data/shard-000000.tar", files["v1"]["data/shard-000000.tar"]),
                      (f"hf://{REPO}@refs%2Fconvert%2Fparquet/x/y.tar", files["refs/convert/parquet"]["x/y.tar"])):
        del seen[:]
        p = run(["cp", url, back], env=env, check=False)
        check(p.returncode == 0 and open(back, "rb").read() == want, f"cp {url}: {p.stderr}")
        check([s[0] for s in seen] == ["hub", "cdn"] and seen[0][3] == f"Bearer {TOKEN}",
              f"{url}: asked the Hub with the token, then the CDN: {seen}")
        check(seen[-1][3] is None, f"{url}: the token is not sent to the CDN: {seen}")
    rev_paths = [s[2] for s in seen if s[0] == "hub"]
    check(rev_paths == [f"/{REPO}/resolve/refs%2Fconvert%2Fparquet/x/y.tar"],
          f"the revision stays encoded: {rev_paths}")

    # The token file huggingface-cli login writes ($HF_HOME/token), when HF_TOKEN is unset.
    hf_home = os.path.join(tmp, "hf-home")
    os.makedirs(hf_home)
    with open(os.path.join(hf_home, "token"), "w") as f:
        f.write(TOKEN + "\n")
    no_token = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    p = run(["cp", f"{base}/README.md", back], env=dict(no_token, HF_HOME=hf_home), check=False)
    check(p.returncode == 0 and open(back, "rb").read() == files["main"]["README.md"], "token file: " + p.stderr)

    # Listings: the tree API's files under the prefix, every page; ls --shards keeps the shards.
    want = [f"{base}/data/shard-{i:06d}.tar" for i in range(4)]
    del seen[:]
    p = run(["ls", "--shards", f"{base}/data/"], env=env, check=False)
    check(p.stdout.splitlines() == want, f"ls --shards of a prefix: {p.stdout}{p.stderr}")
    check(len([s for s in seen if "/api/" in s[2]]) == 3, f"3 pages of the tree API: {seen}")
    p = run(["ls", "--shards", f"{base}/"], env=env, check=False)
    check(p.stdout.splitlines() == want, f"the whole repository's shards: {p.stdout}{p.stderr}")
    p = run(["ls", "--shards", f"hf://{REPO}@v1/data/"], env=env, check=False)
    check(p.stdout.splitlines() == [f"hf://{REPO}@v1/data/shard-000000.tar"], f"a revision's listing: {p.stdout}")

    # A pipeline over the prefix: every sample once, the keys tarfile finds in the files.
    p, keys, labels = read_urls(tmp, f"{base}/data/", env)
    check(p.returncode == 0, "the pipeline over hf:// ran: " + p.stderr)
    check(keys == tar_keys(*local[:4]), f"pipeline keys equal tarfile's ({len(keys)})")
    check(labels == [truth[k][1] for k in keys], "labels travel with their samples")
    check(all(s[3] is None for s in seen if s[0] == "cdn"), "the pipeline's downloads kept the token from the CDN")

    # Errors: no token, a wrong one, a missing file, a missing revision; uploads refused.
    for what, e, url, words in (
            ("no token", no_token, f"{base}/data/shard-000000.tar", ["401", "HF_TOKEN"]),
            ("a wrong token", dict(env, HF_TOKEN="hf_wrong_token_77"), f"{base}/data/", ["401", "HF_TOKEN"]),
            ("a missing file", env, f"{base}/data/missing.tar", ["404", "no such dataset, revision or file"]),
            ("a missing revision", env, f"hf://{REPO}@v9/data/shard-000000.tar", ["404"])):
        args = ["ls", "--shards", url] if url.endswith("/") else ["cp", url, back]
        p = run(args, env=e, check=False)
        check(p.returncode == 1 and url in p.stderr and all(w in p.stderr for w in words), f"{what}: {p.stderr}")
        check(TOKEN not in p.stderr and "hf_wrong_token_77" not in p.stderr, f"{what}: no token in the message")
    p = run(["cp", local[0], f"{base}/data/new.tar"], env=env, check=False)
    check(p.returncode == 1 and "read-only" in p.stderr, "an upload to hf:// is refused: " + p.stderr)
    p = run(["cp", "hf://models/x/y/z.tar", back], env=env, check=False)
    check(p.returncode == 1 and "hf://datasets/ORG/NAME" in p.stderr, "only datasets: " + p.stderr)
finally:
    hub.shutdown()
    cdn.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)

check.done("hf")
