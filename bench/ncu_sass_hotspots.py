#!/usr/bin/env python
"""Where a kernel's warps stall, from Nsight Compute's SASS source page: the share of warp-stall
samples per opcode and per stall reason, then the hottest blocks of consecutive instructions (with
their opcode mix, main stall reasons, and how often the block's first instruction ran, which tells
loops and phases apart). Build with -lineinfo, profile with the SourceCounters section, then

    ncu -i prof.ncu-rep -k regex:NAME --page source --csv --print-source sass > sass.csv
    python bench/ncu_sass_hotspots.py sass.csv [BLOCK=40] [TOP=8]

Only the first kernel of the file is read.
"""

from __future__ import annotations

import collections
import csv
import sys


def _opcode(sass: str) -> str:
    words = sass.strip().split()
    op = words[1] if words[0].startswith("@") else words[0]
    return op.split(".")[0]


def main(path: str, block: int = 40, top: int = 8) -> None:
    rows = list(csv.reader(open(path)))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    rows = rows[: starts[1]] if len(starts) > 1 else rows
    hdr = rows[1]
    col = {h: i for i, h in enumerate(hdr)}
    data = [r for r in rows[2:] if len(r) == len(hdr) and r[2].isdigit()]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    samples = [int(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in data]
    total = max(sum(samples), 1)
    print("total samples", total, "instructions", len(data))
    by_op, by_stall = collections.Counter(), collections.Counter()
    for r, s in zip(data, samples):
        by_op[_opcode(r[1])] += s
        for st in stalls:
            by_stall[st[6:]] += int(r[col[st]] or 0)
    print("by opcode:", [(k, round(100 * v / total, 1)) for k, v in by_op.most_common(14)])
    print("by stall:", [(k, round(100 * v / total, 1)) for k, v in by_stall.most_common(10)])
    blocks = sorted(((sum(samples[i:i + block]), i) for i in range(0, len(data), block)), reverse=True)
    for s, i in blocks[:top]:
        ops, st = collections.Counter(), collections.Counter()
        for r in data[i:i + block]:
            ops[_opcode(r[1])] += 1
            for x in stalls:
                st[x[6:]] += int(r[col[x]] or 0)
        ran = int(data[i][col["Instructions Executed"]] or 0)
        print(f"block {i:5d}: {100 * s / total:5.1f}%  exec@start {ran:9d}  ops {dict(ops.most_common(6))}  "
              f"stalls {[(k, round(100 * v / max(s, 1))) for k, v in st.most_common(4)]}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
