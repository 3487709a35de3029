"""A group spread over three "hosts": network namespaces joined by veth pairs to a bridge, with CURVE.

Topology (namespace names carry this process's pid, so parallel runs do not collide; the
addresses live inside the namespaces, so they do not either):

    sf<pid>-head   br0 10.77.0.1/24   `shardflow run` of the graph, decoders listen on tcp://10.77.0.1:5555
    sf<pid>-w1     veth 10.77.0.2/24  `shardflow worker` with key w1 (on the allow-list)
    sf<pid>-w2     veth 10.77.0.3/24  `shardflow worker` with key w2 (on the allow-list)
    sf<pid>-rogue  veth 10.77.0.4/24  `shardflow worker` with key rogue (NOT on the allow-list)

Checks:
- the rogue worker, started first while the head waits for workers, is refused: the head logs a
  refusal naming the rogue's address and public key, and the rogue exits non-zero after its
  --connect-timeout with a message that names the endpoint;
- then w1 and w2 join; both epochs complete with every sample, both workers ran units, and the
  batches (device_sink's .npy dumps: keys and arrays) are identical to a single-process run of
  the same graph without groups;
- the head's summary counts the refused connections and no duplicate or malformed results.
Needs root and `ip netns` (exits 77 otherwise).  Namespaces and processes are removed in finally
blocks, on failure too.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import sfutil
from sfutil import wait_for

PID = os.getpid()
PREFIX = f"sf{PID}"
HOSTS = {"head": "10.77.0.1", "w1": "10.77.0.2", "w2": "10.77.0.3", "rogue": "10.77.0.4"}
PORT = 5555
SHARDS, PER_SHARD = 6, 200
EPOCHS, BATCH = 2, 50


def ns(host):
    return f"{PREFIX}-{host}"


def ip(*args):
    p = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {p.stderr.strip()}")


def can_netns():
    if os.geteuid() != 0:
        print("skip: network namespaces need root")
        return False
    if not shutil.which("ip"):
        print("skip: no ip command (iproute2)")
        return False
    probe = f"{PREFIX}-probe"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"skip: ip netns add failed: {p.stderr.strip()}")
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True


def make_network(made):
    """The head's namespace holds the bridge; each other host is a veth pair's end in its own namespace."""
    for host in HOSTS:
        ip("netns", "add", ns(host))
        made.append(ns(host))
        ip("-n", ns(host), "link", "set", "lo", "up")
    ip("-n", ns("head"), "link", "add", "br0", "type", "bridge")
    ip("-n", ns("head"), "addr", "add", f"{HOSTS['head']}/24", "dev", "br0")
    ip("-n", ns("head"), "link", "set", "br0", "up")
    for host, addr in HOSTS.items():
        if host == "head":
            continue
        # Created straight inside the namespaces: no name in the root namespace to collide on.
        ip("link", "add", "name", "eth0", "netns", ns(host), "type", "veth", "peer", "name", f"p-{host}",
           "netns", ns("head"))
        ip("-n", ns("head"), "link", "set", f"p-{host}", "master", "br0")
        ip("-n", ns("head"), "link", "set", f"p-{host}", "up")
        ip("-n", ns(host), "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("-n", ns(host), "link", "set", "eth0", "up")


def write_group_graph(path, url, npy_dir, groups):
    """The graph under test; groups is the `groups:` YAML block or '' (then no stage has a group)."""
    group = "    group: decoders\n" if groups else ""
    with open(path, "w") as f:
        f.write(f"""seed: 11
epochs: {EPOCHS}
{groups}stages:
  - type: shard_source
    urls: {url}
  - type: tar_split
  - type: decode
{group}  - type: augment
{group}    crop: random
    size: 32
    padding: 4
    flip: 0.5
    mean: [0.4914, 0.4822, 0.4465]
    std: [0.2023, 0.1994, 0.2010]
  - type: shuffle
    buffer_size: 300
  - type: batch
    batch_size: {BATCH}
  - type: device_sink
    npy_dir: {npy_dir}
""")
    return path


def popen_in(host, args, log):
    return subprocess.Popen(["ip", "netns", "exec", ns(host), sfutil.SHARDFLOW] + args,
                            stdout=log, stderr=subprocess.STDOUT, text=True)


def read(path):
    with open(path) as f:
        return f.read()


def remove_stale_namespaces():
    """Namespaces this test left behind when its process was killed (its pid no longer runs)."""
    p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in p.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(r"sf(\d+)-(head|w1|w2|rogue|probe)", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def main():
    if not can_netns():
        return 77
    remove_stale_namespaces()
    check = sfutil.Checks()
    tmp = tempfile.mkdtemp(prefix="sf-netns-")
    os.chmod(tmp, 0o755)  # namespaces share the filesystem; any user may read the shards
    made, procs = [], []
    try:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        url, truth = sfutil.make_dataset(data, SHARDS, PER_SHARD, size=32, seed=5)
        keys = os.path.join(tmp, "keys")
        os.makedirs(keys)
        for name in ["head", "w1", "w2", "rogue"]:
            sfutil.run(["keygen", name, "--dir", keys])
        allowed = os.path.join(tmp, "allowed")
        os.makedirs(allowed)
        for name in ["w1", "w2"]:
            shutil.copy(os.path.join(keys, f"{name}.pub"), allowed)
        rogue_pub = read(os.path.join(keys, "rogue.pub")).split('public-key = "')[1].split('"')[0]

        # The reference: one process, no groups.
        ref_dir = os.path.join(tmp, "ref")
        sfutil.run(["run", write_group_graph(os.path.join(tmp, "ref.yaml"), url, ref_dir, ""), "--quiet"])
        ref = sfutil.read_batches(ref_dir)
        n = SHARDS * PER_SHARD
        check(len(ref) == EPOCHS * n // BATCH, f"reference run: {len(ref)} batches")

        endpoint = f"tcp://{HOSTS['head']}:{PORT}"
        groups = f"""groups:
  decoders:
    listen: {endpoint}
    secret_key: {keys}/head.key
    allowed_keys: {allowed}
    unit_samples: 25
    heartbeat_timeout: 3s
    worker_timeout: 60s
"""
        out_dir = os.path.join(tmp, "out")
        graph = write_group_graph(os.path.join(tmp, "group.yaml"), url, out_dir, groups)
        make_network(made)

        head_log = os.path.join(tmp, "head.log")
        t0 = time.monotonic()
        with open(head_log, "w") as log:
            head = popen_in("head", ["run", graph, "--log-steps", "0"], log)
        procs.append(head)

        # The rogue first: the head is waiting for workers, so whatever it logs is about the rogue.
        rogue_log = os.path.join(tmp, "rogue.log")
        with open(rogue_log, "w") as log:
            rogue = popen_in("rogue", ["worker", "--connect", endpoint, "--key", f"{keys}/rogue.key",
                                       "--server-key", f"{keys}/head.pub", "--name", "rogue",
                                       "--connect-timeout", "3"], log)
        procs.append(rogue)
        wait_for(lambda: "refused" in read(head_log) or head.poll() is not None, 20, "the head to refuse the rogue")
        refusal = [line for line in read(head_log).splitlines() if "refused" in line]
        check(refusal and HOSTS["rogue"] in refusal[0] and rogue_pub in refusal[0],
              f"the head's refusal line names the rogue's address and key:\n{read(head_log)}")
        print("head:", refusal[0])
        rc = rogue.wait(timeout=30)
        rlog = read(rogue_log)
        check(rc != 0, f"the rogue worker exits non-zero, not {rc}:\n{rlog}")
        check(endpoint in rlog, f"the rogue's message names the endpoint:\n{rlog}")
        print("rogue:", rlog.strip().splitlines()[-1])
        check(head.poll() is None, f"the head still runs after the refusal:\n{read(head_log)}")

        wlogs = {}
        for name in ["w1", "w2"]:
            wlogs[name] = os.path.join(tmp, f"{name}.log")
            with open(wlogs[name], "w") as log:
                procs.append(popen_in(name, ["worker", "--connect", endpoint, "--key", f"{keys}/{name}.key",
                                             "--server-key", f"{keys}/head.pub", "--name", name,
                                             "--connect-timeout", "20"], log))
        rc = head.wait(timeout=60)
        hlog = read(head_log)
        check(rc == 0, f"the head's run succeeds, not {rc}:\n{hlog}")
        print(f"head finished {time.monotonic() - t0:.1f} s after it started")
        for p, name in zip(procs[2:], ["w1", "w2"]):
            wrc = p.wait(timeout=20)
            check(wrc == 0, f"worker {name} ends cleanly when the head ends the run, not {wrc}:\n{read(wlogs[name])}")

        epochs = [line for line in hlog.splitlines() if "Replica Train Samples=" in line]
        check(len(epochs) == EPOCHS and all(f"Replica Train Samples={n} " in e for e in epochs),
              f"{EPOCHS} epochs of {n} samples:\n{hlog}")
        # Both listed keys are admitted (the head lists each worker that joined); one may join after the other
        # has taken every unit of these small epochs, so only their sum must be samples.
        served = 0
        for name in ["w1", "w2"]:
            line = [x for x in hlog.splitlines() if x.startswith(f"worker {name} (pid") and " samples in " in x]
            check(line, f"worker {name} joined the group:\n{hlog}")
            served += int(line[0].split(": ", 1)[1].split()[0])
            print(line[0])
        check(served > 0, f"the workers ran units:\n{hlog}")
        summary = [x for x in hlog.splitlines() if x.startswith("group decoders:")]
        check(summary, f"the head prints the group's summary:\n{hlog}")
        print(summary[0])
        refused = int(summary[0].split(" connections refused")[0].rsplit(", ", 1)[1])
        check(refused >= 1, f"the summary counts the refused connection: {summary[0]}")
        check(" 0 duplicate results dropped, 0 malformed" in summary[0], f"nothing dropped: {summary[0]}")
        kinds = re.search(r"refused (\d+) connection\(s\): (\d+) not CURVE, (\d+) unknown key", hlog)
        check(kinds and int(kinds.group(3)) >= 1 and int(kinds.group(2)) == 0,
              f"the listening socket's closing count says: unknown key, not another mechanism:\n{hlog}")
        print(kinds.group(0))

        got = sfutil.read_batches(out_dir)
        check(len(got) == len(ref), f"{len(got)} batches from the group run, {len(ref)} from the reference")
        for (e, b, k, fields), (re_, rb, rk, rfields) in zip(got, ref):
            check((e, b) == (re_, rb), f"batch numbering {e}/{b} vs {re_}/{rb}")
            check(k == rk, f"epoch {e} batch {b}: keys differ from the single-process run")
            check(sorted(fields) == sorted(rfields), f"epoch {e} batch {b}: fields {sorted(fields)}")
            for name, arr in fields.items():
                check(arr.dtype == rfields[name].dtype and np.array_equal(arr, rfields[name]),
                      f"epoch {e} batch {b} field {name}: differs from the single-process run")
        for e in range(EPOCHS):
            seen = [k for (ee, _, ks, _) in got if ee == e for k in ks]
            check(sorted(seen) == sorted(truth), f"epoch {e}: every sample exactly once")
        check.done("groups_netns")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        if os.environ.get("SF_KEEP_TMP"):
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
