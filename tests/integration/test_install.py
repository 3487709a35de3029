"""The pip-installed package: a venv (Debian's python, --system-site-packages for numpy) gets the tree
with `pip install --no-build-isolation` (pyproject.toml, meson-python); then, from outside the tree
with no SHARDFLOW_LIB, PYTHONPATH or SHARDFLOW_PLUGIN_PATH, `import shardflow` runs a graph (one
naming a shipped plugin) and the installed `shardflow` CLI runs it too. A plugin author needs nothing else:
`shardflow config --cflags` and the package's shardflow.pc give the package's headers (and no other -I), the
example plugin copied out of the tree builds with them alone and loads by name and by path, from the CLI and
from Python; the CLI finds the package's own plugins (run, help) without SHARDFLOW_PLUGIN_PATH."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, write_graph  # noqa: E402

check = Checks()
tmp = tempfile.mkdtemp(prefix="sf-install-")
venv = os.path.join(tmp, "venv")
env = {k: v for k, v in os.environ.items()
       if k not in ("SHARDFLOW_LIB", "SHARDFLOW_PLUGIN_PATH", "PYTHONPATH", "SHARDFLOW", "VIRTUAL_ENV")}
subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True, env=env)
python, cli = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "shardflow")
# The wheel's meson build dir lives in the build tree: a second run of this test is incremental.
builddir = os.path.join(os.environ["SF_BUILD_ROOT"], "python-wheel")
p = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--quiet",
                    f"--config-settings=builddir={builddir}", os.environ["SF_SOURCE_ROOT"]],
                   capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
check(p.returncode == 0, f"pip install of the tree:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")

urls, truth = make_dataset(tmp, shards=2, per_shard=20)
graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=urls)),
    ("tar_split", {}),
    ("decode", {}),
    ("scale", dict(field="ppm", factor=0.5)),  # the example plugin's stage (plugins: [example])
    ("batch", dict(batch_size=8)),
    ("device_sink", {}),
], plugins=["example"], seed=1, epochs=1)
env["SF_TEST_GRAPH"] = graph

# Python: the installed package, its own library and plugins; batches carry the dataset's labels.
program = """
import os, shardflow, numpy
site = os.path.dirname(shardflow.__file__)
print("package", site)
print("library", shardflow.library._name)
labels = []
for b in shardflow.Pipeline(os.environ["SF_TEST_GRAPH"], output="dict"):
    labels += [int(v) for v in b["cls"]]
print("labels", sum(labels), len(labels))
"""
p = subprocess.run([python, "-c", program], capture_output=True, text=True, env=env, cwd=tmp, timeout=120)
check(p.returncode == 0, f"import shardflow from {tmp}:\n{p.stdout}\n{p.stderr}")
lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
site = lines["package"]
check(site.startswith(venv) and site.endswith("site-packages/shardflow"), f"the venv's package: {site}")
check(lines["library"] == os.path.join(site, "libshardflow.so"), f"its own library: {lines['library']}")
want = f"{sum(label for _, label in truth.values())} {len(truth)}"
check(lines["labels"] == want, f"every sample's label once: {lines['labels']} (want {want})")

# The CLI on the venv's PATH runs the same graph (plugins from the package's directory, as Python finds them).
plugins = os.path.join(site, "plugins")
check(sorted(os.listdir(plugins))[:2] == ["audio.so", "example.so"], f"plugins installed: {os.listdir(plugins)}")


debug_runs = 0


def debug_env(plugin_path, **extra):
    """env with glibc's loader log on (LD_DEBUG=files into its own files: glibc's record, not shardflow's) and
    SHARDFLOW_PLUGIN_PATH set only when plugin_path is given; returns (env, the log files' prefix)."""
    global debug_runs
    debug_runs += 1
    prefix = os.path.join(tmp, f"ld-debug-{debug_runs}")
    e = dict(env, LD_DEBUG="files", LD_DEBUG_OUTPUT=prefix, **extra)
    if plugin_path is not None:
        e["SHARDFLOW_PLUGIN_PATH"] = plugin_path
    return e, prefix


def loaded(prefix):
    """The example.so files the dynamic loader opened, from the LD_DEBUG_OUTPUT files (one per process)."""
    text = "".join(open(os.path.join(tmp, f)).read() for f in os.listdir(tmp)
                   if f.startswith(os.path.basename(prefix) + "."))
    return sorted({os.path.realpath(f) for f in re.findall(r"file=(\S+/example\.so) ", text)})


def run_cli(graph_file, plugin_path=None):
    """Runs graph_file with the venv's CLI (SHARDFLOW_PLUGIN_PATH unset unless given); returns the .so it loaded."""
    e, prefix = debug_env(plugin_path)
    p = subprocess.run([cli, "run", graph_file], capture_output=True, text=True, cwd=tmp, timeout=120, env=e)
    check(p.returncode == 0 and f"Replica Train Samples={len(truth)}" in p.stdout,
          f"the installed CLI runs {graph_file} (SHARDFLOW_PLUGIN_PATH={plugin_path}):\n{p.stdout}\n{p.stderr}")
    return loaded(prefix)


def run_python(graph_file, plugin_path=None):
    """Runs graph_file through the venv's `import shardflow`; returns the .so it loaded."""
    e, prefix = debug_env(plugin_path, SF_TEST_GRAPH=graph_file)
    p = subprocess.run([python, "-c", program], capture_output=True, text=True, env=e, cwd=tmp, timeout=120)
    labels = dict(line.split(" ", 1) for line in p.stdout.splitlines()).get("labels")
    check(p.returncode == 0 and labels == want, f"Python runs {graph_file}: labels {labels} (want {want})\n"
          f"{p.stdout}\n{p.stderr}")
    return loaded(prefix)


# The CLI finds the package's own plugins (the directory beside its libshardflow), as Python does: no
# SHARDFLOW_PLUGIN_PATH needed to run `plugins: [example]`, and `help` lists and describes their stages.
shipped = [os.path.realpath(os.path.join(plugins, "example.so"))]
check(run_cli(graph) == shipped, f"the venv's CLI loads {shipped} by name without SHARDFLOW_PLUGIN_PATH")
p = subprocess.run([cli, "help"], capture_output=True, text=True, cwd=tmp, timeout=60, env=env)
check(p.returncode == 0 and re.search(r"^  scale +.*\(plugin example\)$", p.stdout, re.M),
      f"help lists the package's plugins (example's stage):\n{p.stdout}\n{p.stderr}")
p = subprocess.run([cli, "help", "scale"], capture_output=True, text=True, cwd=tmp, timeout=60, env=env)
check(p.returncode == 0 and "from plugin example" in p.stdout and "factor" in p.stdout,
      f"help scale names its plugin and shows its options:\n{p.stdout}\n{p.stderr}")

# `shardflow config` answers as python3-config does, for this package: its headers, library, plugins, .pc file.
def config(*args):
    p = subprocess.run([cli, "config", *args], capture_output=True, text=True, cwd=tmp, timeout=60, env=env)
    check(p.returncode == 0, f"shardflow config {' '.join(args)}:\n{p.stdout}\n{p.stderr}")
    return p.stdout.split()


include = os.path.realpath(os.path.join(site, "include"))
cflags = config("--cflags")
check(len(cflags) == 1 and cflags[0].startswith("-I") and os.path.realpath(cflags[0][2:]) == include
      and os.path.isfile(os.path.join(include, "shardflow", "stage.h")),
      f"config --cflags is the package's include directory {include}: {cflags}")
libs = config("--libs")
check(len(libs) == 2 and os.path.realpath(libs[0][2:]) == os.path.realpath(site) and libs[1] == "-lshardflow",
      f"config --libs links the package's library: {libs}")
check([os.path.realpath(d) for d in config("--plugin-dir")] == [os.path.realpath(plugins)],
      "config --plugin-dir is the package's plugin directory")
pc_dir = config("--pkgconfigdir")
pc = subprocess.run(["pkg-config", "--cflags", "--libs", "shardflow"], capture_output=True, text=True, timeout=60,
                    env=dict(env, PKG_CONFIG_PATH=pc_dir[0] if pc_dir else ""))
words = pc.stdout.split()
check(pc.returncode == 0 and len(words) == 3 and os.path.realpath(words[0][2:]) == include
      and os.path.realpath(words[1][2:]) == os.path.realpath(site) and words[2] == "-lshardflow",
      f"pkg-config --cflags --libs shardflow: the package's -I and -L only (no dependency's -I):\n{pc.stdout}{pc.stderr}")

program_include = "import shardflow; print(shardflow.get_include()); print(shardflow.get_plugin_dir())"
p = subprocess.run([python, "-c", program_include], capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
got = p.stdout.split()
check(p.returncode == 0 and len(got) == 2 and os.path.realpath(got[0]) == include
      and os.path.realpath(got[1]) == os.path.realpath(plugins),
      f"shardflow.get_include() and get_plugin_dir(): {p.stdout}{p.stderr}")

# A plugin author's build: the example copied out of the tree, compiled with `shardflow config --cflags` alone.
oot = os.path.join(tmp, "my-plugin")
os.makedirs(oot)
shutil.copy(os.path.join(os.environ["SF_SOURCE_ROOT"], "plugins", "example", "scale.c"), oot)
p = subprocess.run(f"cc -shared -fPIC -fvisibility=hidden $('{cli}' config --cflags) scale.c -o example.so -lm",
                   shell=True, capture_output=True, text=True, cwd=oot, env=env, timeout=120)
check(p.returncode == 0, f"the copied example builds with `shardflow config --cflags`:\n{p.stdout}{p.stderr}")
mine = [os.path.realpath(os.path.join(oot, "example.so"))]
by_path = write_graph(os.path.join(tmp, "by-path.yaml"), [
    ("shard_source", dict(urls=urls)), ("tar_split", {}), ("decode", {}), ("scale", dict(factor=0.5)),
    ("batch", dict(batch_size=8)), ("device_sink", {})], plugins=[mine[0]], seed=1, epochs=1)
check(run_cli(graph, plugin_path=oot) == mine, f"the CLI loads {mine} by name (SHARDFLOW_PLUGIN_PATH)")
check(run_cli(by_path) == mine, f"the CLI loads {mine} by path")
check(run_python(graph, plugin_path=oot) == mine, f"Python loads {mine} by name (SHARDFLOW_PLUGIN_PATH)")
check(run_python(by_path) == mine, f"Python loads {mine} by path")
check(run_python(graph) == shipped, f"Python loads {shipped} by name without SHARDFLOW_PLUGIN_PATH")
check.done("install")
