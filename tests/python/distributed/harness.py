"""Spawning a local process group for the distributed tests (loopback only, bounded in time).

``run_world(world_size, fn)`` starts ``world_size`` processes (torch.multiprocessing, spawn),
joins them into one torch.distributed group through a file store in a fresh temporary
directory, and calls ``fn(rank, world_size, device)`` in each. What rank 0 returns (a JSON-able
value) comes back to the caller. A rank that raises or dies fails the whole run at once with
its traceback (the others are terminated); a run longer than ``timeout`` seconds is terminated
and raises TimeoutError. Collectives time out after ``collective_timeout`` seconds, so a rank
left waiting for a dead peer does not hang.

Backend and device: gloo on the CPU by default; ``FUSEDOPS_TEST_DIST_BACKEND=nccl`` runs NCCL
with rank r on cuda:r (needs world_size GPUs).
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
import traceback
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BACKEND_ENV = "FUSEDOPS_TEST_DIST_BACKEND"


def backend() -> str:
    b = os.environ.get(BACKEND_ENV, "gloo").strip().lower() or "gloo"
    if b not in ("gloo", "nccl"):
        raise ValueError(f"{BACKEND_ENV} must be 'gloo' or 'nccl', got {b!r}")
    return b


def skip_reason(world_size: int) -> str:
    """Why a world of this size cannot run here ('' when it can)."""
    if not dist.is_available():
        return "torch.distributed is not available"
    if backend() == "nccl":
        if not dist.is_nccl_available():
            return "NCCL is not available"
        if torch.cuda.device_count() < world_size:
            return f"NCCL needs {world_size} GPUs, {torch.cuda.device_count()} visible"
    return ""


def _entry(rank: int, world_size: int, fn: Callable, tmpdir: str, be: str, collective_timeout: float) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if be == "nccl" else torch.device("cpu")
    if be == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(be, init_method=f"file://{os.path.join(tmpdir, 'store')}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=collective_timeout))
    try:
        result = fn(rank, world_size, device)
        if rank == 0:
            with open(os.path.join(tmpdir, "result.json"), "w") as f:
                json.dump(result, f)
        dist.barrier()
    except BaseException:
        # Every failing rank leaves its traceback: the first one the parent notices may only be a
        # peer's "connection closed".
        with open(os.path.join(tmpdir, f"error-{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_world(world_size: int, fn: Callable, timeout: float = 240.0, collective_timeout: float = 60.0):
    """Run ``fn`` on a fresh local group of ``world_size`` ranks; rank 0's return value."""
    with tempfile.TemporaryDirectory(prefix="fusedops-dist-") as tmpdir:
        procs = mp.start_processes(_entry, args=(world_size, fn, tmpdir, backend(), collective_timeout),
                                   nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not procs.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"distributed test world of {world_size} ranks did not finish within "
                                       f"{timeout:.0f} s (a rank is stuck); terminated")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            _terminate(procs)
            errors = [f"--- rank {r}:\n{_read(os.path.join(tmpdir, f'error-{r}.txt'))}"
                      for r in range(world_size) if os.path.exists(os.path.join(tmpdir, f"error-{r}.txt"))]
            raise RuntimeError(f"a rank of the distributed test world of {world_size} failed ({e.__class__.__name__}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})\n" + "\n".join(errors)) from None
        finally:
            _terminate(procs)
        with open(os.path.join(tmpdir, "result.json")) as f:
            return json.load(f)


def _terminate(procs) -> None:
    for p in procs.processes:
        if p.is_alive():
            p.terminate()
    for p in procs.processes:
        p.join(5)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def guarded(fn: Callable) -> Callable:
    """Decorator for a check run on rank 0: returns None when it passes, else the failure text
    (so that one failing comparison does not stop the other cases)."""
    def run(*args, **kwargs):
        try:
            fn(*args, **kwargs)
            return None
        except AssertionError as e:
            return f"{e}\n{traceback.format_exc(limit=4)}"
    return run
