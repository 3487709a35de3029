"""gs:// through the endpoint override (SF_GCS_ENDPOINT), against a real nginx standing in for GCS's XML API:
the bucket answers 401 unless `Authorization: Bearer <token>`; a listing (ListBucketResult, generated here with
Python's xml library from the files) serves prefixes; the token comes from GOOGLE_OAUTH_ACCESS_TOKEN or from a
metadata server (GCE_METADATA_HOST, nginx again, which demands `Metadata-Flavor: Google`).
A pipeline over gs:// shards yields the keys Python's tarfile finds; uploads and downloads go through
`shardflow cp`; a wrong token is refused with a clear 401 message that never shows the token."""
import os
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, nginx, read_batches, run, tar_keys, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-gs-")
root = os.path.join(tmp, "www")
shards_dir = os.path.join(root, "bkt", "train")
os.makedirs(shards_dir)
os.makedirs(os.path.join(root, "bkt", "up"))
_, truth = make_dataset(shards_dir, shards=3, per_shard=25, size=12)
with open(os.path.join(shards_dir, "notes.txt"), "w") as f:
    f.write("not a shard\n")

# The listing GCS would give for prefix "train/" (nginx serves it for GET /bkt?...).
result = ET.Element("ListBucketResult", xmlns="http://doc.s3.amazonaws.com/2006-03-01")
ET.SubElement(result, "Name").text = "bkt"
ET.SubElement(result, "Prefix").text = "train/"
ET.SubElement(result, "IsTruncated").text = "false"
for name in sorted(os.listdir(shards_dir), reverse=True):  # the engine sorts
    c = ET.SubElement(result, "Contents")
    ET.SubElement(c, "Key").text = f"train/{name}"
    ET.SubElement(c, "Size").text = str(os.path.getsize(os.path.join(shards_dir, name)))
ET.ElementTree(result).write(os.path.join(root, "listing.xml"), xml_declaration=True, encoding="UTF-8")
with open(os.path.join(root, "token.json"), "w") as f:
    f.write('{"access_token":"tok-from-metadata","expires_in":3599,"token_type":"Bearer"}')

TOKEN = "ya29.tok-123"
# GCS's XML API answers errors with an XML body naming its own code.
UNAUTHENTICATED = ("'<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AuthenticationRequired</Code>"
                   "<Message>Authentication required.</Message></Error>'")
DENIED = ("'<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>Access denied: "
          "reader@example.iam does not have storage.objects.get access.</Message></Error>'")
LOCATIONS = f"""
    location = /bkt {{
      default_type application/xml;
      if ($http_authorization !~ "^Bearer (ya29\\.tok-123|tok-from-metadata)$") {{ return 401 {UNAUTHENTICATED}; }}
      try_files /listing.xml =404;
    }}
    location /bkt/ {{
      default_type application/xml;
      if ($http_authorization !~ "^Bearer (ya29\\.tok-123|tok-from-metadata)$") {{ return 401 {UNAUTHENTICATED}; }}
      dav_methods PUT DELETE; create_full_put_path on; client_max_body_size 0;
    }}
    location /bkt/private/ {{ default_type application/xml; return 403 {DENIED}; }}
    location = /computeMetadata/v1/instance/service-accounts/default/token {{
      if ($http_metadata_flavor != "Google") {{ return 403; }}
      default_type application/json; try_files /token.json =404;
    }}
"""


local = [os.path.join(shards_dir, f"shard-{i:06d}.tar") for i in range(3)]

with nginx(root, LOCATIONS) as base:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GS_", "GOOGLE_", "GCE_", "STORAGE_EMU"))}
    env.update(GOOGLE_OAUTH_ACCESS_TOKEN=TOKEN, SF_GCS_ENDPOINT=base, GCE_METADATA_HOST="127.0.0.1:1")

    p = run(["ls", "--shards", "gs://bkt/train/"], env=env)
    want = [f"gs://bkt/train/shard-{i:06d}.tar" for i in range(3)]
    check(p.stdout.split() == want, "the prefix lists the .tar objects, sorted: " + p.stdout)

    out = os.path.join(tmp, "out")
    graph = write_graph(os.path.join(tmp, "g.yaml"), [
        ("shard_source", dict(urls="gs://bkt/train/", shuffle=False)),
        ("tar_split", {}),
        ("decode", {}),
        ("batch", dict(batch_size=25)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=1, error_policy="fail")
    p = run(["run", graph, "--quiet", "--no-summary"], env=env, check=False)
    check(p.returncode == 0, "the pipeline over gs:// ran: " + p.stderr)
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    check(keys == tar_keys(*local), f"pipeline keys equal tarfile's ({len(keys)} of {len(truth)})")
    labels = [int(v) for _, _, _, f in read_batches(out) for v in f["cls"]]
    check(labels == [truth[k][1] for k in keys], "labels travel with their samples")

    # Uploads and downloads with the token.
    blob = os.path.join(tmp, "ckpt.bin")
    with open(blob, "wb") as f:
        f.write(os.urandom(200_000))
    run(["cp", blob, "gs://bkt/up/run 1/ckpt.bin"], env=env)
    stored = os.path.join(root, "bkt", "up", "run 1", "ckpt.bin")
    check(open(stored, "rb").read() == open(blob, "rb").read(), "upload to gs:// (key with a space)")
    back = os.path.join(tmp, "back.bin")
    run(["cp", "gs://bkt/up/run 1/ckpt.bin", back], env=env)
    check(open(back, "rb").read() == open(blob, "rb").read(), "download from gs://")

    # The token from the metadata server.
    md = {k: v for k, v in env.items() if k != "GOOGLE_OAUTH_ACCESS_TOKEN"}
    md["GCE_METADATA_HOST"] = base.split("//")[1]
    p = run(["ls", "--shards", "gs://bkt/train/"], env=md)
    check(p.stdout.split() == want, "a token from the metadata server")
    run(["cp", "gs://bkt/train/shard-000001.tar", back], env=md)
    check(open(back, "rb").read() == open(local[1], "rb").read(), "download with the metadata server's token")

    # No token anywhere: the message says where tokens come from.
    p = run(["ls", "--shards", "gs://bkt/train/"], env=dict(md, GCE_METADATA_HOST="127.0.0.1:1"), check=False)
    check(p.returncode == 1 and "GOOGLE_OAUTH_ACCESS_TOKEN" in p.stderr and "metadata" in p.stderr,
          "no credentials: " + p.stderr)

    # A wrong token: 401, named URL and token source, never the token.
    bad = dict(env, GOOGLE_OAUTH_ACCESS_TOKEN="ya29.WRONG-secret-777")
    for args in (["ls", "--shards", "gs://bkt/train/"], ["cp", "gs://bkt/train/shard-000000.tar", back],
                 ["cp", blob, "gs://bkt/up/x.bin"]):
        p = run(args, env=bad, check=False)
        msg = p.stdout + p.stderr
        check(p.returncode == 1 and "401" in msg and "gs://bkt/" in msg and "GOOGLE_OAUTH_ACCESS_TOKEN" in msg,
              f"{args}: clear 401 message: {msg}")
        check("WRONG-secret-777" not in msg, f"{args}: the token is not shown")
    p = run(["run", graph, "--quiet", "--no-summary"], env=bad, check=False)
    check(p.returncode != 0 and "401" in p.stderr and "WRONG-secret-777" not in p.stdout + p.stderr,
          "the pipeline refuses a wrong token (401) without showing it: " + p.stderr[-500:])
    # The pipeline's own downloads (not the listing) name the store's code and the token's source, like cp.
    one = write_graph(os.path.join(tmp, "one.yaml"), [
        ("shard_source", dict(urls="gs://bkt/train/shard-000000.tar", shuffle=False)),
        ("tar_split", dict(retries=0)),
        ("batch", dict(batch_size=25)),
        ("device_sink", {}),
    ], seed=1, epochs=1, error_policy="fail")
    p = run(["run", one, "--quiet", "--no-summary"], env=bad, check=False)
    check(p.returncode != 0 and "401 AuthenticationRequired" in p.stderr and "GOOGLE_OAUTH_ACCESS_TOKEN" in p.stderr
          and "gs://bkt/train/shard-000000.tar" in p.stderr and "WRONG-secret-777" not in p.stdout + p.stderr,
          "a download with a wrong token: the store's code and the token's source: " + p.stderr)
    denied = write_graph(os.path.join(tmp, "denied.yaml"), [
        ("shard_source", dict(urls="gs://bkt/private/shard-000000.tar", shuffle=False)),
        ("tar_split", dict(retries=0)),
        ("batch", dict(batch_size=25)),
        ("device_sink", {}),
    ], seed=1, epochs=1, error_policy="fail")
    p = run(["run", denied, "--quiet", "--no-summary"], env=env, check=False)
    check(p.returncode != 0 and "403 AccessDenied" in p.stderr and "storage.objects.get" in p.stderr
          and "GOOGLE_OAUTH_ACCESS_TOKEN" in p.stderr, "a download refused (403): code, message, token source: "
          + p.stderr)

check.done("gs")
