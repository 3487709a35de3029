"""Shards over HTTP: a real nginx on loopback; listings equal the local files; 404, dead hosts, redirects, cut transfers.
A server that fails every shard the same way (refused, 401) stops a run at once with one message; one that serves
some shards keeps the per-shard error policy."""
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, free_port, make_dataset, nginx, read_batches, run, tar_keys, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-http-")
root = os.path.join(tmp, "www")
os.makedirs(root)


def write_shard(path, shard, n, size):
    with tarfile.open(path, "w") as tf:
        for k in range(n):
            for field, data in (("jpg", os.urandom(size + k)), ("cls", str(k % 10).encode())):
                info = tarfile.TarInfo(f"{shard}/{k:05d}.{field}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


for i in range(3):
    write_shard(os.path.join(root, f"shard-{i}.tar"), f"s{i}", 20, 3000)
# A shard of a few MB: many libcurl chunks, members spanning chunk boundaries.
write_shard(os.path.join(root, "big.tar"), "big", 40, 150_000)
subprocess.run(["gzip", "-k", os.path.join(root, "shard-0.tar")], check=True)


# Redirects and error statuses next to the shards.
LOCATIONS = f"""
    location = /moved.tar {{ return 302 /shard-1.tar; }}
    location = /to-file.tar {{ return 302 file://{root}/shard-1.tar; }}
    location = /forbidden.tar {{ return 403; }}
    location = /broken.tar {{ return 500; }}
"""


def ls(*urls, expect=0):
    t0 = time.monotonic()
    p = run(["ls", "--json"] + list(urls), check=False)
    check(p.returncode == expect, f"ls {urls}: exit {p.returncode}, expected {expect}\n{p.stderr}")
    return [json.loads(line) for line in p.stdout.splitlines()], p, time.monotonic() - t0


def without_url(samples):
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


class CutServer:
    """Answers one request with a Content-Length it does not keep: the transfer stops after `send` bytes."""

    def __init__(self, body, send):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.sock.settimeout(30)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, args=(body, send), daemon=True)
        self.thread.start()

    def serve(self, body, send):
        try:
            conn, _ = self.sock.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:send])
        except OSError:
            pass
        finally:
            self.sock.close()


with nginx(root, LOCATIONS) as base:
    # The same samples over HTTP as from the local files, in order, offsets included.
    local, _, _ = ls(os.path.join(root, "shard-{0..2}.tar"), os.path.join(root, "big.tar"))
    remote, p, _ = ls(base + "/shard-{0..2}.tar", base + "/big.tar")
    check(len(local) == 100, f"local listing has every sample ({len(local)})")
    check(without_url(remote) == without_url(local), "http listing equals the local listing")
    check([s["__url__"] for s in remote[:21]] == [base + "/shard-0.tar"] * 20 + [base + "/shard-1.tar"],
          "__url__ is the http URL of each shard")
    gz, _, _ = ls(base + "/shard-0.tar.gz")
    check(without_url(gz) == without_url(local[:20]), ".tar.gz over http")
    moved, _, _ = ls(base + "/moved.tar")
    check(without_url(moved) == without_url(local[20:40]), "an http redirect is followed")

    # Errors name the URL, the status and what to do; other shards are still listed.
    missing = base + "/missing.tar"
    got, p, _ = ls(missing, base + "/shard-2.tar", expect=1)
    check(missing in p.stderr and "404" in p.stderr, f"404 names the URL and the status: {p.stderr}")
    check(without_url(got) == without_url(local[40:60]), "the next shard is listed after a 404")
    _, p, _ = ls(base + "/forbidden.tar", expect=1)
    check("403" in p.stderr and "forbidden.tar" in p.stderr, f"403: {p.stderr}")
    _, p, _ = ls(base + "/broken.tar", expect=1)
    check("500" in p.stderr, f"500: {p.stderr}")
    _, p, _ = ls(base + "/to-file.tar", expect=1)
    check("to-file.tar" in p.stderr and ("http" in p.stderr or "protocol" in p.stderr.lower()),
          f"a redirect to file:// is refused: {p.stderr}")

# A server that is gone: refused at once, with a clear message.
_, p, took = ls("http://127.0.0.1:1/x.tar", expect=1)
check("http://127.0.0.1:1/x.tar" in p.stderr and ("connect" in p.stderr.lower() or "refused" in p.stderr.lower()),
      f"refused connection: {p.stderr}")
check(took < 5, f"a refused connection fails fast ({took:.1f}s)")

# nginx stopped: its port now refuses too.
_, p, took = ls(base + "/shard-0.tar", expect=1)
check(base in p.stderr and took < 5, f"a stopped server fails fast: {p.stderr}")

# A name that does not resolve. The lookup goes to a resolver on loopback only (a private
# mount namespace with its own resolv.conf), so no query leaves the machine.
if os.geteuid() == 0 and shutil.which("unshare"):
    resolv = os.path.join(tmp, "resolv.conf")
    with open(resolv, "w") as f:
        f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    url = "http://nonexistent.invalid/x.tar"
    t0 = time.monotonic()
    p = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', resolv,
                        os.environ["SHARDFLOW"], "ls", url], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    if "mount" in p.stderr and "shardflow ls" not in p.stderr:
        print("note: cannot make a mount namespace here; unresolvable-name check skipped")
    else:
        check(p.returncode == 1, f"unresolvable host: exit {p.returncode}\n{p.stderr}")
        check(url in p.stderr and "resolve" in p.stderr.lower(), f"unresolvable host message: {p.stderr}")
        check(took < 15, f"an unresolvable host fails within the connect timeout ({took:.1f}s)")
else:
    print("note: not root or no unshare; unresolvable-name check skipped")

# A transfer cut short mid-shard: the samples before the cut, then an error with the byte offset.
with open(os.path.join(root, "big.tar"), "rb") as f:
    body = f.read()
server = CutServer(body, 1_000_000)
url = f"http://127.0.0.1:{server.port}/big.tar"
got, p, _ = ls(url, expect=1)
server.thread.join(10)
with tarfile.open(os.path.join(root, "big.tar")) as tf:
    complete = {m.name.split(".")[0] for m in tf.getmembers() if m.offset_data + m.size <= 1_000_000}
check(0 < len(got) <= len(complete) and all(s["__key__"] in complete for s in got),
      f"only samples before the cut are listed ({len(got)})")
check(url in p.stderr and "@ byte" in p.stderr, f"a cut transfer names the URL and offset: {p.stderr}")


# A dead server fails the run at once (tar_split's dead_host_shards): one message naming host:port and the
# cause, not one record per shard after its retries. The run is stopped after LIMIT s if it goes on.
LIMIT = 20


def run_graph(name, urls, policy="skip", **tar_options):
    """Runs a graph over urls; returns (exit status or None when killed after LIMIT s, stderr, seconds, keys)."""
    out = os.path.join(tmp, name)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls="::".join(urls), shuffle=False)),
        ("tar_split", tar_options),
        ("batch", dict(batch_size=4, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=1, error_policy=policy)
    t0 = time.monotonic()
    proc = subprocess.Popen([os.environ["SHARDFLOW"], "run", graph, "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=LIMIT)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        rc = None
    took = time.monotonic() - t0
    keys = []
    if os.path.isdir(out):
        for f in sorted(os.listdir(out)):
            if f.endswith(".txt"):
                keys += open(os.path.join(out, f)).read().split()
    errors = [line for line in err.splitlines() if line.startswith("shardflow: error:")]
    print(f"{name}: exit {rc}, {took:.1f}s, {len(errors)} error line(s)")
    return rc, err, took, errors, keys


def check_dead(name, rc, err, took, errors, host, cause):
    check(rc is not None and rc != 0, f"{name}: the run fails (exit {rc}, {took:.1f}s)\n{err[-3000:]}")
    check(took < 10, f"{name}: within seconds ({took:.1f}s)")
    check(len(errors) == 1, f"{name}: exactly one error message, not one per shard ({len(errors)}):\n"
          + "\n".join(errors[:5]))
    check(host in errors[0] and cause in errors[0].lower(), f"{name}: the message names {host} and {cause}: {errors}")


# Nothing listens on the port: 50 shards, the default retries and the skip policy (the example graph's).
port = free_port()
urls = [f"http://127.0.0.1:{port}/shard-{i:03d}.tar" for i in range(50)]
rc, err, took, errors, _ = run_graph("refused", urls)
check_dead("refused", rc, err, took, errors, f"127.0.0.1:{port}", "refused")
check("tools/nginx.sh" in errors[0] or "server running" in errors[0], f"refused: says what to do: {errors[0]}")

# prefetch 0 (one download at a time): the first shards go through their retries, then the same message.
rc, err, took, errors, _ = run_graph("refused_prefetch0", urls, retries=1, prefetch=0)
check(rc not in (None, 0) and took < 10 and f"127.0.0.1:{port}" in errors[-1] and "refused" in errors[-1]
      and len(errors) <= 3, f"refused with prefetch 0: stops after 3 shards ({rc}, {took:.1f}s, {errors})")

# The rule turned off (dead_host_shards: 0): one record per shard, as before.
rc, err, took, errors, _ = run_graph("refused_off", urls[:10], retries=0, dead_host_shards=0)
check(rc == 1 and len(errors) >= 10, f"dead_host_shards 0: a record per shard ({rc}, {len(errors)})")


class Unauthorized(http.server.BaseHTTPRequestHandler):
    """401 to every request, as a server wanting credentials does."""

    def do_GET(self):
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="shards"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]
rc, err, took, errors, _ = run_graph("unauthorized", [f"http://127.0.0.1:{port}/shard-{i:03d}.tar" for i in range(50)])
check_dead("unauthorized", rc, err, took, errors, f"127.0.0.1:{port}", "401")
server.shutdown()

# A server that serves some shards and refuses (403) or lacks (404) others: today's per-shard records, and every
# sample of the good shards delivered. The first three shards fail before any succeeds.
with nginx(root, LOCATIONS) as base:
    mixed = [base + "/forbidden.tar", base + "/missing-1.tar", base + "/forbidden.tar", base + "/shard-0.tar",
             base + "/missing-2.tar", base + "/shard-1.tar", base + "/forbidden.tar", base + "/shard-2.tar"]
    rc, err, took, errors, keys = run_graph("mixed", mixed)
    expect = tar_keys(*(os.path.join(root, f"shard-{i}.tar") for i in range(3)))
    check(keys == expect, f"mixed: every sample of the good shards ({len(keys)} of {len(expect)})\n{err[-2000:]}")
    check(len(errors) == 5, f"mixed: one record per failed shard ({len(errors)}): {errors}")




def curl_loaded(name, urls):
    """Runs a graph over urls with the loader's log on (LD_DEBUG=libs); returns whether it initialised libcurl,
    and the keys read."""
    out = os.path.join(tmp, name)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls="::".join(urls), shuffle=False)), ("tar_split", {}),
        ("batch", dict(batch_size=4, partial=True)), ("device_sink", dict(npy_dir=out))], seed=1, epochs=1)
    p = subprocess.run([os.environ["SHARDFLOW"], "run", graph, "--quiet"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "LD_DEBUG": "libs"})
    check(p.returncode == 0, f"{name}: the run succeeds: {p.stderr[-500:]}")
    inits = [line for line in p.stderr.splitlines() if "calling init:" in line]
    check(any("libc.so" in line for line in inits), f"{name}: the loader's log is there ({len(inits)} inits)")
    keys = []
    for f in sorted(os.listdir(out)):
        if f.endswith(".txt"):
            keys += open(os.path.join(out, f)).read().split()
    return any("libcurl" in line for line in inits), keys


# libcurl is opened when the first remote shard comes, not at start-up: a run over local files never loads it
# (with it, 33 libraries here), one over http does, and both read the same samples.
local = [os.path.join(root, f"shard-{i}.tar") for i in range(3)]
loaded, keys_local = curl_loaded("curl-local", local)
check(not loaded and keys_local == tar_keys(*local), f"local shards: libcurl not loaded ({loaded}), every sample")
with nginx(root, LOCATIONS) as base:
    loaded, keys_http = curl_loaded("curl-http", [base + f"/shard-{i}.tar" for i in range(3)])
check(loaded and keys_http == keys_local, f"http shards: libcurl loaded ({loaded}), the same samples")

# https: a CA and a certificate for 127.0.0.1 made with openssl; nginx serves shards with it. The samples read
# over https (the CA given as tar_split's ca_file, or SSL_CERT_FILE) equal the local files' (Python tarfile).
pki = os.path.join(tmp, "pki")
os.makedirs(pki)


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(name):
    key, crt = os.path.join(pki, name + ".key"), os.path.join(pki, name + ".crt")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
            "-out", crt, "-days", "2", "-subj", f"/CN=shardflow test {name}")
    return key, crt


ca_key, ca_crt = make_ca("ca")
_, other_crt = make_ca("other-ca")
server_key, server_csr, server_crt = (os.path.join(pki, "server." + e) for e in ("key", "csr", "crt"))
openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", server_key,
        "-out", server_csr, "-subj", "/CN=127.0.0.1")
with open(os.path.join(pki, "ext.cnf"), "w") as f:
    f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
openssl("x509", "-req", "-in", server_csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-out", server_crt,
        "-days", "2", "-extfile", os.path.join(pki, "ext.cnf"))

tls_root = os.path.join(tmp, "tls")
os.makedirs(tls_root)
make_dataset(tls_root, shards=3, per_shard=30, size=8)
tls_local = [os.path.join(tls_root, f"shard-{i:06d}.tar") for i in range(3)]


def tar_reference(paths):
    """{key: (image, label)} from the shards by Python tarfile (PPM P6 pixels after its 3-line header)."""
    out = {}
    for path in paths:
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                key, field = m.name.split(".", 1)
                data = tf.extractfile(m).read()
                image, label = out.get(key, (None, None))
                if field == "ppm":
                    magic, dims, maxval, pixels = data.split(b"\n", 3)
                    w, h = map(int, dims.split())
                    image = np.frombuffer(pixels, np.uint8).reshape(h, w, 3)
                else:
                    label = int(data)
                out[key] = (image, label)
    return out


def tls_run(name, urls, expect_rc=0, env=None, **tar_options):
    out = os.path.join(tmp, name)
    graph = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls="::".join(urls), shuffle=False)),
        ("tar_split", tar_options),
        ("decode", {}),
        ("batch", dict(batch_size=10, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=1, error_policy="skip")
    p = run(["run", graph, "--quiet"], check=False, env=dict(os.environ, **(env or {})))
    check(p.returncode == expect_rc, f"{name}: exit {p.returncode}, expected {expect_rc}\n{p.stderr[-3000:]}")
    got = {}
    for _, _, keys, fields in read_batches(out):
        for j, k in enumerate(keys):
            got[k] = (fields["ppm"][j], int(fields["cls"][j]))
    return got, p.stderr


reference = tar_reference(tls_local)
with nginx(tls_root, tls=(server_crt, server_key)) as tls_base:
    urls = [f"{tls_base}/shard-{i:06d}.tar" for i in range(3)]
    check(tls_base.startswith("https://"), tls_base)
    got, _ = tls_run("https_ca_file", urls, ca_file=ca_crt)
    check(sorted(got) == sorted(reference) and all(np.array_equal(got[k][0], reference[k][0])
                                                   and got[k][1] == reference[k][1] for k in reference),
          f"https with ca_file: every sample equals the local shard's ({len(got)} of {len(reference)})")
    # SSL_CERT_FILE, as OpenSSL's tools read it: also for shardflow ls, which has no tar_split options.
    got, _ = tls_run("https_env", urls, env={"SSL_CERT_FILE": ca_crt})
    check(sorted(got) == sorted(reference), f"https with SSL_CERT_FILE: every sample ({len(got)})")
    p = run(["ls", "--json"] + urls, env=dict(os.environ, SSL_CERT_FILE=ca_crt))
    listed = [json.loads(line) for line in p.stdout.splitlines()]
    local_list = [json.loads(line) for line in run(["ls", "--json"] + tls_local).stdout.splitlines()]
    check(without_url(listed) == without_url(local_list), "ls over https with SSL_CERT_FILE equals ls of the files")
    # A certificate the trusted CAs did not sign: refused, each message saying why and what to set, the last
    # one stopping the run (the server's third failure alike makes it dead, whatever error_policy says). The
    # three shards download at once (prefetch): where tar_split takes a shard's failure before the third one
    # came in, that shard is skipped with its own message first (error_policy skip), so one to three lines.
    for name, opts, env in (("https_wrong_ca", dict(ca_file=other_crt), {}),
                            ("https_system_ca", {}, {"SSL_CERT_FILE": ""})):
        got, err = tls_run(name, urls, expect_rc=1, env=env, **opts)
        errors = [line for line in err.splitlines() if line.startswith("shardflow: error:")]
        check(not got and 1 <= len(errors) <= 3, f"{name}: no sample, one to three error messages ({errors})")
        for line in errors:
            check("could not be verified" in line and "ca_file" in line and "SSL_CERT_FILE" in line
                  and tls_base.split("//")[1] in line, f"{name}: says the certificate could not be verified and "
                  f"names ca_file and SSL_CERT_FILE: {line}")
        check("failed alike" in errors[-1], f"{name}: the last message stops the run: {errors[-1]}")
    p = run(["ls"] + urls[:1], check=False, env=dict(os.environ, SSL_CERT_FILE=other_crt))
    check(p.returncode == 1 and "could not be verified" in p.stderr, f"ls with the wrong CA: {p.stderr}")
    # A ca_file that cannot be read is an option error at start, not a TLS failure per shard.
    _, err = tls_run("https_missing_ca", urls, expect_rc=1, ca_file=os.path.join(pki, "missing.crt"))
    check("ca_file" in err and "missing.crt" in err, f"an unreadable ca_file names the option: {err}")

check.done("test_http")
