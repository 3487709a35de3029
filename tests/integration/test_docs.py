"""docs/stages.md is generated from the options tables: fail when the two drift apart."""
import os
import subprocess
import sys

root = os.environ["SF_SOURCE_ROOT"]
generated = subprocess.run([os.environ["SHARDFLOW"], "help", "--markdown"], capture_output=True, text=True,
                           check=True).stdout
committed = open(os.path.join(root, "docs", "stages.md")).read()
if generated != committed:
    print("docs/stages.md is out of date: regenerate it with\n  shardflow help --markdown > docs/stages.md")
    sys.exit(1)
for stage in ("shard_source", "tar_split", "decode", "augment", "shuffle", "batch", "device_sink"):
    assert f"## {stage}\n" in committed, stage
print("docs: stages.md matches the options tables (7 stages)")
