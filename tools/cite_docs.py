#!/usr/bin/env python
"""Rewrites citations of the design notes and specs to their files in this repository:

    design.md            -> docs/design.md
    ops.md               -> docs/specs/ops.md
    linear_attention.md  -> docs/specs/linear_attention.md
    bench/NOTES.md       -> bench/notes/ARCHIVE.md   (in src/ and bench/*.py: the measurements
                                                      they cite are the lab notebook's history)

Section numbers are kept (the docs keep the numbering the code cites), so the rewrite is
mechanical and can be run again on files changed later: a citation that already has its folder
is left alone.

    python tools/cite_docs.py           # rewrite every tracked text file
    python tools/cite_docs.py --check   # list bare citations, exit 1 if any
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"design": "docs/design.md", "ops": "docs/specs/ops.md",
           "linear_attention": "docs/specs/linear_attention.md"}
# A bare name: not preceded by a path character, so docs/specs/ops.md is left alone.
BARE = re.compile(r"(?<![\w/.\-])(design|ops|linear_attention)\.md\b")
SKIP = ("bench/results/", "tools/cite_docs.py")
# bench/NOTES.md keeps what is open now; code and family READMEs cite measurements of the past.
NOTES = re.compile(r"\bbench/NOTES\.md\b")
HISTORY_CITERS = ("src/", "bench/")


def tracked_text_files(pattern: str | None = None) -> list[Path]:
    """Tracked text files, only those containing `pattern` (an extended regex, through git grep)
    when given."""
    cmd = ["git", "-C", str(ROOT), "ls-files"] if pattern is None else \
        ["git", "-C", str(ROOT), "grep", "-lIE", pattern]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode not in (0, 1):
        raise RuntimeError(run.stderr)
    out = run.stdout.split()
    files = []
    for f in out:
        p = ROOT / f
        if f.startswith(SKIP) or not p.is_file():
            continue
        try:
            p.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        files.append(p)
    return files


def main(argv: list[str]) -> int:
    check = "--check" in argv
    bare = 0
    for p in tracked_text_files(r"(design|ops|linear_attention)\.md|bench/NOTES\.md"):
        text = p.read_text()
        rel = p.relative_to(ROOT).as_posix()
        notes = rel.startswith(HISTORY_CITERS) and not rel.startswith("bench/notes/")
        new = BARE.sub(lambda m: TARGETS[m.group(1)], text)
        if notes:
            new = NOTES.sub("bench/notes/ARCHIVE.md", new)
        if new == text:
            continue
        n = len(BARE.findall(text)) + (len(NOTES.findall(text)) if notes else 0)
        bare += n
        if check:
            for i, line in enumerate(text.splitlines(), 1):
                if BARE.search(line) or (notes and NOTES.search(line)):
                    print(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
        else:
            p.write_text(new)
            print(f"{p.relative_to(ROOT)}: {n} citation(s)")
    if check and bare:
        print(f"cite_docs.py: {bare} citation(s) without their folder; run python tools/cite_docs.py",
              file=sys.stderr)
    return 1 if check and bare else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
