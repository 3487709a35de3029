"""shardflow cp against a real WebDAV nginx: uploads appear atomically under their name and are read
back; downloads land whole; failures name the URL, leave nothing half-written, and say what to do."""
import hashlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, nginx, run, run_with_pid  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-cp-")
root = os.path.join(tmp, "www")
os.makedirs(os.path.join(root, "ro"))
local = os.path.join(tmp, "model.ckpt")
data = os.urandom(3 * 1024 * 1024 + 17)
with open(local, "wb") as f:
    f.write(data)
DAV = """
    location /ckpt/ { dav_methods PUT DELETE MOVE; create_full_put_path on; client_max_body_size 0; }
"""


def sha(b):
    return hashlib.sha256(b).hexdigest()


with nginx(root, DAV) as base:
    url = f"{base}/ckpt/run1/model.ckpt"
    run(["cp", local, url])
    stored = os.path.join(root, "ckpt", "run1", "model.ckpt")
    check(sha(open(stored, "rb").read()) == sha(data), "the uploaded object has the file's bytes")
    check(sorted(os.listdir(os.path.dirname(stored))) == ["model.ckpt"], "no temporary object is left behind")
    back = os.path.join(tmp, "back.ckpt")
    run(["cp", url, back])
    check(sha(open(back, "rb").read()) == sha(data), "download returns the same bytes")
    check(sorted(os.listdir(tmp)) == sorted(["back.ckpt", "model.ckpt", "www"]), "no temporary file is left behind")
    # overwrite: the new version replaces the old one whole
    data2 = os.urandom(1000)
    with open(local, "wb") as f:
        f.write(data2)
    run(["cp", local, url])
    check(open(stored, "rb").read() == data2, "an upload replaces the object")
    # failures: a missing object, a location without WebDAV, a missing local file
    p = run(["cp", f"{base}/ckpt/none.ckpt", os.path.join(tmp, "none")], check=False)
    check(p.returncode == 1 and "404" in p.stderr and "none.ckpt" in p.stderr, f"404 named: {p.stderr}")
    check(not os.path.exists(os.path.join(tmp, "none")), "a failed download leaves no file")
    p = run(["cp", local, f"{base}/ro/model.ckpt"], check=False)
    check(p.returncode == 1 and "ro/model.ckpt" in p.stderr and ("WebDAV" in p.stderr or "405" in p.stderr),
          f"a server without WebDAV: {p.stderr}")
    p = run(["cp", os.path.join(tmp, "missing"), url], check=False)
    check(p.returncode == 1 and "missing" in p.stderr, f"missing local file: {p.stderr}")
    p = run(["cp", "s3://bucket/x", local], check=False)
    check(p.returncode == 1 and "s3://" in p.stderr, f"unsupported scheme: {p.stderr}")
p = run(["cp", local], check=False)
check(p.returncode == 2, "usage error")

# The partial file of a copy is created afresh at a name nobody can guess: a symlink another user
# planted at the names a process of cp's pid would use (PID and the formerly unseeded rand()'s
# 6b8b4567, and a range of counters) is neither followed (its target stays as it was) nor renamed
# onto DST (DST is a regular file with the copied bytes).
victim = os.path.join(tmp, "victim")
host = os.uname().nodename
with nginx(root, DAV) as base:
    run(["cp", local, f"{base}/ckpt/src.bin"])
    for what, src in (("download", f"{base}/ckpt/src.bin"), ("local copy", local)):
        dst = os.path.join(tmp, "shared", f"{what.replace(' ', '-')}.bin")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(victim, "wb") as f:
            f.write(b"precious")
        planted = []

        def plant(pid):
            for suffix in ["6b8b4567"] + [f"{i:08x}" for i in range(4)]:
                planted.append(f"{dst}.partial-{host}-{pid}-{suffix}")
                os.symlink(victim, planted[-1])

        p = run_with_pid(["cp", src, dst], plant)
        check(p.returncode == 0, f"{what} next to planted symlinks: {p.stderr}")
        check(open(victim, "rb").read() == b"precious", f"{what}: the planted symlink's target was overwritten")
        check(not os.path.islink(dst) and open(dst, "rb").read() == data2, f"{what}: DST is a regular file with the bytes")
        check(all(os.path.islink(n) for n in planted), f"{what}: the planted names were left alone")
        for n in planted:
            os.remove(n)
check.done("cp")

# The same from Python (the call a trainer uses for its checkpoints).
sys.path.insert(0, os.path.join(os.environ["SF_SOURCE_ROOT"], "python"))
if "SF_BUILD_ROOT" in os.environ:
    os.environ.setdefault("SHARDFLOW_LIB", os.path.join(os.environ["SF_BUILD_ROOT"], "libshardflow.so"))
shardflow = None
if os.environ.get("SF_SANITIZE", "none") == "none":  # a sanitizer build's library cannot load into python
    import shardflow
if shardflow is not None:
    with nginx(root, DAV) as base:
        shardflow.copy(local, f"{base}/ckpt/py.ckpt")
        check(open(os.path.join(root, "ckpt", "py.ckpt"), "rb").read() == data2, "shardflow.copy uploads")
        try:
            shardflow.copy(f"{base}/ckpt/absent", os.path.join(tmp, "x"))
            check(False, "a missing object raises")
        except shardflow.ShardflowError as e:
            check(e.code == "SF_ENOENT" and "absent" in str(e), f"ShardflowError names the URL: {e}")
    check.done("cp (python)")
