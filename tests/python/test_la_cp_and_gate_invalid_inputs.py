"""Invalid and extreme inputs of the linear-attention gates, index helpers and context-parallel
entry points (issue 39, item 2): the rows of the "Invalid inputs" tables of fused_gdn_gate
(src/ops/gated_delta_rule/README.md), fused_kda_gate (src/ops/kda/README.md), beta_sigmoid,
prepare_chunk_indices / prepare_chunk_offsets and la_cp_fwd_summary / la_cp_bwd_summary /
la_cp_fold_fwd / la_cp_fold_bwd (src/ops/linear_attention/README.md). The context-parallel entry
points are called through the bindings that python/fusedops/distributed uses (fusedops._C).
"""

from __future__ import annotations

import fusedops
import pytest
import torch
from fusedops import _C
from fusedops import gated_delta_rule as gdn
from fusedops import kda
from fusedops._backend import context
from fusedops.ops import _linear_attention as la

CUDA_REASON = ("" if torch.cuda.is_available() and fusedops.built_with_cuda()
               else "needs a CUDA device and a CUDA build")
LARGE_REASON = ("2^31 elements need >= 8 GiB per tensor: run on CUDA (the H200 runs); a CPU run would "
                "need the same host memory and minutes of CI time")
NAN, INF = float("nan"), float("inf")


def _rn(seed: int):
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    return rn


def _strided(t: torch.Tensor) -> torch.Tensor:
    buf = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    buf[..., 1::2] = t
    return buf[..., 1::2]


# ---------------------------------------------------------------------------------------------
# prepare_chunk_indices / prepare_chunk_offsets.

BUILDERS = ["prepare_chunk_indices", "prepare_chunk_offsets"]


@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_reject_bad_chunk_sizes(fn):
    cu = torch.tensor([0, 5, 9])
    for bad in (0, -4):
        with pytest.raises(ValueError, match=f"{fn}: chunk_size must be >= 1, got {bad}"):
            getattr(gdn, fn)(cu, bad)


@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_shapes_layouts_and_empty(fn):
    build = getattr(gdn, fn)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0, got \\[\\]"):  # shape [0]
        build(torch.zeros(0, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="rank-1 int32/int64"):  # rank 2
        build(torch.tensor([[0, 5, 9]]), 4)
    dense = torch.tensor([0, 5, 5, 9])
    strided = torch.tensor([0, -1, 5, -1, 5, -1, 9, -1])[::2]  # a non-contiguous cu_seqlens
    assert torch.equal(build(strided, 4), build(dense, 4))
    want = {"prepare_chunk_indices": [[0, 0], [0, 1], [2, 0]], "prepare_chunk_offsets": [0, 2, 2, 3]}[fn]
    assert build(dense, 4).tolist() == want  # the empty sequence 1 has no chunk
    empty = build(torch.tensor([0]), 4)  # N = 0 sequences
    assert list(empty.shape) == ([0, 2] if fn == "prepare_chunk_indices" else [1])
    for dt in (torch.int32, torch.int64):
        assert build(dense.to(dt), 4).dtype == dt


@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_int32_lengths_near_2pow31(fn):
    """A length of 2^31 - 1 tokens in an int32 cu_seqlens: the chunk counts are computed without
    overflow (ceil((2^31 - 1) / 2^30) = 2)."""
    cu = torch.tensor([0, 2**31 - 1], dtype=torch.int32)
    got = getattr(gdn, fn)(cu, 2**30)
    assert got.dtype == torch.int32
    assert got.tolist() == ([[0, 0], [0, 1]] if fn == "prepare_chunk_indices" else [0, 2])


@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON)
@pytest.mark.parametrize("fn", BUILDERS)
def test_table_builders_on_cuda_keep_the_device(fn):
    cu = torch.tensor([0, 5, 9], device="cuda")
    got = getattr(gdn, fn)(cu, 4)
    assert got.device == cu.device
    assert torch.equal(got.cpu(), getattr(gdn, fn)(cu.cpu(), 4))
