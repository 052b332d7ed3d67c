"""sort_chunks_by_idx (docs/specs/ops.md section 6) through the torch layer, with the MindSpeed / TE helper
forms and Megatron's ``sort_chunks_by_idxs``.

Every registered backend is forced in turn (``backend_case``). The oracle is written here: the
chunks cut with ``torch.split`` and laid out with ``torch.cat`` (rows past the chunks kept), in
float64 for the precision policy and in the input dtype for the bit-for-bit check, both
differentiated by torch.autograd. A permutation does no arithmetic, so every output and every
gradient must be bit-identical to the composite.
"""

from __future__ import annotations

import fusedops
import pytest
import torch
from fusedops.ops import sort_chunks as sc

from tests.common.bad_input import expect_rejected
from tests.common.tolerance import assert_close

OP = "sort_chunks_by_idx"

# (name, N, Hd, split sizes, sorted order)
CASES = [
    ("one_row", 1, 1, [1], [0]),
    ("reversed_odd", 37, 13, [5, 0, 11, 3, 0, 18], [5, 4, 3, 2, 1, 0]),
    ("identity_order", 9, 7, [2, 3, 4], [0, 1, 2]),
    ("sum_below_n", 23, 9, [4, 0, 7], [2, 0, 1]),
    ("no_chunks", 6, 5, [], []),
    ("all_zero_sizes", 5, 3, [0, 0, 0], [1, 2, 0]),
    ("zero_width_rows", 5, 0, [2, 3], [1, 0]),
    ("no_rows", 0, 8, [0, 0], [1, 0]),
    ("wide_rows", 70, 520, None, 9),
    ("many_chunks", 1000, 64, None, 96),
]


def materialize(case, seed):
    """(N, Hd, sizes, order) with random sizes (some zero) summing to N when sizes is None."""
    name, n, hd, sizes, order = case
    if sizes is None:
        s = order
        g = torch.Generator().manual_seed(seed)
        cuts = torch.sort(torch.randint(0, n + 1, (s - 1,), generator=g)).values.tolist()
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
        order = torch.randperm(s, generator=g).tolist()
    return n, hd, sizes, order


def composite(inp, sizes, order, probs=None):
    """The chunks of inp (split sizes) concatenated in `order`, rows past the chunks kept."""
    total = sum(sizes)

    def permute(t):
        chunks = torch.split(t[:total], sizes, dim=0) if sizes else ()
        return torch.cat([chunks[i] for i in order] + [t[total:]], dim=0)

    return permute(inp), (permute(probs) if probs is not None else None)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bitwise(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(bits(a), bits(b)), f"{what}: not bit-identical"


def backends_here(runnable_backends, device):
    ids = runnable_backends(OP, device)
    assert ids, f"no {OP} backend runs on {device}"
    return ids


def forced(case):
    return fusedops.use_backend(**{OP: case.backend})


def index_tensors(sizes, order, device, dtype=torch.int64):
    return (torch.tensor(sizes, dtype=dtype, device=device),
            torch.tensor(order, dtype=dtype, device=device))


def grads(outputs, inputs, grad_outputs):
    gs = torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


# ---------------------------------------------------------------------------------------------
# Forward and backward, every backend / float dtype / case, with and without probs.


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("with_probs", [False, True], ids=["rows", "rows+probs"])
def test_forward_and_backward_match_the_composite(backend_case, case, with_probs, fresh_normal, seed_of):
    dt, dev = backend_case.dtype, backend_case.device
    seed = seed_of(OP, case[0], with_probs, str(dt))
    n, hd, sizes, order = materialize(case, seed)
    x = fresh_normal((n, hd), dt, dev, seed).requires_grad_()
    probs = fresh_normal((n,), torch.float32, dev, seed + 1).requires_grad_() if with_probs else None
    s_t, o_t = index_tensors(sizes, order, dev, torch.int64 if seed % 2 else torch.int32)
    g_out = fresh_normal((n, hd), dt, dev, seed + 2)
    g_probs = fresh_normal((n,), torch.float32, dev, seed + 3)

    with forced(backend_case):
        out, probs_out = fusedops.sort_chunks_by_idx(x, s_t, o_t, probs)
        leaves = [x] + ([probs] if with_probs else [])
        outs = [out] + ([probs_out] if with_probs else [])
        gouts = [g_out] + ([g_probs] if with_probs else [])
        dgrads = grads(outs, leaves, gouts)
    assert (probs_out is None) == (not with_probs)

    # Bit for bit against the composite in the input dtype.
    xb = x.detach().clone().requires_grad_()
    pb = probs.detach().clone().requires_grad_() if with_probs else None
    ob, pob = composite(xb, sizes, order, pb)
    assert_bitwise(out, ob, "out")
    if with_probs:
        assert_bitwise(probs_out, pob, "probs_out")
    bgrads = grads([ob] + ([pob] if with_probs else []), [xb] + ([pb] if with_probs else []), gouts)
    for name, a, b in zip(("d_inp", "d_probs"), dgrads, bgrads):
        assert_bitwise(a, b, name)

    # And through the precision policy against the float64 oracle.
    x64 = x.detach().cpu().double().requires_grad_()
    o64, _ = composite(x64, sizes, order)
    (d64,) = grads([o64], [x64], [g_out.cpu().double()])
    assert_close(out, ob, o64, dt, f"{backend_case.id} {case[0]} out")
    assert_close(dgrads[0], bgrads[0], d64, dt, f"{backend_case.id} {case[0]} d_inp")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8, torch.int8,
                                   torch.int16, torch.int32, torch.int64, torch.bool,
                                   torch.complex64, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_any_element_dtype_is_copied_bit_for_bit(device, runnable_backends, dtype):
    n, hd, sizes, order = 41, 19, [7, 0, 12, 5, 9], [3, 0, 4, 2, 1]
    g = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 256, (n, hd * torch.empty(0, dtype=dtype).element_size()), generator=g,
                        dtype=torch.uint8)
    if dtype == torch.bool:
        x = (raw[:, :hd] & 1).bool()
    else:
        x = raw.view(dtype)  # arbitrary bit patterns, NaN payloads included
    x = x.to(device)
    s_t, o_t = index_tensors(sizes, order, device)
    want, _ = composite(x, sizes, order)
    for backend in backends_here(runnable_backends, device):
        with fusedops.use_backend(**{OP: backend}):
            got = fusedops.moe_sort_chunks_by_index(x, s_t, o_t)
        assert got.dtype == dtype
        assert_bitwise(got, want, f"{backend} {dtype}")


def test_fp8_rows_with_probs_and_their_gradients(device):
    x = torch.randn(33, 40, device=device).to(torch.float8_e4m3fn)
    probs = torch.rand(33, device=device, requires_grad=True)
    sizes, order = [10, 0, 13, 10], [2, 3, 0, 1]
    s_t, o_t = index_tensors(sizes, order, device)
    out, probs_out = fusedops.moe_sort_chunks_by_index_with_probs(x, probs, s_t, o_t)
    want, want_p = composite(x, sizes, order, probs.detach())
    assert_bitwise(out, want, "fp8 out")
    assert_bitwise(probs_out, want_p, "probs_out")
    g = torch.randn(33, device=device)
    (dp,) = torch.autograd.grad(probs_out, probs, g)
    pb = probs.detach().clone().requires_grad_()
    (dpb,) = torch.autograd.grad(composite(x, sizes, order, pb)[1], pb, g)
    assert_bitwise(dp, dpb, "d_probs")


def test_gradient_of_one_output_only(device, runnable_backends):
    # Only probs_out (or only out) reaches the loss: the other gradient is absent, not zeros.
    sizes, order = [3, 0, 5, 4], [1, 3, 2, 0]
    s_t, o_t = index_tensors(sizes, order, device)
    for backend in backends_here(runnable_backends, device):
        x = torch.randn(12, 7, device=device, requires_grad=True)
        probs = torch.rand(12, device=device, requires_grad=True)
        g = torch.randn(12, device=device)
        with fusedops.use_backend(**{OP: backend}):
            _, po = fusedops.sort_chunks_by_idx(x, s_t, o_t, probs)
            dx, dp = torch.autograd.grad(po, [x, probs], g, allow_unused=True)
        assert dx is None
        pb = probs.detach().clone().requires_grad_()
        (want,) = torch.autograd.grad(composite(x.detach(), sizes, order, pb)[1], pb, g)
        assert_bitwise(dp, want, f"{backend} d_probs alone")
        with fusedops.use_backend(**{OP: backend}):
            out, _ = fusedops.sort_chunks_by_idx(x, s_t, o_t, probs)
            dx, dp = torch.autograd.grad(out, [x, probs], torch.ones_like(out), allow_unused=True)
        assert dp is None and torch.equal(dx, torch.ones_like(x))


# ---------------------------------------------------------------------------------------------
# Layouts, entry points, helpers.


def test_non_contiguous_inputs(device, runnable_backends):
    sizes, order = [3, 8, 0, 6], [1, 3, 0, 2]
    s_t, o_t = index_tensors(sizes, order, device)
    base = torch.randn(17, 50, device=device)
    layouts = {
        "column_slice": base[:, 3:27],         # row stride 50, last dim contiguous
        "transposed": torch.randn(24, 17, device=device).t(),  # last dim stride 17 (copied)
        "every_other_row_probs": base[:, :24],
    }
    probs = torch.rand(34, device=device)[::2]  # stride 2
    for backend in backends_here(runnable_backends, device):
        for name, x in layouts.items():
            assert not x.is_contiguous()
            with fusedops.use_backend(**{OP: backend}):
                out, po = fusedops.sort_chunks_by_idx(x, s_t, o_t, probs)
            want, want_p = composite(x, sizes, order, probs)
            assert_bitwise(out, want, f"{backend} {name}")
            assert_bitwise(po, want_p, f"{backend} {name} probs")


def test_expanded_gradient_from_sum(device, runnable_backends):
    sizes, order = [4, 0, 9, 2], [3, 1, 2, 0]
    s_t, o_t = index_tensors(sizes, order, device)
    for backend in backends_here(runnable_backends, device):
        x = torch.randn(15, 11, device=device, requires_grad=True)
        probs = torch.rand(15, device=device, requires_grad=True)
        with fusedops.use_backend(**{OP: backend}):
            out, po = fusedops.sort_chunks_by_idx(x, s_t, o_t, probs)
            (out.sum() + 2 * po.sum()).backward()  # stride-0 gradients
        assert torch.equal(x.grad, torch.ones_like(x))
        assert torch.equal(probs.grad, torch.full_like(probs, 2.0))


def test_megatron_form_fused_and_unfused_agree(device):
    sizes, order = [6, 2, 0, 9], [2, 0, 3, 1]
    x = torch.randn(17, 12, device=device, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(17, device=device, requires_grad=True)
    s_t, o_t = index_tensors(sizes, order, device)
    fo, fp = fusedops.sort_chunks_by_idxs(x, s_t, o_t, probs)
    uo, up = fusedops.sort_chunks_by_idxs(x, s_t, o_t, probs, fused=False)
    assert_bitwise(fo, uo, "output")
    assert_bitwise(fp, up, "permuted_probs")
    lo, lp = fusedops.sort_chunks_by_idxs(x, sizes, order, probs)  # host lists are accepted
    assert_bitwise(lo, uo, "output from lists")
    g = torch.randn_like(fo)
    assert_bitwise(torch.autograd.grad(fo, x, g)[0], torch.autograd.grad(uo, x, g)[0], "d_input")
    no, npr = fusedops.sort_chunks_by_idxs(x, s_t, o_t)
    assert npr is None
    assert_bitwise(no, uo, "output without probs")


def test_helpers_make_chunk_sort_map_and_sort_chunks_by_map(device):
    sizes, order = [5, 0, 7, 3], [1, 3, 0, 2]
    n, hd = 18, 10  # rows 15..17 are past the chunks
    s_t, o_t = index_tensors(sizes, order, device, torch.int32)
    row_id_map = sc.make_chunk_sort_map(s_t, o_t, n, len(sizes))
    assert row_id_map.dtype == torch.int32 and row_id_map.shape == (n,)
    # out[row_id_map[r]] = inp[r]: row r of the input lands at row_id_map[r] of the composite.
    pos = composite(torch.arange(n, device=device), sizes, order)[0]
    want = torch.empty(n, dtype=torch.int64, device=device)
    want[pos] = torch.arange(n, device=device)
    assert torch.equal(row_id_map.long(), want)

    x = torch.randn(n, hd, device=device, requires_grad=True)
    probs = torch.rand(n, device=device, requires_grad=True)
    out, po = sc.sort_chunks_by_map(x, row_id_map, probs, n, hd, True)
    want_out, want_p = composite(x.detach(), sizes, order, probs.detach())
    assert_bitwise(out, want_out, "scatter")
    assert_bitwise(po, want_p, "scatter probs")
    back, pback = sc.sort_chunks_by_map(out, row_id_map, po, n, hd, False)
    assert_bitwise(back, x, "gather undoes scatter")
    assert_bitwise(pback, probs, "gather undoes scatter (probs)")
    # The helper is differentiable: the gradient of a scatter is the gather.
    g = torch.randn(n, hd, device=device)
    (dx,) = torch.autograd.grad(out, x, g)
    assert_bitwise(dx, g[row_id_map.long()], "d_inp of the scatter")
    gp = torch.randn(n, device=device)
    _, po2 = sc.sort_chunks_by_map(x, row_id_map, probs, n, hd, True)
    (dp,) = torch.autograd.grad(po2, probs, gp)
    assert_bitwise(dp, gp[row_id_map.long()], "d_probs of the scatter")
    _, _, saved_map = sc.sort_chunks_by_idx_with_map(x, s_t, o_t)
    assert torch.equal(saved_map, row_id_map)


def test_reference_matches_composite():
    sizes, order = [3, 0, 4, 2], [2, 0, 3, 1]
    x = torch.randn(11, 6, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(11, requires_grad=True)
    s_t, o_t = index_tensors(sizes, order, "cpu")
    out, po = fusedops.reference.sort_chunks_by_idx(x, s_t, o_t, probs)
    assert out.dtype == torch.float64
    want, want_p = composite(x.detach().double(), sizes, order, probs.detach().double())
    assert torch.equal(out, want) and torch.equal(po, want_p)
    g = torch.randn(11, 6, dtype=torch.float64)
    dx, dp = torch.autograd.grad([out, po], [x, probs], [g, torch.ones(11, dtype=torch.float64)])
    assert dx.dtype == torch.bfloat16
    xb = x.detach().double().requires_grad_()
    (dxb,) = torch.autograd.grad(composite(xb, sizes, order)[0], xb, g)
    assert torch.equal(dx, dxb.bfloat16())
    assert torch.equal(dp, torch.ones(11))


def test_outputs_larger_than_the_cache_bit_for_bit(device, runnable_backends):
    # Outputs of 16 MiB and more take streaming stores on the CPU (src/cpu/stream_copy.h): rows of
    # 4100 bytes (not a multiple of the 64-byte line), packed and strided inputs, forward and
    # backward, bit for bit against the composite.
    n, hd = 4100, 1025
    sizes = [700, 0, 1300, 1, 999, 1100]
    order = [3, 0, 5, 2, 4, 1]
    for backend in backends_here(runnable_backends, device):
        for strided in (False, True):
            base = torch.randn(n, hd + (3 if strided else 0), device=device)
            x = base[:, int(strided):int(strided) + hd].detach().requires_grad_()
            g_out = torch.randn(n, hd, device=device)
            s_t, o_t = index_tensors(sizes, order, device)
            with fusedops.use_backend(**{OP: backend}):
                out, _ = fusedops.sort_chunks_by_idx(x, s_t, o_t)
                (dx,) = torch.autograd.grad(out, x, g_out)
            xb = x.detach().clone().requires_grad_()
            ob, _ = composite(xb, sizes, order)
            (dxb,) = torch.autograd.grad(ob, xb, g_out)
            assert_bitwise(out, ob, f"{backend} out (strided={strided})")
            assert_bitwise(dx, dxb, f"{backend} d_inp (strided={strided})")


@pytest.mark.parametrize("n,hd", [(0, 16), (5, 0), (0, 0)])
def test_empty_inputs(device, n, hd):
    x = torch.randn(n, hd, device=device, requires_grad=True)
    probs = torch.rand(n, device=device, requires_grad=True)
    sizes = [n] if n else [0, 0]
    order = [0] if n else [1, 0]
    s_t, o_t = index_tensors(sizes, order, device)
    out, po = fusedops.sort_chunks_by_idx(x, s_t, o_t, probs)
    assert out.shape == (n, hd) and po.shape == (n,)
    assert_bitwise(po, probs, "probs")
    (out.sum() + po.sum()).backward()
    assert x.grad.shape == (n, hd) and probs.grad.shape == (n,)


# ---------------------------------------------------------------------------------------------
# Determinism, validation, errors.


@pytest.mark.dtypes(torch.bfloat16)
def test_repeated_backward_is_bitwise_identical(backend_case, fresh_normal):
    dev = backend_case.device
    sizes = [37, 0, 101, 64, 12, 300]
    order = [4, 2, 5, 0, 3, 1]
    x = fresh_normal((600, 72), torch.bfloat16, dev, 3)
    g = fresh_normal((600, 72), torch.bfloat16, dev, 4)
    s_t, o_t = index_tensors(sizes, order, dev)
    runs = []
    for _ in range(2):
        xi = x.clone().requires_grad_()
        with forced(backend_case):
            out, _ = fusedops.sort_chunks_by_idx(xi, s_t, o_t)
            (dx,) = torch.autograd.grad(out, xi, g)
        runs.append((out, dx))
    for a, b in zip(*runs):
        assert_bitwise(a, b, "repeat")


# Index contents that break the contract: issue 39's two reproductions (not a permutation; sizes
# summing past the 6 rows) first. (sizes, order, the CPU / debug-checks message, the CUDA report)
BAD_INDICES = [
    ([2, 2, 2], [0, 0, 1], "sorted_index must be a permutation of 0..2, got 0 twice",
     "sorted_index is not a permutation of 0..S-1: chunk 2 is missing"),
    ([2, 2, 5], [2, 1, 0], "the sum of split_sizes (9) must not exceed the number of rows of inp (6)",
     "the sum of split_sizes (9) exceeds the number of rows (6)"),
    ([-1, 7], [1, 0], "split_sizes must be >= 0, got split_sizes[0] = -1",
     "split_sizes[0] = -1 is negative"),
    ([2, 4], [0, 2], "sorted_index must be a permutation of 0..1, got sorted_index[1] = 2",
     "sorted_index[1] = 2 is outside 0..S-1"),
]


@pytest.mark.parametrize("sizes,order,message,report", BAD_INDICES, ids=["repeat", "sum_past_rows",
                                                                         "negative", "out_of_range"])
def test_bad_indices_raise_on_cpu_and_give_the_identity_on_cuda(device, sizes, order, message, report):
    x = torch.randn(6, 4, device=device)
    s_t, o_t = index_tensors(sizes, order, device)
    out = expect_rejected(device, lambda: fusedops.sort_chunks_by_idx(x, s_t, o_t)[0],
                          "sort_chunks_by_idx: " + message, "sort_chunks_by_idx: " + report)
    if out is not None:
        assert_bitwise(out, x, "the identity for bad indices")
    for call in (lambda: fusedops.moe_sort_chunks_by_index(x, s_t, o_t),
                 lambda: fusedops.sort_chunks_by_idxs(x, s_t, o_t)[0]):
        out = expect_rejected(device, call, message, report)
        if out is not None:
            assert_bitwise(out, x, "the identity for bad indices")
    row_id_map = expect_rejected(device, lambda: sc.make_chunk_sort_map(s_t, o_t, 6, len(sizes)),
                                 "make_chunk_sort_map: " + message, "make_chunk_sort_map: " + report)
    if row_id_map is not None:
        assert row_id_map.tolist() == list(range(6))


@pytest.mark.parametrize("is_forward", [True, False], ids=["scatter", "gather"])
def test_bad_row_maps_raise_on_cpu_and_stay_defined_on_cuda(device, is_forward):
    x = torch.randn(6, 4, device=device)
    dup = torch.tensor([0, 1, 2, 3, 4, 4], dtype=torch.int32, device=device)
    oob = torch.tensor([0, 1, 2, 3, 4, 9], dtype=torch.int32, device=device)
    call = lambda m: sc.sort_chunks_by_map(x, m, None, 6, 4, is_forward)[0]  # noqa: E731
    out = expect_rejected(device, lambda: call(oob),
                          "sort_chunks_by_map: row_id_map must be a permutation of 0..5, got row_id_map[5] = 9",
                          "sort_chunks_by_map: row_id_map[5] = 9 is outside [0, N)")
    if out is not None:  # rows 0..4 moved; the entry out of range is skipped (scatter) or zero (gather)
        assert_bitwise(out[:5], x[:5], "in-range rows")
        if not is_forward:
            assert_bitwise(out[5], torch.zeros_like(x[5]), "gather from a bad entry")
    if is_forward:
        out = expect_rejected(device, lambda: call(dup),
                              "sort_chunks_by_map: row_id_map must be a permutation of 0..5, got 4 twice",
                              "sort_chunks_by_map: row_id_map is not a permutation: row 4 is the "
                              "target of more than one entry")
        if out is not None:  # the row nothing reaches is zero
            assert_bitwise(out[:4], x[:4], "rows reached once")
            assert_bitwise(out[5], torch.zeros_like(x[5]), "the row nothing reaches")
    elif device == "cpu":
        with pytest.raises(ValueError, match="got 4 twice"):
            call(dup)
    else:  # a gather through a repeated entry reads in bounds: a defined result, nothing to report
        assert_bitwise(call(dup)[5], x[4], "gather through a repeated entry")


def test_validation_mode_accepts_good_indices(device):
    x = torch.randn(6, 4, device=device)
    s_t, o_t = index_tensors([2, 0, 4], [2, 1, 0], device)
    with fusedops.debug_checks():
        out, _ = fusedops.sort_chunks_by_idx(x, s_t, o_t)
    assert_bitwise(out, composite(x, [2, 0, 4], [2, 1, 0])[0], "validated")


def test_bad_arguments_raise(device, devices):
    x = torch.randn(6, 4, device=device)
    s_t, o_t = index_tensors([2, 4], [1, 0], device)
    with pytest.raises(ValueError, match=r"sort_chunks_by_idx: inp must have rank 2, got rank 3 with shape \[2,3,4\]"):
        fusedops.sort_chunks_by_idx(torch.randn(2, 3, 4, device=device), s_t, o_t)
    with pytest.raises(ValueError, match="split_sizes and sorted_index must have the same number of elements, got 2 and 3"):
        fusedops.sort_chunks_by_idx(x, s_t, torch.tensor([1, 0, 2], device=device))
    with pytest.raises(ValueError, match=r"probs must have shape \[6\] \(\[N\], N = rows of inp\), got \[5\]"):
        fusedops.sort_chunks_by_idx(x, s_t, o_t, torch.rand(5, device=device))
    with pytest.raises(TypeError, match=r"split_sizes must have dtype in \{int32, int64\}, got float32"):
        fusedops.sort_chunks_by_idx(x, s_t.float(), o_t)
    with pytest.raises(ValueError, match=r"num_splits \(3\) must equal the number of split_sizes \(2\)"):
        sc.make_chunk_sort_map(s_t, o_t, 6, 3)
    with pytest.raises(ValueError, match=r"inp must have shape \[num_tokens, hidden_size\]=\[6,5\], got \[6,4\]"):
        sc.sort_chunks_by_map(x, torch.arange(6, dtype=torch.int32, device=device), None, 6, 5, True)
    if "cuda" in devices:
        other = "cpu" if device == "cuda" else "cuda"
        with pytest.raises(ValueError, match=f"split_sizes must be on {device}.*got {other}"):
            fusedops.sort_chunks_by_idx(x, s_t.to(other), o_t)
        with pytest.raises(ValueError, match=f"probs must be on {device}.*got {other}"):
            fusedops.sort_chunks_by_idx(x, s_t, o_t, torch.rand(6, device=other))


# ---------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile.


@pytest.mark.parametrize("with_probs", [False, True])
def test_opcheck(device, with_probs):
    x = torch.randn(13, 8, device=device, requires_grad=True)
    probs = torch.rand(13, device=device, requires_grad=True) if with_probs else None
    s_t, o_t = index_tensors([4, 0, 6, 3], [3, 1, 0, 2], device)
    torch.library.opcheck(torch.ops.fusedops.sort_chunks_by_idx_fwd.default, (x, s_t, o_t, probs))
    row_id_map = sc.make_chunk_sort_map(s_t, o_t, 13, 4)
    torch.library.opcheck(torch.ops.fusedops.sort_chunks_by_idx_bwd.default,
                          (torch.randn(13, 8, device=device), probs.detach() if with_probs else None,
                           row_id_map))
    torch.library.opcheck(torch.ops.fusedops.make_chunk_sort_map.default, (s_t, o_t, 13))
    torch.library.opcheck(torch.ops.fusedops.sort_chunks_by_map.default, (x, row_id_map, probs, True))


def test_torch_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    sizes, order = [5, 0, 7, 4], [2, 3, 1, 0]
    s_t, o_t = index_tensors(sizes, order, device)

    def f(x, probs):
        out, po = fusedops.sort_chunks_by_idx(x, s_t, o_t, probs)
        return out, (out.float() * 2).sum() + (po * 3).sum()

    x = torch.randn(16, 24, device=device, dtype=torch.bfloat16)
    probs = torch.rand(16, device=device)
    xe, pe = x.clone().requires_grad_(), probs.clone().requires_grad_()
    xc, pc = x.clone().requires_grad_(), probs.clone().requires_grad_()
    oe, le = f(xe, pe)
    le.backward()
    oc, lc = torch.compile(f, fullgraph=True, backend="aot_eager")(xc, pc)
    lc.backward()
    assert_bitwise(oc, oe, "out")
    assert_bitwise(xc.grad, xe.grad, "d_inp")
    assert_bitwise(pc.grad, pe.grad, "d_probs")
