"""docs/stages.md and docs/cli.md are generated from the options tables: fail when they drift apart. The
hand-written docs (README.md, docs/*.md, plugins/README.md) are checked too: every relative link names a file
that exists and every #anchor a heading of its target (GitHub's rule for heading ids), every docs page is
reachable from README.md or the guide's index (docs/README.md), and README's first commands are the main job
and the test runner."""
import glob
import os
import re
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


def prose(text):
    """text without fenced code blocks (links and headings in code are not markdown's)."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.M | re.S)


def anchors(path):
    """The ids GitHub gives path's headings: lower case, punctuation but - and _ dropped, spaces to -, a
    repeated id suffixed -1, -2..."""
    seen, ids = {}, set()
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", prose(open(path).read()), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


pages = [os.path.join(root, "README.md"), os.path.join(root, "plugins", "README.md")] + \
    sorted(glob.glob(os.path.join(root, "docs", "*.md")))
problems, linked = [], set()
generated = {os.path.join(root, "docs", n) for n in ("stages.md", "cli.md")}  # help text, checked above
for page in pages:
    if page in generated:
        continue
    text = re.sub(r"`[^`\n]*`", "", prose(open(page).read()))  # inline code is not a link either
    for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        name = os.path.relpath(page, root)
        if not os.path.exists(where):
            problems.append(f"{name}: link ({target}): {os.path.relpath(where, root)} does not exist")
            continue
        linked.add(where)
        if anchor and where.endswith(".md") and anchor not in anchors(where):
            problems.append(f"{name}: link ({target}): no heading with id '{anchor}' in {os.path.relpath(where, root)}"
                            f" (ids: {', '.join(sorted(anchors(where)))})")
# Paths of the tree named in the text (`bench/cifar.sh`, engine/codec/resize.c) exist: files that move take their
# mentions along. A built program is named by its source (bench/delay_proxy.c); an example name is allowed.
examples = {"graphs/my-graph.yaml"}
for page in pages:
    for m in re.finditer(r"(?<![\w./-])((?:bench|tools|graphs|examples|engine|cli|stages|python|plugins|tests|include|"
                         r"docs)/[\w./-]*[\w/])", open(page).read()):
        path = m.group(1)
        if path not in examples and not any(os.path.exists(os.path.join(root, path + ext)) for ext in ("", ".c")):
            problems.append(f"{os.path.relpath(page, root)}: names {path}, which is not in the tree")
for page in pages[2:]:
    if page not in linked:
        problems.append(f"{os.path.relpath(page, root)} is linked from no page: add it to docs/README.md's table")
# The README opens with the two commands that set a fresh Debian machine up; they must exist and run.
readme = open(os.path.join(root, "README.md")).read()
first = re.search(r"^```sh\n(.*?)^```", readme, re.M | re.S).group(1).splitlines()
if [line.split()[0] for line in first] != ["tools/main-job.sh", "tools/run-tests.sh"]:
    problems.append(f"README.md's first commands are {first}, not tools/main-job.sh and tools/run-tests.sh")
for script in ("tools/main-job.sh", "tools/run-tests.sh"):
    if not os.access(os.path.join(root, script), os.X_OK):
        problems.append(f"{script}, README's first command, is not an executable file")
# The graph settings are one table (engine/graph/graph.c): `shardflow help settings` prints it, docs/stages.md
# (generated) holds it, and the hand-written table of docs/graph-files.md names the same settings, in the same
# order, with the same defaults. `shardflow help` names every one of them.
shardflow = os.environ["SHARDFLOW"]
env = dict(os.environ, SHARDFLOW_PLUGIN_PATH="")
listing = subprocess.run([shardflow, "help", "settings"], capture_output=True, text=True, env=env)
if listing.returncode != 0:
    problems.append(f"shardflow help settings failed ({listing.returncode}): {listing.stderr.strip()}")
section = re.search(r"^## Graph settings\n(.*?)(?=^## |\Z)", open(os.path.join(root, "docs", "stages.md")).read(),
                    re.M | re.S)
generated = [] if not section else re.findall(r"^\| `(\w+)` \| .*? \| `([^`]*)` \|", section.group(1), re.M)
if not generated:
    problems.append("docs/stages.md has no `## Graph settings` table (shardflow help --markdown writes it)")
written = re.findall(r"^\| `(\w+)` \| [^|]* \| ([^|]*?) \|", open(os.path.join(root, "docs", "graph-files.md")).read(),
                     re.M)
written = [(key, default.strip("`").replace("none", '""')) for key, default in written
           if key not in ("stages", "edges", "groups", "plugins")]
if generated and written != generated:
    problems.append(f"docs/graph-files.md's settings (key, default) {written} differ from the settings table's "
                    f"{generated} (shardflow help settings)")
for key, default in generated:
    if listing.returncode == 0 and not re.search(rf"^  {key} ", listing.stdout, re.M):
        problems.append(f"shardflow help settings does not list {key}")
overview = subprocess.run([shardflow, "help"], capture_output=True, text=True, check=True, env=env).stdout
missing = [key for key, _ in generated if not re.search(rf"\b{key}\b", overview)]
if missing:
    problems.append(f"shardflow help's paragraph of graph settings misses {', '.join(missing)}")
# The tree cites only what it holds: a Markdown file name that no file of the tree has, or a numbered section of a
# style or design document, points a reader at nothing.
names = set()
for dirpath, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
    names.update(files)
for dirpath, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
    for f in files:
        if not f.endswith((".c", ".h", ".cc", ".in", ".py", ".md", ".build", ".txt", ".sh", ".yaml", ".toml", ".proto")):
            continue
        path = os.path.join(dirpath, f)
        for n, line in enumerate(open(path, errors="replace"), 1):
            for m in re.finditer(r"\b([A-Z][A-Z_]*\.md)\b|\b((?:STYLE|DESIGN)(?: §| section)? ?\d+)", line):
                if m.group(2) or m.group(1) not in names:
                    problems.append(f"{os.path.relpath(path, root)}:{n}: cites {m.group(0)}, which is not in the tree")
for problem in problems:
    print(problem)
if problems:
    sys.exit(1)
print(f"docs: {len(pages)} pages: every relative link and anchor resolves, every path named exists, every page is "
      "linked, README's first commands are the main job and the tests")
