#!/usr/bin/python3
"""check_results_links.py - every benchmark result a tracked Markdown file names exists.

Two forms are checked, in every `*.md` that git tracks:
- a path containing `bench/results/...` (a link, resolved from the file's directory, or
  plain text, from the repository root): the file or directory exists; a `*` in it must
  match something;
- a code span holding a run-relative path, `2026-11-29/prefetch-demo-moe/summary.txt`:
  `bench/results/` + it exists, or it is a member of `bench/results/archive/<date>.tar.xz`
  (the archive of that date keeps each file under its old path below bench/results/).
Placeholders (`<date>`, `$OUT`) are skipped. Prints what is missing; exit 1 if anything is.
"""
import fnmatch
import glob
import os
import re
import subprocess
import sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RES = "bench/results"
mds = subprocess.run(["git", "ls-files", "*.md"], capture_output=True, text=True,
                     check=True).stdout.split()
members = {}  # archive path -> its member names


def in_archive(rel):
    arc = f"{RES}/archive/{rel[:10]}.tar.xz"
    if not os.path.exists(arc):
        return False
    if arc not in members:
        members[arc] = subprocess.run(["tar", "-tJf", arc], capture_output=True, text=True,
                                      check=True).stdout.split("\n")
    pat = rel.rstrip("/")
    # a directory is there when some member lies below it
    return any(fnmatch.fnmatch(m.rstrip("/"), pat) or fnmatch.fnmatch(m, pat + "/*")
               for m in members[arc])


def exists(path):
    return bool(glob.glob(path)) if "*" in path else os.path.exists(path)


checked, missing = 0, []
for md in mds:
    text = open(md, encoding="utf-8").read()
    base = os.path.dirname(md)
    refs = []
    # markdown links: resolved from the file's directory
    for m in re.finditer(r"\]\(([^)\s]*bench/results[^)\s]*)\)", text):
        refs.append((m.group(1), os.path.normpath(os.path.join(base, m.group(1)))))
    # bench/results paths in plain text or code: from the repository root
    link_spans = [m.span(1) for m in re.finditer(r"\]\(([^)\s]*)\)", text)]
    for m in re.finditer(r"bench/results/[^\s`)'\"\]]*", text):
        if any(a <= m.start() < b for a, b in link_spans):
            continue
        p = m.group(0).rstrip(".,;:")
        refs.append((p, p))
    for shown, path in refs:
        if re.search(r"[<$]", shown) or path.rstrip("/") == RES:
            continue
        checked += 1
        if not exists(path):
            missing.append(f"{md}: {shown}")
    # run-relative paths in code spans: on disk or in the date's archive
    for m in re.finditer(r"`(\d{4}-\d\d-\d\d[^`/\s]*/[^`\s]*)`", text):
        rel = m.group(1)
        checked += 1
        if not exists(f"{RES}/{rel}") and not in_archive(rel):
            missing.append(f"{md}: `{rel}` (neither in {RES}/ nor in its archive)")

for x in missing:
    print("missing:", x)
print(f"{checked} references to benchmark results checked, {len(missing)} missing")
sys.exit(1 if missing else 0)
