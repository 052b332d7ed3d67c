"""The context-parallel plan on its own (no process group: every rank's plan is built directly),
and the distributed entry points' argument errors (raised before any collective)."""

from __future__ import annotations

import random

import fusedops
import pytest
import torch
from fusedops.distributed import ContextParallel


def _plans(cu, counts, conv_width=None):
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return [ContextParallel(cu, bounds, r, len(counts), None, torch.device("cpu"), conv_width)
            for r in range(len(counts))]


def _random_layout(rng):
    n = rng.randint(1, 8)
    lens = [rng.choice([0, 1, 2, 3, 7, 20, 65]) for _ in range(n)]
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    world = rng.randint(1, 5)
    cuts = sorted(rng.randint(0, cu[-1]) for _ in range(world - 1))
    counts = [b - a for a, b in zip([0] + cuts, cuts + [cu[-1]])]
    return cu, counts


@pytest.mark.parametrize("seed", range(40))
def test_plan_covers_every_token_once_and_links_the_ranks(seed):
    rng = random.Random(seed)
    cu, counts = _random_layout(rng)
    W = rng.choice([2, 3, 4])
    plans = _plans(cu, counts, conv_width=W)
    seen = []
    for p in plans:
        local = p.cu_seqlens_cpu.tolist()
        assert local[0] == 0 and local[-1] == p.num_tokens and len(local) == p.num_local_seqs + 1
        assert all(b > a for a, b in zip(local, local[1:])), "local sequences are non-empty"
        for i, n in enumerate(p.seq_ids):
            lo, hi = max(cu[n], p.start), min(cu[n + 1], p.end)
            assert (local[i], local[i + 1]) == (lo - p.start, hi - p.start)
            seen.extend(range(lo, hi))
        # Incoming: the first sequence started earlier, on rank fold_lo, and crosses every rank
        # between (whose outgoing sequence it is, or which are empty).
        if p.incoming is not None:
            n = p.incoming
            assert p.seq_ids[0] == n and cu[n] < p.start and p.incoming_end == local[1]
            assert p.bounds[p.fold_lo] <= cu[n] < p.bounds[p.fold_lo + 1]
            for j in range(p.fold_lo, p.rank):
                assert plans[j].outgoing == n or plans[j].num_tokens == 0
        else:
            assert not p.seq_ids or cu[p.seq_ids[0]] >= p.start
        if p.outgoing is not None:
            n = p.outgoing
            assert p.seq_ids[-1] == n and cu[n + 1] > p.end and p.outgoing_start == local[-2]
            assert p.bounds[p.fold_hi - 1] < cu[n + 1] <= p.bounds[p.fold_hi]
            for j in range(p.rank + 1, p.fold_hi):
                assert plans[j].incoming == n or plans[j].num_tokens == 0
        # Rows whose initial / final state is this rank's to take / return.
        starts = {int(i) for i in p.start_ids}
        ends = {int(i) for i in p.end_ids}
        assert starts == {n for n in p.seq_ids if cu[n] >= p.start}
        assert ends == {n for n in p.seq_ids if cu[n + 1] <= p.end}
    assert seen == list(range(cu[-1]))
    # Every non-empty sequence starts on exactly one rank and ends on one; empty ones are rank 0's.
    for n in range(len(cu) - 1):
        if cu[n] == cu[n + 1]:
            assert n in plans[0].empty_seqs
            continue
        assert sum(n in {int(i) for i in p.start_ids} for p in plans) == 1
        assert sum(n in {int(i) for i in p.end_ids} for p in plans) == 1
    # The halo pieces deliver exactly the W-1 tokens (or fewer, within the sequence) before each
    # rank's first token, each sent by its owner.
    for p in plans:
        want = set()
        if p.incoming is not None:
            want = set(range(max(cu[p.incoming], p.start - (W - 1)), p.start))
            assert p.halo_len == len(want)
        got = set()
        for piece in p.halo_recv:
            src = plans[piece.src]
            assert src.start <= piece.start < piece.end <= src.end and piece in src.halo_send
            assert piece.slot == piece.start - (p.start - (W - 1))
            got |= set(range(piece.start, piece.end))
        assert got == want


def test_plan_split_and_errors():
    p = _plans([0, 10], [3, 7])[1]
    assert (p.start, p.end, p.incoming, p.fold_lo) == (3, 10, 0, 0)
    with pytest.raises(RuntimeError, match="not initialized"):
        fusedops.distributed.context_parallel([0, 10])


def test_cp_arguments_are_checked_before_communicating():
    plan = _plans([0, 8, 20], [12, 8])[0]
    q = torch.randn(1, 12, 2, 8)
    v = torch.randn(1, 12, 2, 8)
    g, beta = -torch.rand(1, 12, 2), torch.rand(1, 12, 2)
    with pytest.raises(TypeError, match="cp must be a plan"):
        fusedops.chunk_gated_delta_rule(q, q, v, g, beta, cp=object())
    with pytest.raises(ValueError, match="cp or its alias cp_context"):
        fusedops.chunk_gated_delta_rule(q, q, v, g, beta, cp=plan, cp_context=plan)
    with pytest.raises(ValueError, match=r"this rank's tokens of the packed batch, \[1, 12"):
        fusedops.chunk_gated_delta_rule(q[:, :5], q[:, :5], v[:, :5], g[:, :5], beta[:, :5], cp=plan)
    with pytest.raises(ValueError, match="pass cu_seqlens=None"):
        fusedops.chunk_gated_delta_rule(q, q, v, g, beta, cp=plan, cu_seqlens=torch.tensor([0, 12]))
    with pytest.raises(ValueError, match=r"every global sequence: \[2, HV, K, V\]"):
        fusedops.chunk_gated_delta_rule(q, q, v, g, beta, cp=plan, initial_state=torch.zeros(1, 2, 8, 8))
    gk = -torch.rand(1, 12, 2, 8)
    with pytest.raises(ValueError, match=r"N=2 sequences"):
        fusedops.chunk_kda(q, q, v, gk, beta, cp_context=plan, initial_state=torch.zeros(1, 2, 8, 8))
    x, w = torch.randn(1, 12, 4), torch.randn(4, 4)
    with pytest.raises(ValueError, match="built for conv_width=None"):
        fusedops.causal_conv1d(x, w, cp=plan)
    with pytest.raises(ValueError, match="cp or its alias cp_context"):
        fusedops.causal_conv1d(x, w, cp=plan, cp_context=plan)
