"""docs/stages.md and docs/cli.md are generated from the options tables: fail when they drift apart."""
import os
import subprocess
import sys

root = os.environ["SF_SOURCE_ROOT"]


def drift(what, name):
    """The generated text differs from the committed file: the command that regenerates it, else None."""
    args = ["help", "--markdown"] + ([what] if what else [])
    # docs/stages.md documents the built-in stages: no plugins from the caller's SHARDFLOW_PLUGIN_PATH.
    generated = subprocess.run([os.environ["SHARDFLOW"], *args], capture_output=True, text=True, check=True,
                               env=dict(os.environ, SHARDFLOW_PLUGIN_PATH="")).stdout
    committed = open(os.path.join(root, "docs", name)).read()
    if generated != committed:
        return f"docs/{name} is out of date: regenerate it with\n  shardflow {' '.join(args)} > docs/{name}"
    return None


stages = drift(None, "stages.md")
commands = drift("commands", "cli.md")
for problem in (stages, commands):
    if problem:
        print(problem)
if stages or commands:
    sys.exit(1)
committed = open(os.path.join(root, "docs", "stages.md")).read()
for stage in ("shard_source", "tar_split", "decode", "augment", "shuffle", "batch", "device_sink", "mix"):
    assert f"## {stage}\n" in committed, stage
committed = open(os.path.join(root, "docs", "cli.md")).read()
commands = ("run", "ls", "write", "cp", "worker", "keygen", "dot", "help")
for command in commands:
    assert f"## shardflow {command}\n" in committed, command
print(f"docs: stages.md matches the options tables (8 stages), cli.md the commands' tables ({len(commands)})")
