"""Slurm for real: examples/slurm/train.sbatch on a single-host Slurm, one worker step cancelled mid-epoch.

The test starts Debian's munged (as the munge user, its own key and socket), slurmctld and two slurmd
processes on loopback with a slurm.conf of its own (nodes gpu0 and cpu0 on this host: the components of a
heterogeneous job cannot share a node, because the backfill scheduler plans whole nodes). It submits the
shipped script with sbatch: the trainer step (`shardflow run` of a graph whose decode and augment run in
group `decoders`) writes a rendezvous file, and two worker steps (`shardflow worker --rendezvous`) find it
and join. Once both have joined, `scancel JOBID.STEP` cancels one; the head hands its units to the other,
and its batches must equal a single-process run's (keys and pixels), as in test_groups.

Needs root and the Slurm and munge binaries (exits 77 otherwise). Daemons, jobs and the temporary
directory are removed in finally, whatever failed.
"""
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq.auth

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import SHARDFLOW, Checks, free_port, group_graph, make_dataset, read_batches, run  # noqa: E402

SCRIPT = os.path.join(os.environ.get("SF_SOURCE_ROOT", "."), "examples", "slurm", "train.sbatch")
check = Checks()


def run_dir_checks():
    """The script's run directory, without Slurm (`srun` is a stub that logs its calls). A directory that is there
    already may be someone else's, with their key in keys/allowed/: the script refuses it and starts nothing; the
    one it makes is private (0700, whatever the umask), and so are the keys in it."""
    tmp = tempfile.mkdtemp(prefix="sf-sbatch-")
    try:
        stub = os.path.join(tmp, "bin")
        os.mkdir(stub)
        with open(os.path.join(stub, "srun"), "w") as f:
            f.write('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n')
        os.chmod(os.path.join(stub, "srun"), 0o755)
        graph = os.path.join(tmp, "graph.yaml")
        open(graph, "w").close()
        env = dict(os.environ, PATH=stub + ":" + os.environ.get("PATH", ""), SHARDFLOW=os.path.abspath(SHARDFLOW),
                   SLURM_SUBMIT_DIR=tmp, SLURM_JOB_ID="42")
        rundir = os.path.join(tmp, "shardflow-42")
        os.makedirs(os.path.join(rundir, "keys", "allowed"))
        open(os.path.join(rundir, "keys", "allowed", "theirs.pub"), "w").close()
        p = subprocess.run(["bash", SCRIPT, graph], env=env, capture_output=True, text=True, timeout=60, cwd=tmp)
        check(p.returncode != 0 and rundir in p.stderr and "exists" in p.stderr,
              f"a run directory that exists already is refused, naming it: {p.returncode} {p.stderr}")
        check(not os.path.exists(os.path.join(stub, "calls")) and os.listdir(os.path.join(rundir, "keys")) == ["allowed"],
              "...and nothing is started or written there")
        shutil.rmtree(rundir)
        p = subprocess.run(["bash", SCRIPT, graph], env=env, capture_output=True, text=True, timeout=60, cwd=tmp,
                           preexec_fn=lambda: os.umask(0))
        check(p.returncode == 0, f"a fresh run directory: {p.stderr}")
        modes = {n: os.stat(os.path.join(rundir, n)).st_mode & 0o777
                 for n in (".", "keys", "keys/allowed", "keys/head.key", "keys/worker.key")}
        check(modes == {".": 0o700, "keys": 0o700, "keys/allowed": 0o700, "keys/head.key": 0o600,
                        "keys/worker.key": 0o600}, f"the run directory and its keys are private under umask 000: {modes}")
        with open(os.path.join(stub, "calls")) as f:
            calls = f.read()
        check(calls.count("--het-group=1") == 1 and calls.count("--het-group=0") == 1,
              f"...and the script starts its steps: {calls}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


run_dir_checks()
NEEDED = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
missing = [b for b in NEEDED if not shutil.which(b, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
if missing:
    print(f"skipped: no {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)")
    sys.exit(77)
if os.geteuid() != 0:
    print("skipped: slurmd and munged (as the munge user) need root")
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="sf-slurm-")
os.chmod(tmp, 0o755)  # munged (the munge user) and the job's steps walk into it
daemons = []
job = None
env = dict(os.environ, SLURM_CONF=os.path.join(tmp, "slurm.conf"), SHARDFLOW=os.path.abspath(SHARDFLOW),
           PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def slurm(*args, check_rc=True):
    p = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp, timeout=30)
    if check_rc and p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({p.returncode}): {p.stdout}{p.stderr}")
    return p.stdout


def start(name, args, **kw):
    log = open(os.path.join(tmp, name + ".out"), "w")
    daemons.append((name, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp, **kw)))
    log.close()


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while not pred():
        for name, d in daemons:
            check(d.poll() is None, f"{name} ended while waiting for {what}: {tail(name + '.out')}")
        check(time.time() < deadline, f"{what} within {timeout} s")
        time.sleep(0.1)


def tail(name, n=4000):
    try:
        with open(os.path.join(tmp, name)) as f:
            return f.read()[-n:]
    except OSError:
        return ""


def start_slurm():
    munge_dir = os.path.join(tmp, "munge")
    os.mkdir(munge_dir, 0o755)  # the socket's directory must be searchable by everyone
    key = os.path.join(munge_dir, "munge.key")
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, env=env)
    m = pwd.getpwnam("munge")
    for path in (munge_dir, key):
        os.chown(path, m.pw_uid, m.pw_gid)
    socket = os.path.join(munge_dir, "munge.socket")
    start("munged", ["munged", "-F", f"--key-file={key}", f"--socket={socket}",
                     f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
                     f"--seed-file={munge_dir}/seed"], user=m.pw_uid, group=m.pw_gid)
    wait_for(lambda: os.path.exists(socket), 10, "munged's socket")
    host = os.uname().nodename
    for d in ("state", "spool/gpu0", "spool/cpu0"):
        os.makedirs(os.path.join(tmp, d))
    # Two nodes on this host, each its own slurmd on its own port: gpu0 runs the trainers'
    # component, cpu0 (2 CPUs, `srun -n 2`) the workers'.
    with open(env["SLURM_CONF"], "w") as f:
        f.write(f"""ClusterName=sftest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool/%n
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd-%n.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=bf_interval=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
NodeName=gpu0 NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=1 State=UNKNOWN
NodeName=cpu0 NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 State=UNKNOWN
PartitionName=gpu Nodes=gpu0 Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=cpu0 MaxTime=INFINITE State=UP
""")
    start("slurmctld", ["slurmctld", "-D", "-i", "-f", env["SLURM_CONF"]])
    for node in ("gpu0", "cpu0"):
        start("slurmd-" + node, ["slurmd", "-D", "-N", node, "-f", env["SLURM_CONF"]])
    wait_for(lambda: slurm("sinfo", "-h", "-N", "-o", "%T", check_rc=False).split() == ["idle", "idle"], 30,
             "both nodes idle")
    check(slurm("srun", "-p", "cpu", "-n", "2", "hostname").split() == [host, host], "srun -n 2 runs two tasks")


def steps():
    """The job's running steps: {step name: step id as scancel takes it}."""
    out = slurm("squeue", "-h", "-s", "-o", "%i %j", check_rc=False)
    return {name: sid for sid, name in (line.split() for line in out.splitlines() if line.strip())}


def stop_all():
    if job:
        slurm("scancel", job, check_rc=False)
        try:
            wait_for(lambda: not slurm("squeue", "-h", "-o", "%i", check_rc=False).strip(), 15, "the job gone")
        except AssertionError:
            pass
    for name, d in reversed(daemons):
        d.terminate()
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()


try:
    # Errors a user can cause name the file or option and what to do.
    p = run(["worker", "--rendezvous", os.path.join(tmp, "none"), "--connect-timeout", "0.3"], check=False)
    check(p.returncode == 1 and os.path.join(tmp, "none") in p.stderr and "rendezvous:" in p.stderr,
          f"a worker without a rendezvous file names it and the head's option: {p.stderr}")
    bad, _ = group_graph(tmp, "no-listen", "x.tar", {"processes": 1, "rendezvous": os.path.join(tmp, "r")})
    p = run(["run", bad], check=False)
    check(p.returncode != 0 and "rendezvous: needs listen:" in p.stderr, f"rendezvous without listen: {p.stderr}")
    start_slurm()
    urls, truth = make_dataset(tmp, shards=8, per_shard=250, size=16)
    ref_path, ref_out = group_graph(tmp, "reference", urls, shuffle_buffer=300, seed=5)
    run(["run", ref_path, "--quiet", "--no-summary"])
    reference = read_batches(ref_out)

    # The script sets listen:, the keys and rendezvous: of group decoders; quick heartbeats notice the
    # cancelled worker fast. A trainer step of 80 ms (125 batches: 10 s) keeps the epoch going past the cancel,
    # however slow the Slurm calls between the join and the stop are on a loaded machine.
    path, out = group_graph(tmp, "slurm", urls, {"heartbeat_interval": "200ms", "heartbeat_timeout": "2s",
                                                 "worker_threads": 1, "unit_samples": 16},
                            shuffle_buffer=300, seed=5)
    job = slurm("sbatch", "--parsable", SCRIPT, path, "--step-time", "0.08", "--log-steps", "0").strip()
    job = job.split(";")[0].split("+")[0]
    output = f"slurm-{job}.out"
    wait_for(lambda: tail(output, 10**6).count(" joined") >= 2, 30, "both worker steps join the head")
    workers = {name: sid for name, sid in steps().items() if name.startswith("shardflow-worker-")}
    check(len(workers) == 2, f"two worker steps run: {steps()}")
    check("shardflow-trainer" in steps(), "the trainer step still runs when a worker is cancelled")
    # The rendezvous file is a ZeroMQ certificate: pyzmq's reader finds the head's public key in it.
    rundir = os.path.join(tmp, f"shardflow-{job}")
    public, _ = zmq.auth.load_certificate(os.path.join(rundir, "head-0.rendezvous"))
    check(public == zmq.auth.load_certificate(os.path.join(rundir, "keys", "head.pub"))[0],
          "the rendezvous file carries the head's public key")
    with open(os.path.join(rundir, "head-0.rendezvous")) as f:
        check(f'endpoint = "tcp://{os.uname().nodename}:' in f.read(), "...and the endpoint with this host's name")
    victim = workers["shardflow-worker-0"]
    check(re.fullmatch(r"\d+\.\d+", victim) is not None, f"a step id JOBID.STEP: {victim}")
    # Stopped first (as test_groups does), so the victim surely holds units the head must hand to the other.
    slurm("scancel", "--signal=STOP", victim)
    time.sleep(0.5)
    slurm("scancel", victim)
    done_at_cancel = len(read_batches(out))
    check(done_at_cancel < len(reference), f"cancelled mid-epoch ({done_at_cancel} of {len(reference)} batches)")
    wait_for(lambda: not slurm("squeue", "-h", "-j", job, "-o", "%i", check_rc=False).strip(), 45, "the job ends")
    log = tail(output, 10**6)
    noticed = re.search(r".*worker worker-0 .*(left|missed heartbeats|cannot be reached).*", log)
    check(noticed is not None, f"the head noticed the cancelled worker:\n{log}")
    reassigned = re.search(r"(\d+) units reassigned", log)
    check(reassigned is not None and int(reassigned.group(1)) > 0, f"the cancelled worker's units went to the other:\n{log}")
    print(f"{reassigned.group(0)}; scancel {victim} after {done_at_cancel} of {len(reference)} batches; the head: {noticed.group(0)}")
    check("shardflow: error" not in log and "shardflow worker:" not in log.replace("shardflow worker: stopped", ""),
          f"the run had no errors:\n{log}")
    check(not os.path.exists(os.path.join(rundir, "head-0.rendezvous")),
          "the head removed its rendezvous file at the end")
    batches = read_batches(out)
    check(len(batches) == len(reference), f"{len(batches)} batches, one process made {len(reference)}:\n{log}")
    for (e, b, keys, fields), (_, _, rkeys, rfields) in zip(batches, reference):
        check(keys == rkeys, f"epoch {e} batch {b}: keys differ from one process's")
        for name in rfields:
            check(np.array_equal(fields[name], rfields[name]), f"epoch {e} batch {b} field {name} differs")
    keys = [k for _, _, ks, _ in batches for k in ks]
    check(sorted(keys) == sorted(truth), "every key exactly once")
finally:
    stop_all()
    shutil.rmtree(tmp, ignore_errors=True)
check.done("slurm")
