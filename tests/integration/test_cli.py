"""The shardflow command's own promises (issue 17): keygen and cp make the directories they write to,
resume positions outside the run are refused, nothing a dead process left (partial downloads, ipc
sockets) stays for ever, preview_png does not invent directories, `help COMMAND` shows its usage; `ls` escapes
control characters in keys and field names."""
import ctypes
import filecmp
import glob
import io
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, make_dataset, nginx, run, tar_keys, wait_for, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-cli-")
urls, truth = make_dataset(tmp, shards=1, per_shard=10)


def graph(name, epochs=1, sink=None, group=None, source=None):
    """10 samples in batches of 4 (the last one short): 3 batches an epoch."""
    path = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, **(source or {}))),
        ("tar_split", {}),
        ("decode", dict(group="decoders") if group else {}),
        ("batch", dict(batch_size=4)),
        ("device_sink", sink or {}),
    ], seed=1, epochs=epochs)
    if group:
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(f"groups:\n  decoders: {group}\n" + text)
    return path


def dead_pid():
    """A process id that was alive a moment ago and is gone now."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# keygen --dir makes the directory (docs/groups.md's recipe: `shardflow keygen cpu7 --dir keys`).
keys = os.path.join(tmp, "keys", "workers")
p = run(["keygen", "w1", "--dir", keys], check=False)
check(p.returncode == 0, f"keygen into a missing directory: {p.returncode} {p.stderr}")
check(p.returncode == 0 and os.stat(os.path.join(keys, "w1.key")).st_mode & 0o777 == 0o600
      and os.path.exists(os.path.join(keys, "w1.pub")),
      "keygen wrote w1.key (0600) and w1.pub")
# ...private whatever the umask: a key directory others can write lets them swap the keys in it.
loose = os.path.join(tmp, "umask0", "keys")
p = subprocess.run([SHARDFLOW, "keygen", "w1", "--dir", loose], capture_output=True, text=True,
                   preexec_fn=lambda: os.umask(0))
modes = ({n: os.stat(os.path.join(loose, n)).st_mode & 0o777 for n in (".", "..", "w1.key", "w1.pub")}
         if p.returncode == 0 else p.stderr)
check(modes == {".": 0o700, "..": 0o700, "w1.key": 0o600, "w1.pub": 0o644},
      f"under umask 000 keygen makes its directories 0700, the secret key 0600, the public key 0644: {modes}")

# Resume positions: an epoch the run never reaches, a step past the end of its epoch.
g = graph("two-epochs", epochs=2)
batches = -(-len(tar_keys(urls.replace("{000000..000000}", "000000"))) // 4)  # tarfile: 10 samples, 4 a batch
p = run(["run", g, "--start-epoch", "2"], check=False)
check(p.returncode == 2 and "--start-epoch 2" in p.stderr and "2 epochs" in p.stderr,
      f"--start-epoch at the run's end is refused: {p.returncode} {p.stdout} {p.stderr}")
p = run(["run", g, "--start-epoch", "2", "--epochs", "3", "--quiet", "--no-summary"], check=False)
check(p.returncode == 0 and "Epoch=3 " in p.stdout and "Epoch=2 " not in p.stdout, f"--epochs 3: {p.stdout}")
p = run(["run", g, "--start-step", str(batches + 1)], check=False)
check(p.returncode == 1 and f"--start-step {batches + 1}" in p.stderr and f"has {batches} batches" in p.stderr,
      f"--start-step past the epoch's end is refused: {p.returncode} {p.stdout} {p.stderr}")
p = run(["run", g, "--start-epoch", "1", "--start-step", str(batches), "--quiet", "--no-summary"], check=False)
check(p.returncode == 0 and "Epoch=2 Rank=0 Replica Train Samples=0" in p.stdout,
      f"--start-step at the epoch's end resumes an epoch with nothing left: {p.stdout} {p.stderr}")
p = run(["run", g, "--start-step", str(batches - 1), "--quiet", "--no-summary"], check=False)
check(p.returncode == 0 and "Epoch=1 Rank=0 Replica Train Samples=2" in p.stdout and "Epoch=2 " in p.stdout,
      f"--start-step inside the epoch: its last batch, then the next epoch: {p.stdout} {p.stderr}")

# A typed option's bad value is refused, naming the option and the value (`--log-steps abc` was read by
# atol as 0, which silently turned the rate lines off); the shared parsers take units (30s, 10k).
for args, option, value in ((["run", g, "--log-steps", "abc"], "--log-steps", "abc"),
                            (["run", g, "--log-steps=-3"], "--log-steps", "-3"),
                            (["run", g, "--step-time", "fast"], "--step-time", "fast"),
                            (["run", g, "--world-size", "0"], "--world-size", "0"),
                            (["worker", "--connect", "ipc:///nonexistent", "--credits", "lots"], "--credits", "lots"),
                            (["worker", "--connect", "ipc:///nonexistent", "--connect-timeout", "soon"],
                             "--connect-timeout", "soon"),
                            (["write", "--maxsize", "12parsecs", tmp, tmp + "/x-%d.tar"], "--maxsize", "12parsecs"),
                            (["write", "--format", "gif", tmp, tmp + "/x-%d.tar"], "--format", "gif")):
    p = run(args, check=False)
    check(p.returncode == 2 and option in p.stderr and value in p.stderr and "usage: shardflow " + args[0] in p.stderr,
          f"{' '.join(args[:1] + args[2:] if args[0] == 'run' else args)}: refused naming {option}: "
          f"{p.returncode} {p.stderr!r}")
p = run(["run", g, "--log-steps", "1k", "--step-time", "1ms", "--quiet", "--no-summary"], check=False)
check(p.returncode == 0 and "Epoch=2 " in p.stdout, f"--log-steps 1k --step-time 1ms: {p.returncode} {p.stderr}")

# cp makes the target's directories, and removes the partial downloads of processes that are gone.
www = os.path.join(tmp, "www")
os.makedirs(www)
with open(os.path.join(www, "model.ckpt"), "wb") as f:
    f.write(os.urandom(100000))
with nginx(www) as base:
    dst = os.path.join(tmp, "ckpt", "run1", "model.ckpt")
    p = run(["cp", f"{base}/model.ckpt", dst], check=False)
    check(p.returncode == 0 and filecmp.cmp(dst, os.path.join(www, "model.ckpt"), shallow=False),
          f"a download into a missing directory: {p.returncode} {p.stderr}")
    host = os.uname().nodename
    stale = [f"{dst}.partial-{host}-{dead_pid()}-0badf00d", os.path.join(tmp, "ckpt", "run1",
                                                                          f"other.bin.partial-{host}-{dead_pid()}-1")]
    alive = [f"{dst}.partial-{host}-{os.getpid()}-12345678", f"{dst}.partial-otherhost-{dead_pid()}-12345678"]
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    for name in stale + alive:
        open(name, "w").close()
    run(["cp", f"{base}/model.ckpt", dst])
    check(not any(os.path.exists(n) for n in stale), f"dead processes' partials are gone: {os.listdir(os.path.dirname(dst))}")
    check(all(os.path.exists(n) for n in alive), "a live process's partial, and another host's, stay")
local_dst = os.path.join(tmp, "copies", "a", "b.ckpt")
p = run(["cp", dst, local_dst], check=False)
check(p.returncode == 0 and filecmp.cmp(dst, local_dst, shallow=False), f"a local copy into a missing directory: {p.stderr}")

# preview_png names a file in a directory that exists: a typo is an error naming the path, not a new tree.
preview = os.path.join(tmp, "no-such-dir", "grid.png")
p = run(["run", graph("preview", sink=dict(preview_png=preview)), "--quiet", "--no-summary"], check=False)
check(p.returncode == 1 and os.path.dirname(preview) in p.stderr and "preview_png" in p.stderr,
      f"preview_png in a missing directory is refused: {p.returncode} {p.stderr}")
check(not os.path.exists(os.path.dirname(preview)), "and the directory was not created")
p = run(["run", graph("preview-ok", sink=dict(preview_png=os.path.join(tmp, "grid.png"))), "--quiet"], check=False)
check(p.returncode == 0 and os.path.getsize(os.path.join(tmp, "grid.png")) > 0, f"preview_png: {p.stderr}")

# device_sink's device: cuda:N needs the NVIDIA driver, loaded at run time (issue 29): without it the run is
# refused before any data is read, naming the option and what dlopen said. SF_CUDA_LIBRARY points the loader at a
# file that is not there, so this holds on a machine with a GPU too.
gpu_graph = graph("gpu", sink=dict(device="cuda:0"))
p = run(["run", gpu_graph, "--quiet", "--no-summary"], check=False,
        env=dict(os.environ, SF_CUDA_LIBRARY="/nonexistent/libcuda.so.1"))
check(p.returncode == 1 and "option device: no CUDA driver on this machine: cannot load /nonexistent/libcuda.so.1"
      in p.stderr and "(/nonexistent/libcuda.so.1: cannot open shared object file" in p.stderr
      and "use device: cpu" in p.stderr, f"device: cuda:0 without a driver: {p.stderr}")
try:
    ctypes.CDLL("libcuda.so.1")
except OSError:  # this machine has no driver: the plain run says so too
    p = run(["run", gpu_graph, "--quiet", "--no-summary"], check=False)
    check(p.returncode == 1 and "no CUDA driver on this machine: cannot load libcuda.so.1" in p.stderr
          and "(libcuda.so.1: cannot open shared object file" in p.stderr,
          f"device: cuda:0 here, without SF_CUDA_LIBRARY: {p.stderr}")
# The toolkit's stub driver (where the CUDA toolkit is installed) has every function: all of them resolve, and
# cuInit's refusal is what is reported.
stub = "/usr/local/cuda/lib64/stubs/libcuda.so"
if os.path.exists(stub):
    p = run(["run", gpu_graph, "--quiet", "--no-summary"], check=False, env=dict(os.environ, SF_CUDA_LIBRARY=stub))
    check(p.returncode == 1 and f"the CUDA driver ({stub}) does not start: cuInit:" in p.stderr,
          f"the stub driver: every symbol found, cuInit refuses: {p.stderr}")
# Through the fake driver (tests/plugins/fake_cuda.c): the whole run on the "GPU", uint8 images normalised there,
# its buffers counted in the stage table (test_device_sink.py checks the values).
sink = dict(device="cuda:0", normalize="float32", mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
p = run(["run", graph("gpu-fake", epochs=3, sink=sink)], check=False,
        env=dict(os.environ, SF_CUDA_LIBRARY=os.environ["SF_FAKE_CUDA"]))
check(p.returncode == 0 and "gpu_buffers_allocated" in p.stderr, f"device cuda:0 on the fake driver: {p.stderr}")
# A GPU the machine does not have: refused against the option, with how many there are (the fake driver shows one).
p = run(["run", graph("gpu-fake-3", sink=dict(device="cuda:3")), "--quiet", "--no-summary"], check=False,
        env=dict(os.environ, SF_CUDA_LIBRARY=os.environ["SF_FAKE_CUDA"]))
check(p.returncode == 1 and "option device: cuda:3: there is no such GPU: this machine shows 1 (cuda:0 to cuda:0"
      in p.stderr and "use device: cpu" in p.stderr, f"device: cuda:3 on a one-GPU driver: {p.stderr}")
for sink, words in ((dict(device="tpu"), "option device: 'tpu' is not a device: write cpu, cuda or cuda:N"),
                    (dict(device="cuda:x"), "'cuda:x' is not a device"),
                    (dict(normalize="float32"), "option normalize: normalize runs on the GPU: set device: cuda"),
                    (dict(normalize="float32", mean=[0.5, 0.5, 0.5]), "normalize needs mean and std with one value "
                     "per channel each, or neither (x/255 only); mean has 3 values, std 0"),
                    (dict(normalize="bfloat16", mean=[0.5], std=[0]), "option std: value 0 is 0; a standard deviation "
                     "must be above 0")):
    p = run(["run", graph("gpu-bad", sink=sink), "--quiet", "--no-summary"], check=False)
    check(p.returncode == 1 and words in p.stderr, f"device_sink {sink}: {p.stderr}")
# device: cpu (the default, written) runs as without it
p = run(["run", graph("gpu-cpu", sink=dict(device="cpu", npy_dir=os.path.join(tmp, "cpu-npy"))), "--quiet"], check=False)
check(p.returncode == 0 and len(glob.glob(os.path.join(tmp, "cpu-npy", "*_keys.txt"))) == 3, f"device: cpu: {p.stderr}")

# An npy_dir that cannot be made (a file stands where a directory should): an error naming the directory and why
# (the run goes on or stops as the graph's error policy says).
blocker = os.path.join(tmp, "not-a-dir")
open(blocker, "w").close()
bad_npy = os.path.join(blocker, "npy")
p = run(["run", graph("npy-bad", sink=dict(npy_dir=bad_npy)), "--quiet", "--no-summary"], check=False)
check(f"npy_dir: cannot create directory {bad_npy}: {os.strerror(20)}" in p.stderr,
      f"npy_dir under a file: {p.stderr}")

# A head killed with SIGKILL leaves its ipc socket in a private directory (0700, one per pipeline); the next head
# removes it, and a socket older versions left in $TMPDIR itself, and keeps a live process's.
ipc_tmp = tempfile.mkdtemp(prefix="sf-ipc-")
env = dict(os.environ, TMPDIR=ipc_tmp)
head = subprocess.Popen([SHARDFLOW, "run", graph("forever", epochs=0, group="{processes: 1}"), "--quiet"],
                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wait_for(lambda: glob.glob(os.path.join(ipc_tmp, f"shardflow-{head.pid}-*", "*.ipc")), 60, "the head's ipc socket")
head.send_signal(signal.SIGKILL)
head.wait()
left = glob.glob(os.path.join(ipc_tmp, "shardflow-*"))
check(len(left) == 1 and os.stat(left[0]).st_mode & 0o777 == 0o700, f"the killed head left its socket: {left}")
live = os.path.join(ipc_tmp, f"shardflow-{os.getpid()}-decoders.ipc")
old = os.path.join(ipc_tmp, f"shardflow-{dead_pid()}-decoders.ipc")
for sock in (live, old):
    subprocess.run([sys.executable, "-c", f"import socket; socket.socket(socket.AF_UNIX).bind({sock!r})"], check=True)
time.sleep(0.5)  # the killed head's worker notices its parent is gone
p = subprocess.run([SHARDFLOW, "run", graph("once", group="{processes: 1}"), "--quiet", "--no-summary"], env=env,
                   capture_output=True, text=True, timeout=120)
check(p.returncode == 0 and "Replica Train Samples=10" in p.stdout, f"the next head runs: {p.stdout} {p.stderr}")
check(sorted(os.listdir(ipc_tmp)) == [os.path.basename(live)],
      f"the dead head's socket is gone, the live one stays: {os.listdir(ipc_tmp)}")

# `shardflow ls` prints keys and field names with control characters (a terminal's escape sequences, a TAB or
# newline that would forge columns or lines), bidirectional overrides and bytes that are not UTF-8 escaped.
BIDI = "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def ls_escaped(raw):
    out = ""
    for ch in raw.decode("utf-8", "surrogateescape"):
        o = ord(ch)
        if 0xdc80 <= o <= 0xdcff:
            out += "\\x%02x" % (o - 0xdc00)  # a byte that is not UTF-8
        elif ch in "\\\t\n\r":
            out += {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}[ch]
        elif o < 0x20 or o == 0x7f:
            out += "\\x%02x" % o
        elif 0x80 <= o <= 0x9f or ch in BIDI:
            out += "\\u%04x" % o
        else:
            out += ch
    return out


odd = [b"a\x1b[31mred", b"tab\tkey", b"nl\nkey", b"cr\rkey", b"back\\slash", "caf\u00e9".encode(),
       "csi\u009b2J".encode(), "rtl\u202eevil".encode(), b"bad\xffbyte", b"del\x7f"]
shard = os.path.join(tmp, "odd.tar")
with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="surrogateescape") as tf:
    for key in odd:
        for field in (b"txt", b"j\x1bs"):
            info = tarfile.TarInfo((key + b"." + field).decode("utf-8", "surrogateescape"))
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
p = subprocess.run([SHARDFLOW, "ls", shard], capture_output=True, timeout=60)
want = "".join(f"{ls_escaped(k)}\t{ls_escaped(b'txt')},{ls_escaped(b'j' + bytes([27]) + b's')}\n" for k in odd)
check(p.returncode == 0 and p.stdout == want.encode(), f"ls escapes keys and fields: {p.stdout!r}, want {want.encode()!r}")

# `shardflow help COMMAND` is COMMAND's usage.
for command in ("run", "ls", "write", "cp", "worker", "keygen", "config"):
    p = run(["help", command], check=False)
    own = run([command, "--help"], check=False)
    check(p.returncode == 0 and own.returncode == 0 and p.stdout == own.stdout and "usage: shardflow " + command in p.stdout,
          f"help {command}: {p.returncode} {p.stdout[:200]!r} {p.stderr!r}")
p = run(["help", "nosuch"], check=False)
check(p.returncode == 2 and "shard_source" in p.stderr and "keygen" in p.stderr,
      f"help of an unknown name lists stages and commands: {p.stderr}")

# Every row of every command's options table (read from cli/*.c) is in its --help and known to its parser;
# a typed row refuses a bad value naming the option.
import re  # noqa: E402
rows = {}
for name in sorted(os.listdir(os.path.join(os.environ["SF_SOURCE_ROOT"], "cli"))):
    text = open(os.path.join(os.environ["SF_SOURCE_ROOT"], "cli", name)).read()
    command = re.search(r'const sf_cli_command sf_cli_\w+ = \{\s*\.name = "([a-z]+)"', text)
    if command:
        rows[command.group(1)] = re.findall(r'\.row = \{"([a-z-]+)", (SF_OPT_[A-Z]+)[^}]*\}(?:,\s*\.value = "([^"]+)")?',
                                            text)
check(set(rows) == {"run", "ls", "index", "write", "cp", "worker", "keygen", "dot", "help", "config"} and sum(map(len, rows.values())) >= 30,
      f"the tables were found: {rows}")
typed = {"SF_OPT_COUNT", "SF_OPT_INT", "SF_OPT_SIZE", "SF_OPT_DURATION", "SF_OPT_ENUM", "SF_OPT_SEED", "SF_OPT_FLOAT"}
for command, table in rows.items():
    text = run([command, "--help"]).stdout
    for option, kind, value in table:
        line = next((l for l in text.splitlines() if l.split()[:1] == [f"--{option}"] or f", --{option}" in l), "")
        check(line and (not value or value in line), f"{command} --help shows --{option} {value}: {text}")
        if value and kind in typed:
            p = run([command, f"--{option}", "bogus"], check=False)
            check(p.returncode == 2 and f"--{option}" in p.stderr and "'bogus'" in p.stderr,
                  f"{command} --{option} bogus is refused naming the option: {p.returncode} {p.stderr}")
        elif value:
            p = run([command, f"--{option}"], check=False)
            check(p.returncode == 2 and f"--{option} needs a value" in p.stderr, f"{command} --{option}: {p.stderr}")
        else:
            p = run([command, f"--{option}=1"], check=False)
            check(p.returncode == 2 and f"--{option} takes no value" in p.stderr, f"{command} --{option}=1: {p.stderr}")

# `config` run from a build tree (not installed: no headers above it in an install layout) answers with where
# `meson install` puts things, from meson's own record of the prefix and libdir; the labelled form has them all.
import json  # noqa: E402
opts = {o["name"]: o["value"] for o in json.load(open(os.path.join(os.environ["SF_BUILD_ROOT"], "meson-info",
                                                                 "intro-buildoptions.json")))}
libdir = os.path.join(opts["prefix"], opts["libdir"])
want = {"cflags": f"-I{os.path.join(opts['prefix'], opts['includedir'])}", "libs": f"-L{libdir} -lshardflow",
        "plugin-dir": os.path.join(libdir, "shardflow", "plugins"), "pkgconfigdir": os.path.join(libdir, "pkgconfig")}
p = run(["config"])
check(dict(line.split(": ", 1) for line in p.stdout.splitlines()) == want, f"config from the build tree: {p.stdout}")
p = run(["config", "--plugin-dir", "--cflags"])
check(p.stdout.splitlines() == [want["cflags"], want["plugin-dir"]], f"config --plugin-dir --cflags: {p.stdout}")
p = run(["config", "extra"], check=False)
check(p.returncode == 2 and "takes no operands" in p.stderr, f"config refuses an operand: {p.stderr}")
check.done("cli")
