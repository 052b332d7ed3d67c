"""Distributed operators against one process: context-parallel chunk_gated_delta_rule, chunk_kda
and causal_conv1d, vocabulary-parallel fused_cross_entropy_loss and chunk_loss (cases.py), in one
spawned world per world size (2 and 3 ranks; gloo on loopback, or NCCL with
FUSEDOPS_TEST_DIST_BACKEND=nccl), and the spawn harness's own failure modes."""

from __future__ import annotations

import time

import pytest

from tests.python.distributed import cases, harness

WORLDS = (2, 3)
_runs: dict = {}


def _world(world: int) -> dict:
    """Every case's outcome in a world of this size (spawned once, on first use)."""
    if world not in _runs:
        try:
            _runs[world] = harness.run_world(world, cases.run_all)
        except Exception as e:  # every case of this world reports it
            _runs[world] = e
    out = _runs[world]
    if isinstance(out, Exception):
        raise out
    return out


@pytest.mark.parametrize("name", list(cases.CASES))
@pytest.mark.parametrize("world", WORLDS)
def test_distributed_equals_one_process(world, name):
    reason = harness.skip_reason(world)
    if reason:
        pytest.skip(reason)
    failure = _world(world)[name]
    if failure:
        pytest.fail(failure, pytrace=False)


def _raises_on_rank_1(rank, world, device):
    if rank == 1:
        raise ValueError("rank 1 gives up")
    import torch.distributed as dist
    dist.barrier()  # rank 0 waits for the dead peer: the harness must not
    return {}


def _hangs_on_rank_1(rank, world, device):
    if rank == 1:
        time.sleep(600)
    return {}


def test_harness_fails_clearly_when_a_rank_dies():
    if harness.skip_reason(2):
        pytest.skip(harness.skip_reason(2))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 gives up"):
        harness.run_world(2, _raises_on_rank_1, timeout=60, collective_timeout=20)
    assert time.monotonic() - t0 < 50


def test_harness_times_out_a_stuck_rank():
    if harness.skip_reason(2):
        pytest.skip(harness.skip_reason(2))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish"):
        harness.run_world(2, _hangs_on_rank_1, timeout=5, collective_timeout=20)
    assert time.monotonic() - t0 < 30
