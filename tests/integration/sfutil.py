"""Helpers shared by the integration tests: the CLI, graph files, shards, nginx, .npy outputs."""
import contextlib
import io
import os
import signal
import socket
import subprocess
import tarfile
import tempfile
import time

import numpy as np

SHARDFLOW = os.environ.get("SHARDFLOW", "build/shardflow")


def run(args, check=True, timeout=300, **kw):
    """Runs the shardflow CLI; returns the CompletedProcess (text mode)."""
    p = subprocess.run([SHARDFLOW] + list(args), capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"shardflow {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def yaml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def write_graph(path, stages, groups=None, **settings):
    """stages: list of (type, {option: value}); groups: {name: {setting: value}} (processes, listen...);
    settings: seed, epochs, error_policy..."""
    lines = []
    if groups:
        lines.append("groups:")
        for name, opts in groups.items():
            lines.append(f"  {name}:")
            lines += [f"    {k}: {yaml_value(v)}" for k, v in opts.items()]
    lines += [f"{k}: {yaml_value(v)}" for k, v in settings.items()]
    lines.append("stages:")
    for stype, opts in stages:
        lines.append(f"  - type: {stype}")
        for k, v in opts.items():
            lines.append(f"    {k}: {yaml_value(v)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def group_graph(tmp, name, urls, group=None, shuffle_buffer=0, batch_size=16, size=16, padding=2, **settings):
    """The groups tests' graph: tar_split, decode and augment (random crop `size` with `padding`, flip, float32 CHW),
    an optional shuffle, batch and a device sink into tmp/name. With group (a dict of group options) decode and
    augment run in group `decoders`. settings: seed, epochs... Returns (graph path, npy dir)."""
    out = os.path.join(tmp, name)
    g = {"group": "decoders"} if group else {}
    stages = [
        ("shard_source", dict(urls=urls, shuffle=True)),
        ("tar_split", {}),
        ("decode", dict(**g)),
        ("augment", dict(crop="random", size=size, padding=padding, flip=0.5, layout="chw", dtype="float32", **g)),
    ] + ([("shuffle", dict(buffer_size=shuffle_buffer))] if shuffle_buffer else []) + [
        ("batch", dict(batch_size=batch_size, partial=True)),
        ("device_sink", dict(npy_dir=out)),
    ]
    path = write_graph(os.path.join(tmp, name + ".yaml"), stages, groups={"decoders": group} if group else None,
                       **settings)
    return path, out


def ppm_bytes(arr):
    h, w, c = arr.shape
    magic = b"P6" if c == 3 else b"P5"
    return magic + f"\n{w} {h}\n255\n".encode() + arr.astype(np.uint8).tobytes()


def write_shard(path, samples):
    """samples: list of (key, {field: bytes}) written in order with tarfile."""
    with tarfile.open(path, "w") as tf:
        for key, fields in samples:
            for name, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{name}")
                info.size = len(data)
                info.mtime = 0
                tf.addfile(info, io.BytesIO(data))
    return path


def make_dataset(root, shards, per_shard, size=8, seed=0):
    """Writes shards of random PPM images with cls labels; returns (url pattern, {key: (image, label)})."""
    rng = np.random.default_rng(seed)
    truth = {}
    for s in range(shards):
        samples = []
        for i in range(per_shard):
            key = f"{s * per_shard + i:07d}"
            img = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            label = int(rng.integers(0, 10))
            truth[key] = (img, label)
            samples.append((key, {"ppm": ppm_bytes(img), "cls": str(label).encode()}))
        write_shard(os.path.join(root, f"shard-{s:06d}.tar"), samples)
    return os.path.join(root, "shard-{%06d..%06d}.tar" % (0, shards - 1)), truth


def tar_keys(*paths):
    """Sample keys of the shards in order, by Python's tarfile (WebDataset's rule: up to the first dot)."""
    keys = []
    for path in paths:
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                k = m.name.split(".")[0]
                if not keys or keys[-1] != k:
                    keys.append(k)
    return keys


def tar_whole_samples(path):
    """A damaged shard as tarfile reads it: ([(key, [fields])] of the samples read whole, the key of
    the sample whose member the damage cuts, or None). Keys and fields split at the first dot."""
    done, half = [], None
    try:
        with tarfile.open(path) as tf:
            for m in tf:
                key, field = m.name.split(".", 1)
                try:
                    tf.extractfile(m).read()
                except tarfile.ReadError:  # "unexpected end of data": the cut is in this member
                    half = key
                    break
                if not done or done[-1][0] != key:
                    done.append((key, []))
                done[-1][1].append(field)
    except tarfile.ReadError:  # the first header is damaged: nothing to read
        pass
    if half is not None and done and done[-1][0] == half:
        done.pop()  # its first members were whole, but the sample was not
    return done, half


def batch_row(fields, i):
    """Sample i of a dumped batch's {field: array}: row i of a fixed field, values[offsets[i]:offsets[i+1]] of a
    ragged one (NAME plus NAME.offsets: batch's ragged option, and text fields by default)."""
    row = {}
    for f, a in fields.items():
        if f.endswith(".offsets") and f[:-len(".offsets")] in fields:
            continue
        off = fields.get(f + ".offsets")
        row[f] = a[off[i]:off[i + 1]] if off is not None else a[i]
    return row


def read_batches(npy_dir):
    """Reads the device sink's dumps: list of (epoch, batch, keys, {field: array}) in order."""
    out = {}
    if not os.path.isdir(npy_dir):  # the sink writes its directory with the first batch
        return []
    for name in sorted(os.listdir(npy_dir)):
        stem, ext = os.path.splitext(name)
        parts = stem.split("_", 2)
        e, b = int(parts[0][1:]), int(parts[1][1:])
        entry = out.setdefault((e, b), {"keys": None, "fields": {}})
        if ext == ".txt":
            with open(os.path.join(npy_dir, name)) as f:
                entry["keys"] = f.read().split()
        elif ext == ".npy":
            entry["fields"][parts[2]] = np.load(os.path.join(npy_dir, name))
    return [(e, b, v["keys"], v["fields"]) for (e, b), v in sorted(out.items())]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_server(args, port, name):
    """Runs a test server (tools/s3rver.sh run ..., tools/azurite.sh run ...) in its own session until it listens
    on 127.0.0.1:port; yields the process and stops its whole group at the end."""
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"{name} exited: " + server.stdout.read().decode())
                time.sleep(0.05)
        else:
            raise SystemExit(f"{name} did not start listening")
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)


def read_urls(tmp, urls, env, batch_size=20):
    """Runs the graph shard_source(urls, in order) -> tar_split -> decode -> batch -> device_sink; returns
    (the CompletedProcess, the keys in order, the cls labels) — keys and labels empty when it failed."""
    out = os.path.join(tmp, "read-urls-out")
    graph = write_graph(os.path.join(tmp, "read-urls.yaml"), [
        ("shard_source", dict(urls=f'"{urls}"', shuffle=False)),
        ("tar_split", {}),
        ("decode", {}),
        ("batch", dict(batch_size=batch_size)),
        ("device_sink", dict(npy_dir=out)),
    ], seed=1, epochs=1, error_policy="fail")
    p = run(["run", graph, "--quiet", "--no-summary"], env=env, check=False)
    if p.returncode != 0:
        return p, [], []
    batches = read_batches(out)
    return p, [k for _, _, ks, _ in batches for k in ks], [int(v) for _, _, _, f in batches for v in f["cls"]]


@contextlib.contextmanager
def nginx(root, locations="", tls=None):
    """Serves root over HTTP on a free loopback port (plus extra `location` blocks); yields the base URL.
    tls=(certificate file, key file) serves https instead (the base URL then starts with https://)."""
    run_dir = tempfile.mkdtemp(prefix="sf-nginx-")
    port = free_port()
    ssl = f" ssl; ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]}" if tls else ""
    user = "user root;" if os.geteuid() == 0 else ""
    conf = os.path.join(run_dir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""{user}
daemon off;
master_process off;
worker_processes 1;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {run_dir}/body;
  proxy_temp_path {run_dir}/proxy;
  fastcgi_temp_path {run_dir}/fastcgi;
  uwsgi_temp_path {run_dir}/uwsgi;
  scgi_temp_path {run_dir}/scgi;
  server {{ listen 127.0.0.1:{port}{ssl}; root {root}; {locations} }}
}}
""")
    proc = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", run_dir], stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("nginx did not start: " + proc.stderr.read().decode())
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


STAGE_TABLE_COLUMNS = ("node", "stage", "reps", "items", "mib", "busy", "wait", "errors", "skipped", "filtered")


def stage_table(stderr):
    """The head's end-of-run table of `shardflow run` (cli/run.c print_summary) as
    {node: {column: value}}, columns STAGE_TABLE_COLUMNS (numbers parsed); a mix's
    "  <- INPUT N" lines under its row become its "inputs" {INPUT: N}, a tuned option's
    "  OPTION VALUE (...)" lines its "tuned" {OPTION: VALUE}, and a stage's own counters'
    "     NAME N" lines its "counters" {NAME: N}."""
    rows, row, lines = {}, None, stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.split()[:2] == ["node", "stage"]), None)
    if start is None:
        return rows
    for line in lines[start + 1:]:
        if line.startswith("shardflow"):
            continue  # a log line of another process (a group's worker joining late) written between the rows
        parts = line.split()
        if len(parts) == 3 and parts[0] == "<-" and row is not None:
            row.setdefault("inputs", {})[parts[1]] = int(parts[2])
            continue
        if line.startswith("  ") and len(parts) >= 3 and parts[2].startswith("(") and row is not None:
            row.setdefault("tuned", {})[parts[0]] = int(parts[1])
            continue
        if len(parts) == 2 and parts[1].isdigit() and row is not None:  # a counter of the stage's own
            row.setdefault("counters", {})[parts[0]] = int(parts[1])
            continue
        if len(parts) != len(STAGE_TABLE_COLUMNS):
            break
        row = dict(zip(STAGE_TABLE_COLUMNS, parts))
        for k in ("reps", "items", "errors", "skipped", "filtered"):
            row[k] = int(row[k])
        for k in ("mib", "busy", "wait"):
            row[k] = float(row[k])
        rows[row["node"]] = row
    return rows


def run_with_pid(args, before, **kw):
    """Runs the shardflow CLI stopped at its start, calls before(pid) (e.g. to plant files at the names a
    process of that id would use), then lets it go on; returns the CompletedProcess (text mode)."""
    p = subprocess.Popen(["/bin/sh", "-c", 'kill -STOP $$; exec "$0" "$@"', SHARDFLOW] + list(args),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    _, status = os.waitpid(p.pid, os.WUNTRACED)  # the shell stopped itself; exec keeps its pid
    if not os.WIFSTOPPED(status):
        raise AssertionError(f"shardflow {' '.join(args)} did not stop at its start (status {status})")
    try:
        before(p.pid)
    finally:
        os.kill(p.pid, signal.SIGCONT)
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def wait_for(pred, timeout, what):
    """Polls pred every 50 ms; raises AssertionError naming what after timeout seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Checks:
    """Counts checks; a failing check raises at once with its message."""

    def __init__(self):
        self.n = 0

    def __call__(self, cond, msg):
        self.n += 1
        if not cond:
            raise AssertionError(msg)

    def done(self, name):
        print(f"{name}: {self.n} checks passed")
