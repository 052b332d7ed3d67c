"""Property-based tests (hypothesis) of sort_chunks_by_idx (and its map forms) and matmul_add:
random shapes, chunkings and orders, element dtypes and layouts. sort_chunks moves bytes, so its
outputs and gradients must equal the torch.split + torch.cat composite bit for bit (and the
float64 reference); matmul_add against the float64 reference under the precision policy."""

from __future__ import annotations

import fusedops
import torch
from fusedops.ops import sort_chunks as sc
from hypothesis import given
from hypothesis import strategies as st

from tests.python.property.common import (
    DTYPES,
    LAYOUTS,
    SETTINGS,
    check_against_reference,
    composite_of,
    dim,
    normal,
    strided,
)

SPLIT_CAT = composite_of("test_sort_chunks_by_idx")
MATMUL_ADD = composite_of("test_matmul_add")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().cpu().view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                                               8: torch.int64}[t.element_size()])


@SETTINGS
@given(N=dim(300, 0), Hd=dim(70, 0), data=st.data(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64]),
       layout=st.sampled_from(["dense", "rows"]), probs=st.booleans(), index_dtype=st.sampled_from(
           [torch.int32, torch.int64]), seed=st.integers(0, 2**20))
def test_sort_chunks_by_idx(device, N, Hd, data, dtype, layout, probs, index_dtype, seed):
    sizes = data.draw(st.lists(st.integers(0, max(N, 1)), max_size=12), label="sizes")
    while sum(sizes) > N:  # sizes summing to at most N (rows past them stay in place)
        sizes[sizes.index(max(sizes))] -= 1
    order = data.draw(st.permutations(range(len(sizes))), label="order")
    x = strided(normal((N, Hd), torch.float32, device, seed, 4.0).to(dtype), layout)
    p = normal((N,), torch.float32, device, seed + 1) if probs else None
    s_t = torch.tensor(sizes, dtype=index_dtype, device=device)
    o_t = torch.tensor(order, dtype=index_dtype, device=device)
    floating = dtype in (torch.float32, torch.bfloat16)
    xl = x.detach().clone().requires_grad_(floating)
    out, pout, row_id_map = sc.sort_chunks_by_idx_with_map(xl, s_t, o_t, p)
    want, pwant = SPLIT_CAT(x, sizes, list(order), p)
    what = f"sort_chunks_by_idx [{N},{Hd}] {dtype} {layout} sizes {sizes} order {list(order)} seed {seed}"
    assert torch.equal(bits(out), bits(want)), what
    if probs:
        assert torch.equal(bits(pout), bits(pwant)), what
    assert torch.equal(sc.make_chunk_sort_map(s_t, o_t, N, len(sizes)), row_id_map), what
    moved = sc.sort_chunks_by_map(x, row_id_map, p, N, Hd, True)[0]
    assert torch.equal(bits(moved), bits(want)), what + " (by map)"
    if floating:
        g = normal((N, Hd), dtype, device, seed + 2)
        (dx,) = torch.autograd.grad(out, xl, g)
        assert torch.equal(bits(dx), bits(sc.sort_chunks_by_map(g, row_id_map, None, N, Hd, False)[0]))
        ref = fusedops.reference.sort_chunks_by_idx(x.double(), s_t, o_t)[0]
        assert torch.equal(out.double().cpu(), ref.cpu()), what + " (float64 reference)"


@SETTINGS
@given(T=dim(130, 0), out=dim(70), inn=dim(70), lead=st.sampled_from([(), (2,)]), dtype=DTYPES,
       layout=LAYOUTS, acc64=st.booleans(), seed=st.integers(0, 2**20))
def test_matmul_add(device, T, out, inn, lead, dtype, layout, acc64, seed):
    g = strided(normal(lead + (T, out), dtype, device, seed), layout)
    x = strided(normal(lead + (T, inn), dtype, device, seed + 1), layout)
    mg = normal((out, inn), torch.float64 if acc64 and device == "cpu" else torch.float32, device, seed + 2)
    check_against_reference(
        f"matmul_add {lead + (T,)} out {out} in {inn} {dtype} {layout} main_grad {mg.dtype} seed {seed}",
        lambda g, x, mg: fusedops.matmul_add(g, x, mg.clone()),
        lambda g, x, mg: MATMUL_ADD(g, x, mg),
        lambda g, x, mg: fusedops.reference.matmul_add(g, x, mg),
        {"g": g, "x": x, "mg": mg}, [], seed, tol_dtype=dtype)
