#!/usr/bin/env python3
"""Lists the engine layers' symbol references that point upward (a layer calling one above it), and the
circles between the tree's own files.

Usage: tools/check-layers.py BUILD_DIR. Reads the layer archives with `nm`; exits 1 when a
reference goes the wrong way. Includes are checked by the build itself (include paths per layer);
this checks what a prototype written by hand could hide.

A file under stages/ that includes an engine header is refused.

Circles are refused too (the edges ALLOWED_EDGES names, with why, left out): files A and B are in one when A depends on B and B, through any
chain, on A. A file depends on a header it includes, and a .c file on the .c file that defines a
symbol it uses (functions and data, read with `nm` from the objects of the engine's layers, the
stages and the CLI). Each circle is printed with the edges that make it.
"""
import collections
import glob
import os
import re
import subprocess
import sys

LAYERS = ["core", "store", "io", "codec", "graph", "exec", "group", "stages"]
# The one reference allowed upward: the table of built-in stages, data the stages layer provides to the
# graph layer's registry (engine/graph/registry.h says why).
ALLOWED = {"sf_builtin_stages"}
# The uses that close a circle and stay, and why: the circles are looked for without them. A new circle
# fails the check: make the lower file not use the upper one (move what both need below them, or hand the
# lower one what it needs as a value or a callback).
ALLOWED_EDGES = {
    # The command table lists `help`, and `help` prints the table.
    ("cli/main.c", "cli/help.c"): "the command table names sf_cli_help",
}

# A built-in stage is written against include/shardflow/ only, as a plugin is: a stage file that includes an
# engine header (engine/LAYER/*.h) fails the check; a stage that needs the engine needs a public API instead.
# stages/registry.c.in is not a stage but the engine's table of them: it names the group layer's stages.
STAGE_TABLE = "stages/registry.c.in"


def stage_includes(root):
    """The engine headers files under stages/ include: ['FILE includes the engine header H: ...', ...]."""
    engine_headers = set()
    for dirpath, _, files in os.walk(os.path.join(root, "engine")):
        engine_headers.update(f for f in files if f.endswith(".h"))
    wrong = []
    for name in sorted(os.listdir(os.path.join(root, "stages"))):
        rel = "stages/" + name
        if rel == STAGE_TABLE or not name.endswith((".c", ".h", ".in")):
            continue
        text = open(os.path.join(root, rel)).read()
        included = set(re.findall(r'^\s*#\s*include\s+"([^"/]+)"', text, re.M)) & engine_headers
        wrong += [f"{rel} includes the engine header {h}: a stage uses include/shardflow/ only (make what it "
                  f"needs public, or keep it in the engine)" for h in sorted(included)]
    return wrong


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


def own_sources(root):
    """The tree's C sources and headers (relative paths): engine, stages, cli, plugins, include."""
    found = []
    for top in ("engine", "stages", "cli", "plugins", "include"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            found += [os.path.relpath(os.path.join(dirpath, f), root) for f in files if f.endswith((".c", ".h"))]
    return sorted(found)


def include_edges(root, sources):
    """{(file, header): {'includes'}} from the quoted #includes that name one of the tree's headers."""
    headers = [p for p in sources if p.endswith(".h")]
    by_name = collections.defaultdict(list)
    for h in headers:
        if not h.startswith("include/"):
            by_name[os.path.basename(h)].append(h)
    edges = {}
    for src in sources:
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', open(os.path.join(root, src)).read(), re.M):
            same_dir = os.path.normpath(os.path.join(os.path.dirname(src), name))
            if same_dir in headers:
                target = same_dir
            elif name in headers or "include/" + name in headers:
                target = name if name in headers else "include/" + name
            elif len(by_name.get(name, [])) == 1:
                target = by_name[name][0]
            else:
                continue  # generated (wire.pb-c.h, sf_config.h) or not the tree's
            edges.setdefault((src, target), set()).add("includes")
    return edges


def object_sources(build, root):
    """{object file: its source (relative)} for the engine's layers, the stages and the CLI: meson names an
    object after its source's path below the target's directory, with / as _."""
    found = {}
    targets = glob.glob(os.path.join(build, "engine", "*", "libsf_*.a.p")) + \
        [os.path.join(build, "libshardflow_internal.a.p"), os.path.join(build, "shardflow.p")]
    for target in targets:
        src_dir = os.path.join(root, os.path.relpath(os.path.dirname(target), build))
        flat = {}
        for dirpath, _, files in os.walk(src_dir):
            for f in files:
                if f.endswith(".c"):
                    path = os.path.join(dirpath, f)
                    flat[os.path.relpath(path, src_dir).replace("/", "_")] = os.path.relpath(path, root)
        for obj in glob.glob(os.path.join(target, "*.o")):
            src = flat.get(os.path.basename(obj)[:-2])
            if src:
                found[obj] = src
    return found


def call_edges(build, root):
    """{(file, file): {'uses f, g'}}: a .c file's object uses symbols another's defines."""
    objects = object_sources(build, root)
    defined, used = {}, collections.defaultdict(set)
    for obj, src in objects.items():
        out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRC":
                defined.setdefault(parts[2], src)
            elif len(parts) == 2 and parts[0] == "U":
                used[src].add(parts[1])
    edges = {}
    for mod, syms in used.items():
        for sym in syms:
            to = defined.get(sym)
            if to and to != mod:
                edges.setdefault((mod, to), set()).add(sym)
    return {k: {"uses " + ", ".join(sorted(v))} for k, v in edges.items()}


def circles(edges):
    """The strongly connected components of more than one file (Tarjan's algorithm), each sorted."""
    graph = collections.defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def print_circles(build):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    edges = include_edges(root, own_sources(root))
    for key, why in call_edges(build, root).items():
        edges.setdefault(key, set()).update(why)
    for (a, b), why in sorted(ALLOWED_EDGES.items()):
        if (a, b) in edges:
            print(f"allowed back edge: {a} -> {b}: {why} ({'; '.join(sorted(edges[(a, b)]))})")
    found = circles({k: v for k, v in edges.items() if k not in ALLOWED_EDGES})
    for component in found:
        print("circle: " + " <-> ".join(component))
        for a in component:
            for b in component:
                if (a, b) in edges:
                    print(f"  {a} -> {b}: {'; '.join(sorted(edges[(a, b)]))}")
    if not found:
        print("no other circle between the tree's files (includes and symbol uses)")
    return found


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
wrong_circles = print_circles(build)
wrong_includes = stage_includes(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
print("\n".join(wrong_includes) or "no stage includes an engine header")
sys.exit(1 if wrong or wrong_circles or wrong_includes else 0)
