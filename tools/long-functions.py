#!/usr/bin/env python3
"""Lists the C functions longer than a limit (80 lines unless given) in engine/ and stages/, longest first.

Usage: tools/long-functions.py [--limit N] [DIR...]   (DIRs relative to the source root; default engine stages)

A list to work from, not a gate: it always exits 0. A function's length counts its lines from the one
with its name to its closing brace. Tests and generated code (the build directory's) are not in these
directories. The scanner is a small one of its own (comments, strings and preprocessor lines blanked,
braces counted at file level), so it needs nothing but Python.
"""
import argparse
import os
import re

HEADER = re.compile(r"([A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:__attribute__\s*\(\(.*\)\)\s*)?$", re.S)


def blank(text):
    """text with comments, string and character literals and preprocessor lines replaced by spaces
    (newlines kept, so that offsets keep their line numbers)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and text[i:].lstrip(" \t").startswith("#")):
            j = i
            while j < n:  # to the end of the directive, continuation lines included
                k = text.find("\n", j)
                k = n if k < 0 else k
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                j = k
                break
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            out.append(c)
            line_start = c == "\n" or (line_start and c in " \t")
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        line_start = False
        i = j
    return "".join(out)


def functions(path):
    """(name, first line, line count) of each function defined in the C file at path."""
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    found, depth, start, head_from = [], 0, None, 0
    for i, c in enumerate(text):
        if c == "{":
            if depth == 0:
                head = text[head_from:i]
                m = HEADER.search(head)
                if m and "=" not in head and not re.search(r"\b(struct|union|enum)\s+\w*\s*$", head):
                    start = (m.group(1), text.count("\n", 0, head_from + m.start(1)) + 1)
                else:
                    start = None
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if start:
                    end = text.count("\n", 0, i) + 1
                    found.append((start[0], start[1], end - start[1] + 1))
                start, head_from = None, i + 1
        elif c == ";" and depth == 0:
            head_from = i + 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=80, help="list functions longer than this many lines")
    parser.add_argument("dirs", nargs="*", default=["engine", "stages"])
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for d in args.dirs:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if f.endswith(".c"):
                    path = os.path.join(dirpath, f)
                    rows += [(n, os.path.relpath(path, root), line, name) for name, line, n in functions(path)]
    long = sorted((r for r in rows if r[0] > args.limit), key=lambda r: (-r[0], r[1], r[2]))
    for n, path, line, name in long:
        print(f"{n:5d}  {path}:{line}  {name}")
    print(f"{len(long)} of {len(rows)} functions in {', '.join(args.dirs)} are over {args.limit} lines")


if __name__ == "__main__":
    main()
