#!/usr/bin/env python3
"""Lists the engine layers' symbol references that point upward (a layer calling one above it).

Usage: tools/check-layers.py BUILD_DIR. Reads the layer archives with `nm`; exits 1 when a
reference goes the wrong way. Includes are checked by the build itself (include paths per layer);
this checks what a prototype written by hand could hide.
"""
import collections
import glob
import os
import subprocess
import sys

LAYERS = ["core", "store", "io", "codec", "graph", "exec", "group", "stages"]
# The one reference allowed upward: the table of built-in stages, data the stages layer provides to the
# graph layer's registry (engine/graph/registry.h says why).
ALLOWED = {"sf_builtin_stages"}


def symbols(archive):
    defined, used = set(), collections.defaultdict(set)
    out = subprocess.run(["nm", "-A", archive], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        where, _, rest = line.rpartition(": ")
        parts = rest.split()
        obj = os.path.basename(where.split(":")[-1])
        if len(parts) == 3 and parts[1] in "TDBR":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used[obj].add(parts[1])
    return defined, used


build = sys.argv[1]
libs = {layer: glob.glob(os.path.join(build, "engine", layer, f"libsf_{layer}.a")) for layer in LAYERS[:-1]}
libs["stages"] = [os.path.join(build, "libshardflow_internal.a")]
defined, used = {}, {}
for layer, paths in libs.items():
    if not paths:
        sys.exit(f"check-layers: no archive for layer {layer} under {build}")
    d, u = symbols(paths[0])
    defined[layer], used[layer] = d, u
owner = {}
for layer in LAYERS:
    for sym in defined[layer]:
        owner.setdefault(sym, layer)
wrong = []
for i, layer in enumerate(LAYERS[:-1]):
    for obj, syms in sorted(used[layer].items()):
        for sym in sorted(syms):
            up = owner.get(sym)
            if up and LAYERS.index(up) > i and sym not in ALLOWED:
                wrong.append(f"{layer}/{obj} uses {sym} from {up}")
print("\n".join(wrong) or "no reference goes upward")
sys.exit(1 if wrong else 0)
