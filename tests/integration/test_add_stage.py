"""A new built-in stage is one file in stages/ plus one line in meson.build, nothing else.

Copies the source tree, adds stages/keep_every.c (passes on every Nth sample of a shard) and its name to
meson.build's `builtin_stages` list, builds the CLI, and checks that `shardflow help` lists the stage with its
option and that a graph using it delivers exactly the samples tarfile says it should.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from sfutil import Checks, make_dataset, read_batches, tar_keys, write_graph  # noqa: E402

check = Checks()
if os.environ.get("SF_SANITIZE", "none") != "none":
    print("add_stage: builds a whole tree of its own; run in the normal pass only")
    sys.exit(77)

SRC = os.environ.get("SF_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
STAGE = r'''/* keep_every: passes on every Nth sample of a shard (added by tests/integration/test_add_stage.py). */
#include <stddef.h>

#include "shardflow/stage.h"

typedef struct keep_every {
  int64_t every;
} keep_every;

static const sf_option options[] = {
    {"every", SF_OPT_COUNT, offsetof(keep_every, every), "2", 1, 1000,
     "keep the samples whose index in their shard is a multiple of this", NULL},
    {NULL},
};

static int step(sf_node *node) {
  keep_every *k = sf_node_priv(node);
  sf_item item;
  int r = sf_node_pop(node, &item);
  if (r < 0) return r;
  if (item.kind == SF_ITEM_SAMPLE && item.u.sample->index % (uint64_t)k->every != 0) {
    sf_item_clear(&item);
    return 0;
  }
  sf_node_push(node, &item);
  return 0;
}

const sf_stage_def sf_stage_keep_every = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "keep_every",
    .summary = "passes on every Nth sample of a shard",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(keep_every),
    .options = options,
    .step = step,
};
'''

tmp = tempfile.mkdtemp(prefix="sf_add_stage_")
tree = os.path.join(tmp, "src")
shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("build*", "data", ".git", "__pycache__"))
with open(os.path.join(tree, "stages", "keep_every.c"), "w") as f:
    f.write(STAGE)
meson_build = os.path.join(tree, "meson.build")
text = open(meson_build).read()
anchor = "  'device_sink',\n"
check(text.count(anchor) == 1, "meson.build's builtin_stages list ends with device_sink")
with open(meson_build, "w") as f:
    f.write(text.replace(anchor, anchor + "  'keep_every',\n"))
build = os.path.join(tmp, "build")
setup = subprocess.run(["meson", "setup", build, tree, "-Dtests=false", "-Dexamples=false", "-Dfuzzing=disabled"],
                       capture_output=True, text=True)
check(setup.returncode == 0, f"meson setup: {setup.stdout[-2000:]}{setup.stderr[-2000:]}")
ninja = subprocess.run(["ninja", "-C", build, "shardflow"], capture_output=True, text=True)
check(ninja.returncode == 0, f"the tree with one more stage builds: {ninja.stdout[-3000:]}")
cli = os.path.join(build, "shardflow")

listing = subprocess.run([cli, "help"], capture_output=True, text=True)
check(listing.returncode == 0 and "keep_every" in listing.stdout, f"shardflow help lists keep_every: {listing.stdout}")
own = subprocess.run([cli, "help", "keep_every"], capture_output=True, text=True)
check(own.returncode == 0 and "every" in own.stdout and "multiple of this" in own.stdout,
      f"shardflow help keep_every shows its option: {own.stdout}{own.stderr}")

urls, truth = make_dataset(tmp, shards=2, per_shard=9)
out = os.path.join(tmp, "out")
graph = write_graph(os.path.join(tmp, "g.yaml"), [
    ("shard_source", dict(urls=urls, shuffle=False)),
    ("tar_split", {}),
    ("keep_every", dict(every=3)),
    ("decode", {}),
    ("batch", dict(batch_size=2, partial=True)),
    ("device_sink", dict(npy_dir=out)),
], seed=0, epochs=1)
p = subprocess.run([cli, "run", graph, "--quiet", "--no-summary"], capture_output=True, text=True)
check(p.returncode == 0, f"a graph with keep_every runs: {p.stderr}")
got = [k for _, _, keys, _ in read_batches(out) for k in keys]
want = []
for shard in sorted(os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".tar")):
    want += [k for i, k in enumerate(tar_keys(shard)) if i % 3 == 0]
check(got == want, f"every third sample of each shard, in order: {got} (tarfile: {want})")
shutil.rmtree(tmp, ignore_errors=True)
check.done("add_stage")
