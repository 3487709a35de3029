"""The engine's SigV4 signer against botocore's (Debian's python3-botocore signs offline at a fixed date).

For a corpus of awkward keys and listing queries, under path-style and virtual-host addressing, with and
without a session token, signed and unsigned payloads: the http(s) URL the engine builds must be the one
botocore's S3 serializer builds (key percent-encoded once, '/' and '~' kept), and the Authorization header
must be byte-identical. A mismatch prints both canonical requests. Also: credentials from a profile in a
shared credentials file, and the secret never appears in the engine's output or error messages."""
import datetime
import hashlib
import os
import subprocess
import sys
import tempfile
import types
import urllib.parse

try:
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
    from botocore.utils import percent_encode, percent_encode_sequence
except ImportError:
    print("skip: python3-botocore is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks  # noqa: E402

TOOL = os.environ.get("SF_SIGV4_REFERENCE", "build/tests/sigv4_reference")
check = Checks()

KEY_ID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ+token/with=chars"
WHEN = datetime.datetime(2026, 11, 22, 4, 38, 29)
EPOCH = int(WHEN.replace(tzinfo=datetime.timezone.utc).timestamp())


class FixedDateTime(datetime.datetime):
    @classmethod
    def utcnow(cls):
        return WHEN


# botocore's add_auth reads datetime.datetime.utcnow(): pin it.
botocore.auth.datetime = types.SimpleNamespace(datetime=FixedDateTime)

KEYS = [
    "train/shard-000000.tar",
    "with space/a b.tar",
    "plus+sign.tar",
    "percent%20literal%.tar",
    "tilde~and-dash_dot.tar",
    "equals=and&amp.tar",
    "unicodé/日本語/ß.tar",
    "double//slash.tar",
    "trailing/",
    "question?hash#.tar",
    "colon:semi;comma,at@dollar$.tar",
    "quote'dq\"paren().tar",
    "star*bang!.tar",
    "/leading-slash.tar",
    "a/./b/../c.tar",
]
LISTINGS = [
    ("", None),
    ("train/", None),
    ("with space/", None),
    ("plus+/and=&/", "1/abc+def=="),
    ("unicodé/", "Y29udGludWF0aW9uLXRva2VuL3dpdGgvc2xhc2hlcysrPT0="),
]


def engine(method, url, query, payload, env):
    p = subprocess.run([TOOL, method, url, query or "-", str(EPOCH), payload or "-"], capture_output=True,
                       text=True, env=env, timeout=30)
    if p.returncode != 0:
        raise AssertionError(f"sigv4_reference {method} {url} failed: {p.stderr}")
    out = {"headers": {}}
    lines = p.stdout.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("URL "):
            out["url"] = line[4:]
        elif line.startswith("HEADER "):
            name, _, value = line[7:].partition(": ")
            out["headers"][name.lower()] = value
        elif line.startswith("CREDENTIALS "):
            out["credentials"] = line[12:]
        elif line == "CANONICAL":
            out["canonical"] = "\n".join(lines[i + 1:]).rstrip("\n")
            break
    out["stdout"], out["stderr"] = p.stdout, p.stderr
    return out


def reference(method, base_url, path, params, payload, region, token, unsigned):
    """botocore: the URL as its S3 serializer builds it ({Key+} percent-encoded with '/~' safe), then signed."""
    url = base_url + path
    if params:
        url += "?" + percent_encode_sequence(params)
    headers = {}
    req = botocore.awsrequest.AWSRequest(method=method, url=url, headers=headers, data=payload or b"")
    if unsigned:
        req.context["client_config"] = types.SimpleNamespace(s3={"payload_signing_enabled": False})
    creds = botocore.credentials.Credentials(KEY_ID, SECRET, token)
    auth = botocore.auth.S3SigV4Auth(creds, "s3", region)
    auth.add_auth(req)
    signed = req.headers["Authorization"]
    del req.headers["Authorization"]
    canonical = auth.canonical_request(req)
    req.headers["Authorization"] = signed
    return url, req.headers, canonical


def compare(what, ours, url, headers, canonical):
    same_url = ours["url"] == url or sorted_query(ours["url"]) == sorted_query(url)
    same_auth = ours["headers"].get("authorization") == headers["Authorization"]
    if not (same_url and same_auth):
        print(f"MISMATCH for {what}\n  engine URL:   {ours['url']}\n  botocore URL: {url}")
        print(f"  engine Authorization:   {ours['headers'].get('authorization')}")
        print(f"  botocore Authorization: {headers['Authorization']}")
        print("--- engine canonical request ---\n" + ours["canonical"])
        print("--- botocore canonical request ---\n" + canonical)
    check(same_url, f"{what}: URL")
    check(same_auth, f"{what}: Authorization")
    check(ours["headers"].get("x-amz-date") == headers["X-Amz-Date"], f"{what}: x-amz-date")
    check(ours["headers"].get("x-amz-content-sha256") == headers["X-Amz-Content-SHA256"], f"{what}: payload hash")
    if "X-Amz-Security-Token" in headers:
        check(ours["headers"].get("x-amz-security-token") == headers["X-Amz-Security-Token"], f"{what}: token")
    check(SECRET not in ours["stdout"] + ours["stderr"], f"{what}: the secret is not printed")


def sorted_query(url):
    """The URL with its query's parameters in sorted order (the order on the wire does not matter)."""
    base, _, query = url.partition("?")
    return base + "?" + "&".join(sorted(query.split("&")))


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GS_", "GOOGLE_"))}
    env.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, HOME=tempfile.mkdtemp(prefix="sf-home-"))
    env.update(extra)
    return env


# Each setting: environment, how botocore's URL starts for a bucket, the region, the session token.
SETTINGS = [
    ("path-style endpoint", dict(AWS_ENDPOINT_URL="http://127.0.0.1:9000", AWS_REGION="eu-west-3"),
     lambda b: ("http://127.0.0.1:9000", f"/{b}"), "eu-west-3", None),
    ("AWS virtual-host + session token", dict(AWS_SESSION_TOKEN=TOKEN, AWS_DEFAULT_REGION="us-west-2"),
     lambda b: (f"https://{b}.s3.us-west-2.amazonaws.com", ""), "us-west-2", TOKEN),
    ("S3 endpoint with base path, forced virtual", dict(AWS_ENDPOINT_URL_S3="http://LocalHost:4568",
                                                        AWS_ENDPOINT_URL="http://unused:1",
                                                        AWS_S3_ADDRESSING_STYLE="virtual"),
     lambda b: (f"http://{b}.localhost:4568", ""), "us-east-1", None),
]

for name, extra, where, region, token in SETTINGS:
    env = base_env(**extra)
    bucket = "my-bucket"
    host, prefix = where(bucket)
    for key in KEYS:
        for method, payload, unsigned in [("GET", None, False), ("PUT", b"shard bytes \x00\xff", False),
                                          ("HEAD", None, True)]:
            path = prefix + "/" + percent_encode(key, safe="/~")
            url, headers, canonical = reference(method, host, path, None, payload, region, token, unsigned)
            digest = None if unsigned else hashlib.sha256(payload or b"").hexdigest()
            ours = engine(method, f"s3://{bucket}/{key}", None, digest, env)
            compare(f"[{name}] {method} {key!r}", ours, url, headers, canonical)
    # Listings: ListObjectsV2 query strings (a prefix with spaces, continuation tokens with '+', '/', '=').
    for list_prefix, continuation in LISTINGS:
        params = {"list-type": "2", "prefix": list_prefix, "encoding-type": "url"}
        query = "list-type=2&prefix=" + urllib.parse.quote(list_prefix, safe="") + "&encoding-type=url"
        if continuation:
            params["continuation-token"] = continuation
            query += "&continuation-token=" + urllib.parse.quote(continuation, safe="")
        url, headers, canonical = reference("GET", host, prefix or "/", params, None, region, token, False)
        ours = engine("GET", f"s3://{bucket}", query, hashlib.sha256(b"").hexdigest(), env)
        compare(f"[{name}] list {list_prefix!r} {continuation!r}", ours, url, headers, canonical)
        # the same query given raw (unencoded) signs the same
        raw = f"list-type=2&prefix={list_prefix.replace('&', '%26').replace('=', '%3D')}&encoding-type=url"
        if continuation:
            raw += "&continuation-token=" + continuation.replace("=", "%3D").replace("+", "%2B")
        ours_raw = engine("GET", f"s3://{bucket}", raw, hashlib.sha256(b"").hexdigest(), env)
        check(ours_raw["headers"]["authorization"] == ours["headers"]["authorization"],
              f"[{name}] list {list_prefix!r}: raw and encoded query strings sign alike")

# A bucket name with dots stays path-style on AWS (virtual hosts with dots break TLS certificates).
env = base_env(AWS_REGION="us-east-1")
url, headers, canonical = reference("GET", "https://s3.us-east-1.amazonaws.com", "/my.dotted.bucket/k.tar",
                                    None, None, "us-east-1", None, False)
ours = engine("GET", "s3://my.dotted.bucket/k.tar", None, hashlib.sha256(b"").hexdigest(), env)
compare("dotted bucket", ours, url, headers, canonical)

# Credentials and region from files: AWS_PROFILE in AWS_SHARED_CREDENTIALS_FILE, region from AWS_CONFIG_FILE.
tmp = tempfile.mkdtemp(prefix="sf-aws-")
with open(os.path.join(tmp, "credentials"), "w") as f:
    f.write("[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n"
            f"[training]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n")
with open(os.path.join(tmp, "config"), "w") as f:
    f.write("[default]\nregion = us-east-1\n[profile training]\nregion = ap-south-1\n")
env = base_env(AWS_PROFILE="training", AWS_SHARED_CREDENTIALS_FILE=os.path.join(tmp, "credentials"),
               AWS_CONFIG_FILE=os.path.join(tmp, "config"), AWS_ENDPOINT_URL="http://127.0.0.1:9000")
del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
url, headers, canonical = reference("GET", "http://127.0.0.1:9000", "/b/x%20y.tar", None, None, "ap-south-1",
                                    None, False)
ours = engine("GET", "s3://b/x y.tar", None, hashlib.sha256(b"").hexdigest(), env)
compare("profile [training] from files", ours, url, headers, canonical)
check("profile [training]" in ours["credentials"] and SECRET not in ours["credentials"],
      "the credential source names the profile and file: " + ours["credentials"])

# No credentials at all: a clear refusal naming where they are looked for.
env = base_env(AWS_SHARED_CREDENTIALS_FILE=os.path.join(tmp, "none"))
del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
p = subprocess.run([TOOL, "GET", "s3://b/k.tar", "-", str(EPOCH)], capture_output=True, text=True, env=env)
check(p.returncode == 1 and "AWS_ACCESS_KEY_ID" in p.stderr and "s3://b/k.tar" in p.stderr,
      "missing credentials are refused with a message naming the URL and the variables: " + p.stderr)

# gs:// with HMAC keys: SigV4 against storage.googleapis.com, region "auto".
env = base_env(GS_ACCESS_KEY_ID=KEY_ID, GS_SECRET_ACCESS_KEY=SECRET)
url, headers, canonical = reference("GET", "https://storage.googleapis.com", "/bkt/a%20b.tar", None, None, "auto",
                                    None, False)
ours = engine("GET", "gs://bkt/a b.tar", None, hashlib.sha256(b"").hexdigest(), env)
compare("gs:// HMAC", ours, url, headers, canonical)

# gs:// with a bearer token: no signature, the token in Authorization, the endpoint override.
env = base_env(GOOGLE_OAUTH_ACCESS_TOKEN="ya29.secret-token", STORAGE_EMULATOR_HOST="127.0.0.1:9023")
ours = engine("GET", "gs://bkt/dir/a+b.tar", None, None, env)
check(ours["url"] == "http://127.0.0.1:9023/bkt/dir/a%2Bb.tar", "gs:// URL through STORAGE_EMULATOR_HOST: " + ours["url"])
check(ours["headers"].get("authorization") == "Bearer ya29.secret-token", "gs:// bearer header")
check("ya29" not in ours["credentials"], "the token is not in the credential description")

check.done("sigv4")
