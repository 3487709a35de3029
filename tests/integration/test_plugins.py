"""Plugins: the example plugin built out of tree from installed headers runs in a graph (checked against numpy);
a plugin's own augment on the public codec API equals augment's centre crop and numpy on PIL's decode;
a plugin splitting shards on the public shard I/O API equals tarfile and tar_split;
a wrong ABI version, a missing entry point, name clashes, a plugin not found and a non-ELF file are refused
with the graph's file:line, the plugin's file and what to do."""
import ctypes
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import (SHARDFLOW, Checks, batch_row, make_dataset, read_batches, run, stage_table,  # noqa: E402
                    write_graph, write_shard)

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-plugins-")
build, source = os.environ["SF_BUILD_ROOT"], os.environ["SF_SOURCE_ROOT"]
urls, truth = make_dataset(tmp, shards=2, per_shard=5, size=6, seed=3)
env = dict(os.environ, SHARDFLOW_PLUGIN_PATH="")

# --- Out of tree: install into a scratch root, build plugins/example/scale.c with pkg-config's flags only.
dest = os.path.join(tmp, "root")
subprocess.run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"], check=True,
               capture_output=True)
pc = [os.path.join(d, f) for d, _, fs in os.walk(dest) for f in fs if f == "shardflow.pc"]
check(len(pc) == 1, f"meson install writes one shardflow.pc: {pc}")
prefix = dest + "/usr/local" if os.path.isdir(dest + "/usr/local") else None
cflags = subprocess.run(["pkg-config", "--cflags", f"--define-variable=prefix={prefix}", "shardflow"],
                        env=dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pc[0])), capture_output=True,
                        text=True, check=True).stdout.split()
check(f"-I{prefix}/include" in cflags and not any(source in f for f in cflags),
      f"pkg-config's include path is the installed one, not the source tree: {cflags}")
scale_so = os.path.join(tmp, "example.so")
subprocess.run(["cc", "-shared", "-fPIC", "-O2", *cflags, os.path.join(source, "plugins/example/scale.c"),
                "-o", scale_so, "-lm"], check=True)
installed = [os.path.join(d, f) for d, _, fs in os.walk(dest) for f in fs if f == "example.so"]
check(len(installed) == 1 and installed[0].endswith("/shardflow/plugins/example.so"),
      f"meson installs the example plugin into $libdir/shardflow/plugins: {installed}")

# The installed shardflow.pc is relocatable (${pcfiledir}) and names only the headers' directory: the engine's
# dependencies are for linking it statically (Libs.private), never -I paths of theirs in a plugin's build.
plain = subprocess.run(["pkg-config", "--cflags", "shardflow"], env=dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pc[0])),
                       capture_output=True, text=True, check=True).stdout.split()
check(len(plain) == 1 and plain[0].startswith("-I") and os.path.realpath(plain[0][2:]) == f"{prefix}/include",
      f"pkg-config --cflags shardflow, moved to {dest}, is its include directory alone: {plain}")
static = subprocess.run(["pkg-config", "--libs", "--static", "shardflow"], capture_output=True, text=True,
                        env=dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pc[0])), check=True).stdout.split()
check(all(f in static for f in ("-lshardflow", "-lcurl", "-lzmq", "-larchive")),
      f"pkg-config --libs --static still names what a static link needs: {static}")

# The installed CLI, moved to the scratch root too, answers for its own installation: config, and the plugins
# of its $libdir/shardflow/plugins listed and described by help with no SHARDFLOW_PLUGIN_PATH.
installed_cli = os.path.join(prefix, "bin", "shardflow")


def installed_run(*args):
    p = subprocess.run([installed_cli, *args], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 0, f"{installed_cli} {' '.join(args)}:\n{p.stdout}{p.stderr}")
    return p.stdout


got = installed_run("config", "--cflags").split()
check(len(got) == 1 and os.path.realpath(got[0][2:]) == f"{prefix}/include", f"config --cflags: {got}")
got = installed_run("config", "--plugin-dir").split()
check(len(got) == 1 and os.path.realpath(got[0]) == os.path.dirname(installed[0]), f"config --plugin-dir: {got}")
got = installed_run("config", "--pkgconfigdir").split()
check(len(got) == 1 and os.path.realpath(got[0]) == os.path.dirname(pc[0]), f"config --pkgconfigdir: {got}")
got = installed_run("help")
check(re.search(r"^  scale +.*\(plugin example\)$", got, re.M), f"the installed CLI's help lists its plugins: {got}")
got = installed_run("help", "scale")
check("from plugin example" in got and "factor" in got, f"help scale names the plugin: {got}")


def graph(name, plugins, middle, extra=""):
    """A graph file: plugins list on line 1, then source, split, decode, MIDDLE stages, batch, npy dump."""
    out = os.path.join(tmp, name + "-out")
    path = os.path.join(tmp, name + ".yaml")
    text = f"plugins: [{', '.join(plugins)}]\nseed: 1\n{extra}stages:\n"
    text += f"  - type: shard_source\n    urls: {urls}\n  - type: tar_split\n  - type: decode\n"
    text += middle
    text += f"  - type: batch\n    batch_size: 5\n  - type: device_sink\n    npy_dir: {out}\n"
    with open(path, "w") as f:
        f.write(text)
    return path, out


def fields(out):
    got = {}
    for _, _, keys, f in read_batches(out):
        for j, k in enumerate(keys):
            got[k] = f["ppm"][j]
    return got


# uint8: rounded to nearest (ties to even, as numpy's rint) and clamped; every sample against the images written.
for factor in (0.7, 1.9, 2.5):
    path, out = graph(f"u8-{factor}", [scale_so], f"  - type: scale\n    factor: {factor}\n")
    run(["run", path, "--quiet", "--no-summary"], env=env)
    got = fields(out)
    check(sorted(got) == sorted(truth), f"every sample comes out once: {sorted(got)}")
    for k, (img, _) in truth.items():
        want = np.clip(np.rint(img.astype(np.float64) * factor), 0, 255).astype(np.uint8)
        check(got[k].dtype == np.uint8 and np.array_equal(got[k], want),
              f"factor {factor}, sample {k}: scale matches numpy (max diff "
              f"{np.abs(got[k].astype(int) - want.astype(int)).max()})")

# A plugin's own counter and log line (sf_node_counter_add, sf_node_log): scale counts the uint8 values it clamps.
# One run with 3 replicas and a slow consumer: /metrics (per replica, summed here) while it runs, then the stage
# table and --stats-json's final record, all equal to numpy's count; the warning names the node as the engine's
# own lines do, once per replica at most.
factor = 1.9
want = sum(int(((np.rint(img.astype(np.float64) * factor) > 255) | (np.rint(img.astype(np.float64) * factor) < 0))
               .sum()) for img, _ in truth.values())
check(want > 0, f"the dataset has values factor {factor} clamps: {want}")
path, out = graph("counted", [scale_so], f"  - type: scale\n    factor: {factor}\n    replicas: 3\n")
stats_path = os.path.join(tmp, "counted.jsonl")
proc = subprocess.Popen([SHARDFLOW, "run", path, "--quiet", "--stats-json", stats_path, "--metrics", "127.0.0.1:0",
                         "--step-time", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
first, port = "", None
while not port:  # the server logs its port from its own thread: scale's warnings may come first
    line = proc.stderr.readline()
    first += line
    port = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
    if not line:
        break
rest = []
drain = threading.Thread(target=lambda: rest.append(proc.stderr.read()))
drain.start()
scraped, series = None, ""
deadline = time.monotonic() + 30
while port and scraped != want and time.monotonic() < deadline:
    try:
        series = urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=5).read().decode()
    except OSError:
        break  # the run ended
    found = re.findall(r'^shardflow_stage_counter_total\{stage="scale",type="scale",replica="(\d)",'
                       r'counter="clamped"\} (\d+)$', series, re.M)
    scraped = sum(int(v) for _, v in found) if len(found) == 3 else None
    time.sleep(0.05)
proc.wait(timeout=120)
drain.join()
err = first + "".join(rest)
check(proc.returncode == 0, f"the counted run: exit {proc.returncode}: {err}")
check(scraped == want and "# TYPE shardflow_stage_counter_total counter" in series,
      f"/metrics: clamped summed over the 3 replicas is {scraped}, numpy counts {want}:\n{series[-1500:]}\n{first}")
got = stage_table(err).get("scale", {})
check(got.get("reps") == 3 and got.get("counters") == {"clamped": want},
      f"the stage table's line under scale: {got}, numpy counts {want}:\n{err}")
final = [json.loads(line) for line in open(stats_path)][-1]
node = next((n for n in final["nodes"] if n["name"] == "scale"), {})
check(final["final"] and node.get("counters") == {"clamped": want}, f"--stats-json: {node}, numpy counts {want}")
others = [n["name"] for n in final["nodes"] if "counters" in n and n["name"] != "scale"]
check(not others, f"nodes without counters of their own have no `counters`: {others}")
warned = [line for line in err.splitlines() if "takes uint8 values" in line]
check(1 <= len(warned) <= 3 and all(line.startswith(f"shardflow: scale: factor {factor} takes uint8 values of 'ppm' "
                                                    "out of 0..255 (first in sample ") for line in warned),
      f"scale's warning, prefixed with its node's name like the engine's lines: {warned}")

# float32 (after augment), by name through SHARDFLOW_PLUGIN_PATH; the same file twice is loaded once.
aug = "  - type: augment\n    layout: hwc\n"
path, base = graph("f32-base", [], aug)
run(["run", path, "--quiet", "--no-summary"])
path, out = graph("f32", ["example", scale_so], aug + "  - type: scale\n    factor: -3.25\n")
run(["run", path, "--quiet", "--no-summary"], env=dict(env, SHARDFLOW_PLUGIN_PATH=f"/nonexistent:{tmp}"))
b, got = fields(base), fields(out)
for k in truth:
    want = (b[k].astype(np.float64) * -3.25).astype(np.float32)
    check(got[k].dtype == np.float32 and np.array_equal(got[k], want), f"float32 sample {k} matches numpy")

# The map contract (stage.h), with replicas: *sample = NULL drops on purpose (counted as filtered); an error record
# plus its code drops under error_policy skip; each leaves its replica hole, so the order stays the source's.
SIEVE = """#include <stdlib.h>
#include <shardflow/plugin.h>
static int map(sf_node *node, sf_sample **sample) {
  int k = atoi((*sample)->key);
  if (k %% 5 == 1) {
    sf_sample_destroy(sample);
    return 0;
  }
  if (k %% 5 != 3) return 0;
  sf_node_error(node, SF_EINVAL, NULL, (*sample)->key, -1, "key ends in 3 or 8");
  return SF_EINVAL;
}
static const sf_stage_def s = {.abi_version = SF_STAGE_ABI_VERSION, .name = "sieve", .summary = "test",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}), .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP, .map = map};
static const sf_stage_def *const stages[] = {&s, 0};
static const sf_plugin p = {.abi_version = SF_STAGE_ABI_VERSION, .name = "sieve", .build_id = "1", .stages = stages};
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &p; }
"""
with open(os.path.join(tmp, "sieve.c"), "w") as f:
    f.write(SIEVE % {})
sieve_so = os.path.join(tmp, "sieve.so")
subprocess.run(["cc", "-shared", "-fPIC", *cflags, os.path.join(tmp, "sieve.c"), "-o", sieve_so], check=True)
want_keys = [k for k in sorted(truth) if int(k) % 5 not in (1, 3)]
for replicas in (1, 2):
    path, out = graph(f"sieve{replicas}", [sieve_so], f"  - type: sieve\n    replicas: {replicas}\n",
                      "max_error_rate: 1\n")
    p = run(["run", path, "--no-summary"], env=env)
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    check(keys == want_keys, f"replicas {replicas}: the samples kept, in the source's order: {keys}")
    check(f"{len(truth) // 5} error record(s), {len(truth) // 5} sample(s) skipped" in p.stderr,
          f"replicas {replicas}: errors and drops are counted: {p.stderr}")

# A positive return is outside the contract (a bug in the plugin): an error record naming the stage and the code,
# under the graph's error policy; before, such samples vanished without a record and the run exited 0.
with open(os.path.join(tmp, "positive.c"), "w") as f:
    f.write(SIEVE.split("static int map")[0] + "static int map(sf_node *node, sf_sample **sample) {\n"
            "  (void)node;\n  return atoi((*sample)->key) % 5 == 4 ? 7 : 0;\n}\n" +
            SIEVE.split("return SF_EINVAL;\n}\n")[1].replace('"sieve"', '"positive"') % {})
positive_so = os.path.join(tmp, "positive.so")
subprocess.run(["cc", "-shared", "-fPIC", *cflags, os.path.join(tmp, "positive.c"), "-o", positive_so], check=True)
bugged = [k for k in sorted(truth) if int(k) % 5 == 4]
for policy, status in (("skip", 0), ("fail", 1)):
    path, out = graph(f"positive-{policy}", [positive_so], "  - type: positive\n    name: buggy\n    replicas: 2\n",
                      f"max_error_rate: 1\nerror_policy: {policy}\n")
    shutil.rmtree(out, ignore_errors=True)
    p = run(["run", path, "--no-summary"], env=env, check=False)
    keys = [k for _, _, ks, _ in read_batches(out) for k in ks]
    named = re.search(r"buggy.*map returned 7", p.stderr)
    check(p.returncode == status and named, f"{policy}: a positive return is an error record naming the stage and "
          f"the code, exit {status}: exit {p.returncode}: {p.stderr}")
    if policy == "skip":
        check(keys == [k for k in sorted(truth) if k not in bugged], f"skip: the others arrive in order: {keys}")
        check(f"{len(bugged)} error record(s), {len(bugged)} sample(s) skipped" in p.stderr,
              f"skip: each one is counted: {p.stderr}")

# Groups: a local worker process loads the plugin the head names (by path) and runs its stage.
path, out = graph("group-local", [scale_so], "  - type: scale\n    factor: 0.7\n    group: g\n",
                  "groups:\n  g: {processes: 1}\n")
run(["run", path, "--quiet", "--no-summary"], env=env)
got = fields(out)
for k, (img, _) in truth.items():
    want = np.clip(np.rint(img.astype(np.float64) * 0.7), 0, 255).astype(np.uint8)
    check(np.array_equal(got[k], want), f"sample {k} scaled in a worker process matches numpy")

# A remote worker lacking the plugin, or with another build of it, answers BYE naming it; the head says which.
here, other = os.path.join(tmp, "here"), os.path.join(tmp, "other")
os.makedirs(here)
os.makedirs(other)
shutil.copy(scale_so, os.path.join(here, "example.so"))
with open(os.path.join(source, "plugins/example/scale.c")) as f:
    text = f.read().replace('"example 1.0"', '"example 2.0"')
check('"example 2.0"' in text, "the example's build_id is the literal the test rewrites")
with open(os.path.join(tmp, "scale2.c"), "w") as f:
    f.write(text)
subprocess.run(["cc", "-shared", "-fPIC", *cflags, os.path.join(tmp, "scale2.c"), "-o",
                os.path.join(other, "example.so"), "-lm"], check=True)
for name, worker_path, needles in [
        ("lacking", "", ["plugin 'example' not found"]),
        ("build", other, ["plugin 'example' here is build 'example 2.0', the head's is build 'example 1.0'"])]:
    ipc = os.path.join(tmp, name + ".ipc")
    path, _ = graph("group-" + name, ["example"], "  - type: scale\n    group: g\n",
                    f"groups:\n  g: {{listen: 'ipc://{ipc}'}}\n")
    h = subprocess.Popen([os.environ["SHARDFLOW"], "run", path, "--quiet", "--no-summary"],
                         env=dict(env, SHARDFLOW_PLUGIN_PATH=here), stderr=subprocess.PIPE, text=True)
    try:
        w = subprocess.run([os.environ["SHARDFLOW"], "worker", "--connect", f"ipc://{ipc}", "--quiet",
                            "--connect-timeout", "20"], env=dict(env, SHARDFLOW_PLUGIN_PATH=worker_path),
                           capture_output=True, text=True, timeout=60)
    finally:
        time.sleep(0.5)  # the head logs the BYE
        h.terminate()
        head_err = h.communicate(timeout=30)[1]
    check(w.returncode != 0, f"{name}: the worker refuses the group: {w.returncode} {w.stderr}")
    for n in needles + [f"{path}:1"]:
        check(n in w.stderr, f"{name}: the worker says {n!r}: {w.stderr!r}")
    check("says: worker" in head_err and needles[0] in head_err, f"{name}: the head logs the BYE: {head_err!r}")

# A worker loads plugins only from its own SHARDFLOW_PLUGIN_PATH (and default directory) or the files it was started
# with (--allow-plugin): a path the head names is looked up by its file name there, never opened, or whoever runs
# (or impersonates) a head could run code on every worker. The constructor below records any load in the worker.
far = os.path.join(tmp, "far")
os.makedirs(far)
with open(os.path.join(tmp, "mark.c"), "w") as f:
    f.write("#include <fcntl.h>\n#include <stdlib.h>\n#include <unistd.h>\n"
            "__attribute__((constructor)) static void mark(void) {\n"
            "  const char *m = getenv(\"SF_TEST_LOADED\");\n"
            "  if (m) close(open(m, O_CREAT | O_WRONLY, 0600));\n}\n")
far_so = os.path.join(far, "example.so")
subprocess.run(["cc", "-shared", "-fPIC", *cflags, os.path.join(source, "plugins/example/scale.c"),
                os.path.join(tmp, "mark.c"), "-o", far_so, "-lm"], check=True)
marker = os.path.join(tmp, "loaded-by-worker")
for name, extra, worker_path, ok in [("head-path", [], "", False),
                                     ("allowed", ["--allow-plugin", far_so], "", True),
                                     ("own-path", [], here, True)]:
    ipc = os.path.join(tmp, name + ".ipc")
    path, out = graph("group-" + name, [far_so], "  - type: scale\n    factor: 0.7\n    group: g\n",
                      f"groups:\n  g: {{listen: 'ipc://{ipc}', worker_timeout: 20s}}\n")
    h = subprocess.Popen([os.environ["SHARDFLOW"], "run", path, "--quiet", "--no-summary"], env=env,
                         stderr=subprocess.PIPE, text=True)
    try:
        w = subprocess.run([os.environ["SHARDFLOW"], "worker", "--connect", f"ipc://{ipc}", "--quiet",
                            "--connect-timeout", "20", *extra],
                           env=dict(env, SHARDFLOW_PLUGIN_PATH=worker_path, SF_TEST_LOADED=marker),
                           capture_output=True, text=True, timeout=60)
    finally:
        time.sleep(0.5 if not ok else 0)
        if not ok:
            h.terminate()
        head_err = h.communicate(timeout=60)[1]
    if ok:
        check(w.returncode == 0 and h.returncode == 0, f"{name}: the worker runs the group: {w.stderr} {head_err}")
        got = fields(out)
        check(sorted(got) == sorted(truth), f"{name}: every sample once")
        for k, (img, _) in truth.items():
            want = np.clip(np.rint(img.astype(np.float64) * 0.7), 0, 255).astype(np.uint8)
            check(np.array_equal(got[k], want), f"{name}: sample {k} scaled by the worker matches numpy")
        check(os.path.exists(marker) == (name == "allowed"),
              f"{name}: the worker loaded {'the file it was given' if name == 'allowed' else 'its own copy'}")
    else:
        check(not os.path.exists(marker), f"{name}: the worker did not load the file the head named ({far_so})")
        check(w.returncode != 0 and "plugin 'example' not found" in w.stderr and "--allow-plugin" in w.stderr,
              f"{name}: the worker refuses, saying where it looked and about --allow-plugin: {w.stderr!r}")
    if os.path.exists(marker):
        os.unlink(marker)

# A relative path in `plugins:` is the graph file's neighbour, wherever the run starts.
rel = os.path.join(tmp, "rel")
os.makedirs(os.path.join(rel, "lib"))
shutil.copy(scale_so, os.path.join(rel, "lib", "example.so"))
path, out = graph("relative", ["lib/example.so"], "  - type: scale\n    factor: 1.9\n")
moved = os.path.join(rel, "relative.yaml")
os.rename(path, moved)
p = run(["run", moved, "--quiet", "--no-summary"], env=env, check=False, cwd=far)
check(p.returncode == 0, f"lib/example.so next to the graph file, run from another directory: {p.stderr}")
got = fields(out)
for k, (img, _) in truth.items():
    want = np.clip(np.rint(img.astype(np.float64) * 1.9), 0, 255).astype(np.uint8)
    check(np.array_equal(got[k], want), f"relative plugin path: sample {k} matches numpy")

# help lists, describes and documents plugin stages.
p = run(["help", "--plugin", scale_so], env=env)
check("scale" in p.stdout and "(plugin example)" in p.stdout, f"help lists the plugin's stage: {p.stdout}")
p = run(["help", "--plugin", scale_so, "scale"], env=env)
check("factor" in p.stdout and "from plugin example" in p.stdout, f"help scale prints its options: {p.stdout}")
p = run(["help", "--markdown", "--plugin", scale_so], env=env)
check("## scale" in p.stdout and "| `factor` |" in p.stdout, "help --markdown documents the plugin's stage")
p = run(["help", "--markdown"], env=env)
check("## scale" not in p.stdout, "without --plugin the generated docs are the built-ins' only")

# --- Refusals: bad plugins built here from small C sources.
PLUGIN = """#include <shardflow/plugin.h>
static int step(sf_node *node) { (void)node; return SF_EOF; }
static int map(sf_node *node, sf_sample **sample) { (void)node; (void)sample; return 0; }
static const sf_stage_def s = {.abi_version = %(stage_abi)s, .name = "%(stage)s", .summary = "test",
    .inputs = %(inputs)s, .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}), %(calls)s};
static const sf_stage_def *const stages[] = {&s, 0};
static const sf_plugin p = {.abi_version = %(abi)s, .name = "%(name)s", .build_id = "1", .stages = stages};
SF_PLUGIN_EXPORT const sf_plugin *%(entry)s(void);
SF_PLUGIN_EXPORT const sf_plugin *%(entry)s(void) { return &p; }
"""


def plugin(name, stage="twin", abi="SF_STAGE_ABI_VERSION", stage_abi="SF_STAGE_ABI_VERSION",
           entry="sf_plugin_entry", inputs='SF_PORTS({"in", SF_PORT_SAMPLE})', calls=".step = step, .map = 0"):
    c = os.path.join(tmp, name + ".c")
    with open(c, "w") as f:
        f.write(PLUGIN % dict(name=name, stage=stage, abi=abi, stage_abi=stage_abi, entry=entry,
                               inputs=inputs, calls=calls))
    so = os.path.join(tmp, name + ".so")
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(source, "include"), c, "-o", so], check=True)
    return so


def refused(name, plugins, *needles, line=1, env=env):
    path, _ = graph(name, plugins, "")
    p = run(["run", path, "--quiet", "--no-summary"], check=False, env=env)
    check(p.returncode == 1, f"{name}: exit status 1, got {p.returncode}: {p.stderr}")
    for n in (f"{path}:{line}",) + needles:
        check(n in p.stderr, f"{name}: the message names {n!r}: {p.stderr!r}")


abi = plugin("abi", abi="SF_STAGE_ABI_VERSION + 1")
refused("abi", [abi], abi, "stage ABI version", "rebuild the plugin against this shardflow")
stage_abi = plugin("stage_abi", stage_abi="SF_STAGE_ABI_VERSION - 1")
refused("stage_abi", [stage_abi], stage_abi, "stage 'twin'", "rebuild the plugin against this shardflow")
noentry = plugin("noentry", entry="not_the_entry")
refused("noentry", [noentry], noentry, "no entry point sf_plugin_entry", "SF_PLUGIN_EXPORT")
a, b = plugin("twin_a"), plugin("twin_b")
refused("clash", [a, b], b, "stage 'twin' clashes with the stage of plugin 'twin_a'", a)
dec = plugin("dec", stage="decode")
refused("builtin", [dec], dec, "stage 'decode' clashes with the built-in stage", "rename")
both = plugin("both", calls=".step = step, .map = map")
refused("both", [both], both, "not exactly one of a step and a map function", "fix the plugin")
fanin = plugin("fanin", stage="merge", inputs='SF_PORTS({"images", SF_PORT_SAMPLE}, {"captions", SF_PORT_SAMPLE})')
path, _ = graph("fanin", [fanin], "  - {type: merge, inputs: [tar_split, decode, shard_source]}\n")
p = run(["run", path, "--quiet", "--no-summary"], check=False, env=env)
check(p.returncode == 1 and f"{path}:8" in p.stderr and "node 'merge' (merge) takes at most 2 inputs" in p.stderr,
      f"a stage of two input ports given three inputs is refused: {p.stderr}")
refused("notfound", ["nosuch"], "plugin 'nosuch' not found", f"{tmp}/nosuch.so", "SHARDFLOW_PLUGIN_PATH",
        env=dict(env, SHARDFLOW_PLUGIN_PATH=tmp))
text = os.path.join(tmp, "text.so")
with open(text, "w") as f:
    f.write("not an ELF file, but a text file long enough for the loader to read its header\n" * 4)
try:  # the reference: the dynamic loader's own words, through ctypes
    ctypes.CDLL(text)
    raise AssertionError("ctypes loads a text file")
except OSError as e:
    dlerror = str(e)
refused("notelf", [text], f"plugin {text} cannot be loaded", dlerror, "rebuild it as a shared object")
p = run(["help", "--plugin", abi], check=False, env=env)
check(p.returncode != 0 and abi in p.stderr and "rebuild" in p.stderr, f"help --plugin refuses too: {p.stderr}")

# `shardflow help` lists the stages of every plugin on SHARDFLOW_PLUGIN_PATH (a scan of *.so, no --plugin); one that
# fails to load is named in one line with why, and the listing goes on. Reference: the scale.c options table.
found, junk = os.path.join(tmp, "found"), os.path.join(tmp, "junk")
os.makedirs(found), os.makedirs(junk)
shutil.copy(scale_so, os.path.join(found, "example.so"))
shutil.copy(text, os.path.join(junk, "broken.so"))
shutil.copy(text, os.path.join(junk, "notes.txt"))  # not a .so: not tried
scan_env = dict(env, SHARDFLOW_PLUGIN_PATH=f"{junk}:/nonexistent:{found}")
rows = re.findall(r'\{"(\w+)", SF_OPT_', open(os.path.join(source, "plugins/example/scale.c")).read())
p = run(["help"], env=scan_env)
check(re.search(r"^  scale +.*\(plugin example\)$", p.stdout, re.M) and re.search(r"^  decode ", p.stdout, re.M),
      f"help lists the found plugin's stage with the built-ins: {p.stdout}")
bad_lines = [line for line in p.stderr.splitlines() if "broken.so" in line]
check(len(bad_lines) == 1 and "not listed" in bad_lines[0] and dlerror.split(":")[-1].strip() in bad_lines[0]
      and "notes.txt" not in p.stderr, f"the broken plugin is named once, with the loader's reason: {p.stderr}")
p = run(["help", "scale"], env=scan_env)
check(rows == ["field", "factor"] and all(r in p.stdout for r in rows), f"help scale shows {rows}: {p.stdout}")
p = run(["help", "--markdown"], env=scan_env)
docs = open(os.path.join(source, "docs/stages.md")).read()
check("\n## scale\n" in p.stdout and all(f"`{r}`" in p.stdout.split("\n## scale\n")[1] for r in rows)
      and "## scale" not in docs and p.stdout.count("\n## ") == docs.count("\n## ") + 1,
      f"help --markdown documents the found plugin's stage after the built-ins; docs/stages.md keeps built-ins only")

# A plugin's own augment through the public codec API (include/shardflow/codec.h): tests/plugins/crop.c, built out of
# tree from the installed headers like scale.c, crops JPEGs that decode left undecoded (only the crop's region is
# decoded) and writes float32 CHW through sf_image_transform_apply. References: augment's centre crop, flip and
# mean/std from the fully decoded image and from its own region decode, and numpy from PIL's decode.
crop_so = os.path.join(tmp, "crop.so")
subprocess.run(["cc", "-shared", "-fPIC", "-O2", *cflags, os.path.join(source, "tests/plugins/crop.c"), "-o", crop_so,
                "-lm"], check=True)
jrng = np.random.default_rng(24)
photos = {}
for i, (h, w) in enumerate([(40, 56), (33, 47), (20, 30), (64, 48), (24, 24)] * 2):
    y, x = np.mgrid[0:h, 0:w]
    img = (np.stack([x * 3 + y, y * 4, 128 + x - y], axis=-1) + jrng.integers(0, 24, (h, w, 3))).clip(0, 255)
    b = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(b, "JPEG", quality=90)
    photos[f"{i:04d}"] = b.getvalue()
jpeg_shard = write_shard(os.path.join(tmp, "jpeg.tar"), [(k, {"jpg": v, "cls": b"1"}) for k, v in photos.items()])
norm = "    mean: [0.485, 0.456, 0.406]\n    std: [0.229, 0.224, 0.225]\n"


def crop_run(name, defer, middle):
    out = os.path.join(tmp, name + "-out")
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"plugins: [{crop_so}]\nstages:\n  - type: shard_source\n    urls: {jpeg_shard}\n  - type: tar_split\n"
                f"  - type: decode\n    defer_jpeg: {defer}\n{middle}  - type: batch\n    batch_size: 5\n"
                f"  - type: device_sink\n    npy_dir: {out}\n")
    run(["run", path, "--quiet", "--no-summary"], env=env)
    got = {}
    for _, _, keys, f in read_batches(out):
        for j, k in enumerate(keys):
            got[k] = f["jpg"][j]
    return got


plugin_out = crop_run("crop-plugin", "true", "  - type: crop\n    size: 24\n    flip: true\n" + norm)
for defer in ("false", "true"):
    builtin = crop_run(f"crop-augment-{defer}", defer, "  - type: augment\n    crop: center\n    size: 24\n    flip: 1\n"
                       "    layout: chw\n    dtype: float32\n" + norm)
    check(sorted(builtin) == sorted(photos) and all(np.array_equal(plugin_out[k], builtin[k]) for k in photos),
          f"the crop plugin (public codec API, region decode) equals augment's centre crop (defer_jpeg {defer})")
mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
for k, data in photos.items():
    img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.float64)
    h, w, _ = img.shape
    pad = np.zeros((max(h, 24) + 24, max(w, 24) + 24, 3))
    top = int(round((h - 24) / 2)) if h >= 24 else -((24 - h) // 2)
    left = int(round((w - 24) / 2)) if w >= 24 else -((24 - w) // 2)
    pad[24:24 + h, 24:24 + w] = img
    want = pad[24 + top:48 + top, 24 + left:48 + left][:, ::-1]
    want = ((want / 255.0 - mean) / std).astype(np.float32).transpose(2, 0, 1)
    check(plugin_out[k].dtype == np.float32 and np.array_equal(plugin_out[k], want),
          f"sample {k} ({h}x{w}): the crop plugin equals numpy on PIL's decode (max diff "
          f"{np.abs(plugin_out[k] - want).max()})")
# tar_split's work in a plugin, through the public shard I/O API (include/shardflow/shard_io.h) alone:
# tests/plugins/shard_read.c, built out of tree from the installed headers, splits shards with the public tar
# reader (the shard's keep list, sf_shard_keeps, honoured) or reads each shard's bytes with the public shard
# reader. References: Python's tarfile, the files' bytes, and tar_split's output of the same graph.
split_so = os.path.join(tmp, "shard_read.so")
subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", *cflags,
                os.path.join(source, "tests/plugins/shard_read.c"), "-o", split_so], check=True)
srng = np.random.default_rng(30)
split_shards = []
for s in range(2):
    members = [(f"d{s}/{i:03d}", {"txt": srng.integers(97, 123, int(srng.integers(0, 40)), dtype=np.uint8).tobytes(),
                                   "dat": srng.integers(0, 256, int(srng.integers(1, 3000)), dtype=np.uint8).tobytes()})
               for i in range(5)]
    split_shards.append(write_shard(os.path.join(tmp, f"split-{s}.tar"), members))


def tar_samples(path):
    """WebDataset's grouping of a tar's members by Python's tarfile: [(key, {field: bytes})] in order."""
    out = []
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            base = os.path.basename(m.name)
            key = m.name[:len(m.name) - len(base)] + base.split(".", 1)[0]
            if not out or out[-1][0] != key:
                out.append((key, {}))
            out[-1][1][base.split(".", 1)[1]] = tf.extractfile(m).read()
    return out


def split_run(name, splitter, urls, ragged, **source):
    out = os.path.join(tmp, name + "-out")
    path = write_graph(os.path.join(tmp, name + ".yaml"), [
        ("shard_source", dict(urls=urls, shuffle=False, **source)), splitter,
        ("batch", dict(batch_size=1, ragged=ragged)), ("device_sink", dict(npy_dir=out))], plugins=[split_so], epochs=1)
    run(["run", path, "--quiet", "--no-summary"], env=env)
    return [(keys[0], {f: v.tobytes() for f, v in batch_row(fields, 0).items()})
            for _, _, keys, fields in read_batches(out)]


want = tar_samples(split_shards[0]) + tar_samples(split_shards[1])
both = "::".join(split_shards)
got = split_run("split-public", ("split_public", {}), both, "dat")
check(got == want, f"a plugin's split through the public tar reader equals tarfile's members: "
                   f"{[k for k, _ in got]} {[k for k, _ in want]}")
check(split_run("split-builtin", ("tar_split", {}), both, "dat") == got, "and tar_split's output of the same graph")
plan = os.path.join(tmp, "split.plan")
with open(plan, "w") as f:
    f.write("0 1\n0 3\n1 0\n1 4\n")
got = split_run("split-plan", ("split_public", {}), both, "dat", plan=plan)
check(got == [want[1], want[3], want[5], want[9]],
      f"the plugin reads a resume plan's keep list through sf_shard_keeps: {[k for k, _ in got]}")
got = split_run("split-raw", ("split_public", dict(raw=True)), f"{split_shards[0]}::pipe:cat {split_shards[1]}",
                "bin,path", allow_pipe=True)
raw = [open(p, "rb").read() for p in split_shards]
check([k for k, _ in got] == ["0", "1"] and [f["bin"] for _, f in got] == raw,
      "the public shard reader hands a plugin each shard's bytes, a pipe: too (sf_shard_allow_pipe passed on)")
check([f["path"] for _, f in got] == [split_shards[0].encode(), b""],
      "sf_url_local_path: a path's own path, none for a pipe:")
check.done("plugins")
