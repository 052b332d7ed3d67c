#!/usr/bin/env python
"""What a fresh page costs on this CPU machine, and how that cost moves from call to call.

The CPU report times operators whose outputs are fresh mappings (glibc maps every block above its
32 MiB threshold anew, so each call faults its output's pages in). On a virtual machine whose
memory the host backs lazily and takes back when the guest frees it (virtio-balloon free page
reporting: the kernel command line's `page_reporting.page_reporting_order`), the price of those
faults depends on where the guest's free pages come from, not on the operator. This probe
(plain system calls, no torch, no fusedops) measures it:

1. first touch (between the two runs of 2): one fresh block of FIRST_GIB GiB written twice (the
   first pass faults every page in, the second writes mapped memory), then unmapped;
2. the report's pattern, before and after 1: a 64 MiB output mapped, faulted in and unmapped
   again BATCHES x REPS times, a 960 MiB buffer written before each (the report's cache flush),
   in three ways:
   `populate-2`: MADV_POPULATE_WRITE by two threads, half each (what fusedops' streaming copies do
   with a fresh output, src/cpu/stream_copy.h); `populate-1`: the same by one thread; `memset-2`:
   two threads writing it (first-touch faults, as PyTorch's own kernels take them).
   Each batch prints median, min and max (ms) of its REPS calls.

    python bench/cpu_page_backing.py [--first-gib 4] [--batches 2] [--reps 15] [--out PATH]

Linux only (mmap, madvise and MADV_POPULATE_WRITE, Linux 5.14, through ctypes).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROT_RW = 0x1 | 0x2
MAP_PRIVATE_ANON = 0x02 | 0x20
MADV_POPULATE_WRITE = 23
OUT_BYTES = 64 << 20
FLUSH_BYTES = 960 << 20

libc = None  # set by main(): importing this module (bench/report.py does) loads nothing


def page_reporting_order() -> int | None:
    """The order of virtio-balloon free page reporting on the kernel command line, or None: on
    such a VM the host takes freed guest memory back and faults it in again on reuse, so a call's
    fresh pages cost more and vary more. bench/report.py records it with every CPU run."""
    try:
        for word in Path("/proc/cmdline").read_text().split():
            if word.startswith("page_reporting.page_reporting_order="):
                return int(word.split("=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def load_libc():
    global libc
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def mapping(n: int) -> int:
    p = libc.mmap(None, n, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return p


def populate(p: int, n: int) -> None:
    if libc.madvise(p, n, MADV_POPULATE_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE) failed (Linux >= 5.14 needed)")


def two_halves(fn, p: int, n: int) -> None:
    """fn on each half of [p, p + n), the second half on another thread (ctypes calls release
    the GIL, so the two run at once)."""
    h = n // 2
    t = threading.Thread(target=fn, args=(p + h, n - h))
    t.start()
    fn(p, h)
    t.join()


WAYS = {
    "populate-2": lambda p, n: two_halves(populate, p, n),
    "populate-1": populate,
    "memset-2": lambda p, n: two_halves(lambda q, m: ctypes.memset(q, 1, m), p, n),
}


def machine() -> list[str]:
    lines = [f"{platform.node()}: {platform.platform()}, {os.cpu_count()} CPUs"]
    order = page_reporting_order()
    lines.append("kernel command line, page reporting: "
                 + ("(not set)" if order is None else f"page_reporting.page_reporting_order={order}"))
    balloon = Path("/sys/bus/virtio/drivers/virtio_balloon")
    lines.append(f"virtio_balloon driver: {'present' if balloon.exists() else 'absent'}")
    try:
        lines.append("transparent huge pages: " + Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip())
    except OSError:
        pass
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first-gib", type=float, default=4.0)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None, help="also write the printed lines to this study file")
    args = ap.parse_args()
    load_libc()
    out: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        out.append(s)

    for line in machine():
        say(line)
    flush = mapping(FLUSH_BYTES)

    def outputs(phase: str) -> None:
        for name, way in WAYS.items():
            for b in range(args.batches):
                ts = []
                for i in range(args.reps):
                    ctypes.memset(flush, i & 0xFF, FLUSH_BYTES)
                    t0 = time.perf_counter()
                    q = mapping(OUT_BYTES)
                    way(q, OUT_BYTES)
                    ts.append((time.perf_counter() - t0) * 1e3)
                    libc.munmap(q, OUT_BYTES)
                say(f"{phase}: 64 MiB output, {name:10s} batch {b + 1}: median {statistics.median(ts):7.1f} ms  "
                    f"min {min(ts):7.1f}  max {max(ts):7.1f}")

    outputs("before")
    n = int(args.first_gib * (1 << 30))
    p = mapping(n)
    t0 = time.perf_counter()
    ctypes.memset(p, 1, n)
    t1 = time.perf_counter()
    ctypes.memset(p, 2, n)
    t2 = time.perf_counter()
    libc.munmap(p, n)
    pages = n // 4096
    say(f"first touch of {args.first_gib:g} GiB: {t1 - t0:.2f} s ({(t1 - t0) / pages * 1e6:.2f} us per 4 KiB page); "
        f"written again: {t2 - t1:.2f} s ({(t2 - t1) / pages * 1e6:.3f} us per page); unmapped")
    outputs("after")
    if args.out:
        sys.path.insert(0, str(ROOT))
        from bench.common import study_commit  # torch comes with it: imported after the probe

        head = ["# " + __doc__.split("\n\n")[0].strip(), f"# commit {study_commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
                "# command: python bench/cpu_page_backing.py " + " ".join(sys.argv[1:])]
        Path(args.out).write_text("\n".join(head + out) + "\n")


if __name__ == "__main__":
    main()
