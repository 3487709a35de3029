"""The pip-installed package: a venv (Debian's python, --system-site-packages for numpy) gets the tree
with `pip install --no-build-isolation` (pyproject.toml, meson-python); then, from outside the tree
with no SHARDFLOW_LIB, PYTHONPATH or SHARDFLOW_PLUGIN_PATH, `import shardflow` runs a graph (one
naming a shipped plugin) and the installed `shardflow` CLI runs it too."""
import os
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
p = subprocess.run([cli, "run", graph], capture_output=True, text=True, cwd=tmp, timeout=120,
                   env=dict(env, SHARDFLOW_PLUGIN_PATH=plugins))
check(p.returncode == 0 and f"Replica Train Samples={len(truth)}" in p.stdout,
      f"the installed CLI runs the graph:\n{p.stdout}\n{p.stderr}")
check.done("install")
