"""The torch-layer tests whose logic is the same for both linear-attention families, the gated delta
rule (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule; one log-decay per value head,
g [B,T,HV]) and KDA (chunk_kda, fused_recurrent_kda; one per key channel, g [B,T,HV,K]), written
once and run for each family (test ids ``gdn`` / ``kda``):

* the per-token form against the float64 recurrence (with g, beta and an initial state, varlen
  too; and bare: no g, no beta, the in-kernel l2norm);
* the chunk and per-token forms agree;
* structure: varlen equals the separate sequences, a prefix then a suffix equals the whole,
  non-contiguous inputs equal contiguous ones, state_v_first is a transpose, empty inputs;
* bitwise repeats of the backward, the float64 reference module, torch.compile (fullgraph);
* a cu_seqlens not ending at T raises on every device; CUDA-graph capture of forward + backward.

What differs between the families is their test module's ``FAMILY`` (tests.common.linear_attention.
Family): the top levels, make_inputs, run_ours, run_composite (the oracle and the family's
chunked base, written in test_gated_delta_rule.py / test_kda.py), the per-token form called as
the chunk form, the backend forcing. Where the two copies of a test differed in a detail (a chunk
size, a seed, the options of a case, an extra case), the parameters below keep each family's. The
tests that only one family has stay in its module.
"""

from __future__ import annotations

import fusedops
import pytest
import test_gated_delta_rule as gdn_tests
import test_kda as kda_tests
import torch
from fusedops._backend import context

from tests.common.linear_attention import (
    BITWISE,
    DIFF,
    check,
    compare_all,
    l2n,
    leaves,
    recurrence,
    spec_ratio,
)
from tests.common.tolerance import max_abs_error

# Each family test module's FAMILY (the modules import by name: pytest's default import mode puts
# tests/python/ops on sys.path, as test_extreme_gates_gdn.py / test_extreme_gates_kda.py rely on).
GDN, KDA = gdn_tests.FAMILY, kda_tests.FAMILY
FAMILIES = (GDN, KDA)


@pytest.fixture(params=FAMILIES, ids=[f.name for f in FAMILIES])
def fam(request):
    """The family a test runs for (a test that parametrizes ``fam`` itself replaces this)."""
    return request.param


# ---------------------------------------------------------------------------------------------
# The per-token form against the oracle; the two forms agree.


# (B, T, V, cu_seqlens): sequences of several tokens, then decoding steps (one token per sequence:
# the CUDA forward's form for B T = N), with V % 4 == 0 (the float32 state moved by float4) and not;
# the last ones with V over 32 (cuda_sm90's backward: a cluster of 32-column tiles) and sequences
# past the CUDA backwards' checkpoint segments (cuda_sm80: 64 tokens; cuda_sm90: 16, the
# checkpoints in the workspace, slot = packed index / 16): T = 70, and packed sequences of 1, 17,
# 35, 67 and 3 tokens starting off the 16-token grid, and two rows of 50.
RECURRENT_SHAPES = [(2, 30, 12, None), (1, 30, 12, [0, 9, 9, 30]), (3, 1, 12, None), (3, 1, 10, None),
                    (1, 3, 12, [0, 1, 2, 3]), (4, 1, 64, None), (1, 70, 70, [0, 5, 70]),
                    (1, 123, 40, [0, 1, 18, 53, 120, 123]), (2, 50, 36, None)]


def test_recurrent_backward_workspace(fam, device):
    """The per-token backward's workspace (the checkpoint states of cuda_sm90's kernel): none on the
    CPU, on GPUs other than sm_90 or for sequences of at most 16 tokens; on an sm_90 GPU ceil(B T /
    16) fp32 [K, V] states per value head (B T: the packed length with cu_seqlens, where a sequence
    may be that long), and a call that needs it and has none is an error naming the size query."""
    op = "fused_recurrent_kda" if fam.name == "kda" else "fused_recurrent_gated_delta_rule"
    size = getattr(fusedops._C, op + "_bwd_workspace_size")
    K, HV, V = 16, 4, 12
    q = torch.zeros(2, 40, 2, K, device=device)
    v = torch.zeros(2, 40, HV, V, device=device)
    cu = torch.tensor([0, 3, 9], device=device)
    cuda = device != "cpu" and torch.cuda.get_device_capability(device) == (9, 0)
    assert size(q, v, None) == (5 * HV * K * V * 4 if cuda else 0)
    assert size(q[:, :16], v[:, :16], None) == 0
    assert size(q[:1, :9], v[:1, :9], cu) == 0  # no sequence can pass 16 tokens
    assert size(q[:1, :33], v[:1, :33], torch.tensor([0, 33], device=device)) == (3 * HV * K * V * 4 if cuda else 0)
    if not cuda:
        return
    d = fam.make_inputs(1, 40, 2, 4, K, V, torch.float32, seed=3)
    x = {n: d[n].to(device) for n in ("q", "k", "v", "g", "beta")}
    out = [torch.empty_like(x[n]) for n in ("q", "k", "v", "g", "beta")]
    bwd = getattr(fusedops._C, op + "_bwd")
    with pytest.raises(ValueError, match="workspace is required"):
        bwd(context(op, x["q"]), x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, 1.0, torch.zeros_like(x["v"]), None,
            *out, None, None)


@pytest.mark.parametrize("B,T,V,cu", RECURRENT_SHAPES, ids=lambda x: str(x).replace(" ", ""))
def test_fused_recurrent_matches_float64_recurrence(fam, device, B, T, V, cu):
    d = fam.make_inputs(B, T, 2, 4, 16, V, torch.float32, seed=5, cu=cu)
    x = leaves(d, DIFF, device=device)
    cut = None if cu is None else torch.tensor(cu, device=device)
    o, ht = fam.recurrent(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], scale=0.7, initial_state=x["h0"],
                          output_final_state=True, cu_seqlens=cut)
    names = ["q", "k", "v", "g", "beta", "h0"]
    gr = torch.autograd.grad([o, ht], [x[n] for n in names], [d["do"].to(device), d["dht"].to(device)])
    ours = (o, ht, dict(zip(names, gr)))

    def comp(dtype, d=d, cu=cu, names=names):
        y = leaves(d, DIFF, dtype)
        oo, hh = recurrence(y["q"], y["k"], y["v"], y["g"], y["beta"], 0.7, y["h0"], cu)
        gg = torch.autograd.grad([oo, hh], [y[n] for n in names], [d["do"].to(dtype), d["dht"].to(dtype)])
        return oo, hh, dict(zip(names, gg))

    compare_all(f"{device} fused_recurrent B={B} T={T} V={V} cu={cu}", ours, comp(torch.float32), comp(torch.float64), torch.float32)


def test_fused_recurrent_without_gate_and_beta_and_with_l2norm(fam, device):
    """No g, no beta (no decay, beta = 1), q and k normalized in the kernel."""
    d = fam.make_inputs(1, 20, 1, 2, 8, 8, torch.float32, seed=6, opts={"l2": True})
    x = leaves(d, ("q", "k", "v"), device=device)
    o, _ = fam.recurrent(x["q"], x["k"], x["v"], None, beta=None, use_qk_l2norm_in_kernel=True)
    gr = torch.autograd.grad(o, [x["q"], x["k"], x["v"]], d["do"].to(device))
    y = leaves(d, ("q", "k", "v"), torch.float64)
    o64, _ = recurrence(l2n(y["q"]), l2n(y["k"]), y["v"], None, None, 8 ** -0.5)
    g64 = torch.autograd.grad(o64, [y["q"], y["k"], y["v"]], d["do"].double())
    z = leaves(d, ("q", "k", "v"), torch.float32)
    ob, _ = recurrence(l2n(z["q"]), l2n(z["k"]), z["v"], None, None, 8 ** -0.5)
    gb = torch.autograd.grad(ob, [z["q"], z["k"], z["v"]], d["do"].float())
    check(f"{device} fused_recurrent bare o", o, ob, o64, torch.float32)
    for n, a, b, c in zip("qkv", gr, gb, g64):
        check(f"{device} fused_recurrent bare d{n}", a, b, c, torch.float32)


def test_chunk_and_recurrent_forms_agree(fam, device):
    d = fam.make_inputs(2, 100, 2, 2, 32, 32, torch.float32, seed=8)
    c = fam.run_ours(d, 0.2, None, {}, 64, device)
    r = fam.run_ours(d, 0.2, None, {}, 64, device, fn=fam.recurrent_as_chunk)
    assert spec_ratio(c[0], r[0]) < 2e-6 and spec_ratio(c[1], r[1]) < 2e-6
    for n in c[2]:
        assert spec_ratio(c[2][n], r[2][n]) < 1e-5, n


# ---------------------------------------------------------------------------------------------
# Structure: varlen, continuation, layouts, empty inputs.


def test_varlen_equals_separate_sequences(fam, device):
    lens = [13, 0, 64, 50]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    T = cu[-1]
    d = fam.make_inputs(1, T, 2, 4, 16, 24, torch.float32, seed=11, cu=cu)
    o, ht, g = fam.run_ours(d, 0.3, cu, {}, 32, device)
    for n, L in enumerate(lens):
        sl = slice(cu[n], cu[n + 1])
        sub = {key: (val[:, sl] if key in ("q", "k", "v", "g", "beta", "do") else val) for key, val in d.items()}
        sub["h0"] = d["h0"][n:n + 1]
        sub["dht"] = d["dht"][n:n + 1]
        if L == 0:
            # an empty sequence passes its state through
            torch.testing.assert_close(ht[n].cpu(), d["h0"][n])
            torch.testing.assert_close(g["h0"][n].cpu(), d["dht"][n])
            continue
        os_, hts, gs = fam.run_ours(sub, 0.3, None, {}, 32, device)
        torch.testing.assert_close(o[:, sl], os_, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ht[n:n + 1], hts, rtol=1e-5, atol=1e-6)
        for key in ("q", "k", "v", "g", "beta"):
            torch.testing.assert_close(g[key][:, sl], gs[key], rtol=1e-4, atol=2e-6, msg=key)
        torch.testing.assert_close(g["h0"][n:n + 1], gs["h0"], rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize("split", [40, 64])
def test_prefix_then_suffix_equals_whole(fam, device, split):
    T = 100
    d = fam.make_inputs(1, T, 2, 2, 16, 16, torch.float32, seed=12)
    whole = fam.run_ours(d, 0.3, None, {}, 64, device)
    x = leaves(d, DIFF, device=device)
    sl1, sl2 = slice(0, split), slice(split, T)
    o1, h1 = fam.chunk(x["q"][:, sl1], x["k"][:, sl1], x["v"][:, sl1], x["g"][:, sl1], x["beta"][:, sl1], 0.3,
                       x["h0"], True)
    o2, h2 = fam.chunk(x["q"][:, sl2], x["k"][:, sl2], x["v"][:, sl2], x["g"][:, sl2], x["beta"][:, sl2], 0.3, h1,
                       True)
    o = torch.cat([o1, o2], 1)
    names = ["q", "k", "v", "g", "beta", "h0"]
    gr = torch.autograd.grad([o, h2], [x[n] for n in names], [d["do"].to(device), d["dht"].to(device)])
    torch.testing.assert_close(o, whole[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h2, whole[1], rtol=1e-5, atol=1e-6)
    for n, gg in zip(names, gr):
        torch.testing.assert_close(gg, whole[2][n], rtol=1e-4, atol=2e-6, msg=n)


def test_non_contiguous_inputs_match_contiguous(fam, device):
    B, T, H, K = 2, 40, 2, 16
    d = fam.make_inputs(B, T, H, H, K, K, torch.float32, seed=13)
    qkv = torch.cat([d["q"], d["k"], d["v"]], -1).to(device)  # a fused projection's output
    q, k, v = qkv.split(K, -1)
    assert not q.is_contiguous()
    if fam.per_channel_gate:  # g [B,T,HV,K] and beta [B,T,HV] as one [B,T,HV,K+1] output
        gb = torch.cat([d["g"], d["beta"][..., None]], -1).to(device)
        gg, bb = gb[..., :K], gb[..., K]
    else:  # g and beta [B,T,HV] interleaved
        gb = torch.stack([d["g"], d["beta"]], -1).to(device)
        gg, bb = gb[..., 0], gb[..., 1]
    assert not gg.is_contiguous() and not bb.is_contiguous()
    o1, h1 = fam.chunk(q, k, v, gg, bb, 0.25, d["h0"].to(device), True)
    o2, h2 = fam.chunk(q.contiguous(), k.contiguous(), v.contiguous(), gg.contiguous(), bb.contiguous(), 0.25,
                       d["h0"].to(device), True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 16])
def test_kda_without_gate_is_gdn_without_gate(device, dtype, T):
    """Without a gate (g=None) KDA's recurrence is GDN's: no decay, the same delta rule. KDA's
    per-token form against the float64 recurrence, forward and every gradient, at K = 128 with
    16-byte aligned rows (the CUDA forward's 16-byte input stage), at a decoding step and over
    tokens. On CUDA a gateless KDA call launches GDN's kernel, so there the two agree bitwise."""
    B, H, K, V = 3, 2, 128, 64
    d = GDN.make_inputs(B, T, H, H, K, V, dtype, seed=31)
    names = ["q", "k", "v", "beta", "h0"]
    kw = dict(scale=K ** -0.5, output_final_state=True)
    x = leaves(d, names, device=device)
    o, ht = fusedops.fused_recurrent_kda(x["q"], x["k"], x["v"], None, beta=x["beta"], initial_state=x["h0"], **kw)
    gr = torch.autograd.grad([o, ht], [x[n] for n in names], [d["do"].to(device), d["dht"].to(device)])

    def comp(dt):
        y = leaves(d, names, dt)
        oo, hh = recurrence(y["q"], y["k"], y["v"], None, y["beta"], K ** -0.5, y["h0"])
        gg = torch.autograd.grad([oo, hh], [y[n] for n in names], [d["do"].to(dt), d["dht"].to(dt)])
        return oo, hh, dict(zip(names, gg))

    compare_all(f"{device} fused_recurrent_kda g=None T={T}", (o, ht, dict(zip(names, gr))), comp(dtype),
                comp(torch.float64), dtype)
    if torch.device(device).type == "cuda":
        with torch.no_grad():
            og, hg = fusedops.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], None, beta=x["beta"],
                                                               initial_state=x["h0"], **kw)
        assert torch.equal(o, og) and torch.equal(ht, hg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("which", ["q", "k", "v", "g"])
def test_recurrent_misaligned_rows_match_aligned(fam, device, dtype, T, which):
    """One input's rows start one element past a 16-byte boundary (a view of a wider buffer): the
    per-token CUDA forward then loads element by element instead of in 16-byte loads (its input
    stage takes the 16-byte loads only where q, k, v and KDA's gate are all aligned). Both stages
    must give the same output and final state bitwise, at a decoding step (T = 1) and over tokens.
    (GDN's gate [B,T,HV] is one scalar per token and head, loaded alone: its case shifts it all the
    same.)"""
    B, H, K, V = 3, 2, 16, 32
    d = fam.make_inputs(B, T, H, H, K, V, dtype, seed=21)
    x = {n: d[n].to(device) for n in ("q", "k", "v", "g", "beta", "h0")}
    t = x[which]
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device=device)
    wide[..., 1:] = t
    shifted = dict(x, **{which: wide[..., 1:]})
    assert shifted[which].data_ptr() % 16 != 0 and torch.equal(shifted[which], t)
    args = dict(scale=0.3, output_final_state=True)
    o1, h1 = fam.recurrent(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], initial_state=x["h0"], **args)
    o2, h2 = fam.recurrent(shifted["q"], shifted["k"], shifted["v"], shifted["g"], beta=x["beta"],
                           initial_state=x["h0"], **args)
    assert o1.dtype == dtype and torch.isfinite(o1).all()
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    torch.testing.assert_close(h2, h1, rtol=0, atol=0)


@pytest.mark.parametrize("recurrent", [False, True])
def test_state_v_first_is_a_transpose(fam, device, recurrent):
    d = fam.make_inputs(1, 50, 1, 2, 16, 8, torch.float32, seed=14)
    x = leaves(d, DIFF, device=device)
    fn = fam.recurrent if recurrent else fam.chunk
    o1, h1 = fn(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], scale=0.3, initial_state=x["h0"],
                output_final_state=True)
    h0t = x["h0"].detach().transpose(-1, -2).contiguous().requires_grad_()
    o2, h2 = fn(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], scale=0.3, initial_state=h0t, output_final_state=True,
                state_v_first=True)
    assert h2.shape == (1, 2, 8, 16)
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(h1, h2.transpose(-1, -2), rtol=0, atol=0)
    (dh1,) = torch.autograd.grad(h1, x["h0"], d["dht"].to(device))
    (dh2,) = torch.autograd.grad(h2, h0t, d["dht"].to(device).transpose(-1, -2))
    torch.testing.assert_close(dh1, dh2.transpose(-1, -2), rtol=0, atol=0)
    with pytest.raises(ValueError, match="not both"):
        fn(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], state_v_first=True, transpose_state_layout=True)


def test_empty_inputs(fam, device):
    d = fam.make_inputs(2, 0, 1, 1, 8, 8, torch.float32, seed=16)
    o, ht, g = fam.run_ours(d, 0.3, None, {}, 64, device)
    assert o.shape == (2, 0, 1, 8)
    torch.testing.assert_close(ht.cpu(), d["h0"])
    torch.testing.assert_close(g["h0"].cpu(), d["dht"])


# ---------------------------------------------------------------------------------------------
# Determinism and the reference module.


@pytest.mark.parametrize("fam,K,opts", [
    pytest.param(GDN, 32, {"l2": True, "gate": True}, id="gdn-K32"),
    pytest.param(GDN, 128, {"l2": True, "gate": True}, id="gdn-K128"),  # K=128: GDN's CUDA 16-bit mma kernels
    pytest.param(KDA, 32, {"l2": True, "gate": True, "sig": True}, id="kda-K32"),
])
def test_repeated_backward_is_bitwise_identical(fam, device, K, opts):
    d = fam.make_inputs(2, 130, 2, 4, K, K, torch.bfloat16, seed=17, opts=opts)
    runs = [fam.run_ours(d, 0.2, None, opts, 64, device) for _ in range(2)]
    for n in runs[0][2]:
        a, b = runs[0][2][n], runs[1][2][n]
        assert torch.equal(a.view(BITWISE[a.dtype]), b.view(BITWISE[b.dtype])), n


@pytest.mark.parametrize("V", [8, 72], ids=["V8", "V72"])  # V = 72: three V tiles on CUDA (cuda_sm90: a cluster)
def test_repeated_recurrent_backward_is_bitwise_identical(fam, device, V):
    """The per-token form's backward, called again and again on the same inputs, with its (sequence,
    head) tasks spread over the threads. KDA's CPU backward once gave dk an ulp apart in about a
    third of its calls on a 2-core Zen 5: GCC had vectorised its sums in order behind a run-time
    aliasing check, and the scalar fallback fused the multiply-adds, so the rounding followed where
    a thread's buffers were allocated (stop 64). 30 repeats there caught it every time."""
    d = fam.make_inputs(3, 40, 2, 2, 8, V, torch.float32, seed=19)
    x = {n: d[n].to(device) for n in ("q", "k", "v", "g", "beta", "h0")}
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(3, 40, 2, V, generator=gen).to(device)

    def grads():
        lv = {n: t.clone().requires_grad_() for n, t in x.items()}
        o, ht = fam.recurrent(lv["q"], lv["k"], lv["v"], lv["g"], beta=lv["beta"], scale=0.3, initial_state=lv["h0"],
                              output_final_state=True)
        return torch.autograd.grad((o * do).sum() + ht.sum(), list(lv.values()))

    first = grads()
    for _ in range(30):
        for name, a, b in zip(x, grads(), first):
            assert torch.equal(a, b), f"{fam.name} d{name} differs between repeated calls"


# chunk_size: KDA's chunk form takes 32 or 64 only.
@pytest.mark.parametrize("fam,BT", [pytest.param(GDN, 16, id="gdn"), pytest.param(KDA, 32, id="kda")])
def test_reference_module_matches_the_oracle(fam, BT):
    d = fam.make_inputs(1, 40, 1, 2, 8, 8, torch.float32, seed=18)
    x = leaves(d, DIFF)
    o, ht = fam.reference_chunk(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.5, x["h0"], True, chunk_size=BT)
    assert o.dtype == torch.float64
    o64, ht64 = recurrence(*(x[n].double() for n in ("q", "k", "v", "g", "beta")), 0.5, x["h0"].double())
    assert max_abs_error(o, o64) < 1e-12 and max_abs_error(ht, ht64) < 1e-12
    (dq,) = torch.autograd.grad(o, x["q"], d["do"].double())
    assert dq.dtype == torch.float32
    o2, _ = fam.reference_recurrent(x["q"], x["k"], x["v"], x["g"], beta=x["beta"], scale=0.5, initial_state=x["h0"])
    assert max_abs_error(o2, o64) < 1e-12


# ---------------------------------------------------------------------------------------------
# torch.compile


# GDN's on every device; KDA's on the CPU only, as its copy of this test was.
@pytest.mark.parametrize("fam,device", [pytest.param(GDN, "cpu", id="gdn-cpu"), pytest.param(GDN, "cuda", id="gdn-cuda"),
                                        pytest.param(KDA, "cpu", id="kda-cpu")], indirect=["device"])
def test_torch_compile_fullgraph_matches_eager(fam, device):
    torch._dynamo.reset()
    d = fam.make_inputs(1, 40, 2, 2, 16, 16, torch.float32, seed=31)
    chunk, recurrent = fam.chunk, fam.recurrent

    def f(q, k, v, g, beta, h0):
        o, ht = chunk(q, k, v, g, beta, 0.3, h0, True, use_qk_l2norm_in_kernel=True)
        o2, _ = recurrent(q, k, v, g, beta=beta, scale=0.3, initial_state=h0)
        return (o * o2).sum() + ht.square().sum()

    names = ("q", "k", "v", "g", "beta", "h0")
    xe, xc = leaves(d, names, device=device), leaves(d, names, device=device)
    le = f(*(xe[n] for n in names))
    ge = torch.autograd.grad(le, [xe[n] for n in names])
    lc = torch.compile(f, fullgraph=True, backend="aot_eager")(*(xc[n] for n in names))
    gc = torch.autograd.grad(lc, [xc[n] for n in names])
    assert torch.equal(le, lc)
    for a, b in zip(ge, gc):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# cu_seqlens past T; CUDA graphs.


@pytest.mark.parametrize("last", [7, 9, 4096])
def test_cu_seqlens_not_ending_at_T_raises_on_every_device(fam, device, last):
    """On a GPU the kernels cannot check cu_seqlens' values: a last entry past T would read past
    the inputs. The host copy of its values (kept per tensor) is checked against T at every call,
    of the chunk and the per-token form, also when the tensor's tables are already kept from a call
    with another T."""
    x = [t.to(device) for t in fam.small_args()]
    ok = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)

    def recurrent(q, k, v, g, beta, **kw):  # beta by keyword: GDN's order has gk, gv before it
        return fam.recurrent(q, k, v, g, beta=beta, **kw)

    fam.chunk(*x, cu_seqlens=ok)
    recurrent(*x, cu_seqlens=ok)
    bad = torch.tensor([0, 3, last], dtype=torch.int32, device=device)
    for fn in (fam.chunk, recurrent):
        with pytest.raises(ValueError, match=f"cu_seqlens must end at T=8 .*got cu_seqlens\\[2\\]={last}"):
            fn(*x, cu_seqlens=bad)
    y = [t[:, :7].contiguous() for t in x]  # the same kept tensor, now with T = 7
    with pytest.raises(ValueError, match="cu_seqlens must end at T=7 .*got cu_seqlens\\[2\\]=8"):
        fam.chunk(*y, cu_seqlens=ok)


@pytest.mark.parametrize("fam,seed", [pytest.param(GDN, 3, id="gdn"), pytest.param(KDA, 4, id="kda")])
@pytest.mark.parametrize("cu", [None, [0, 100, 100, 357, 421, 1000]], ids=["fixed", "varlen"])
def test_cuda_graph_capture_of_forward_and_backward_matches_eager(fam, seed, cu):
    """The chunk form's forward and backward replay from one CUDA graph (no host synchronization;
    workspaces from PyTorch's allocator) and give bitwise the eager outputs and gradients on new
    inputs. B * HV = 128 (sequence, value head) pairs and K = V = 128 in bf16: the fused and (on
    an H200) wgmma kernels' default choice; T = 160 ends in a partial chunk. varlen: 5 packed
    sequences (one empty), whose chunk tables the warm-up calls build on the host before the
    capture."""
    if not torch.cuda.is_available() or not fusedops.built_with_cuda():
        pytest.skip("needs a CUDA device and a CUDA build")
    from tests.common.cuda_graph import assert_linear_attention_replay_matches_eager
    kw = {} if cu is None else {"B": 1, "T": cu[-1], "cu_seqlens": cu}
    assert_linear_attention_replay_matches_eager(fam.chunk, per_channel_gate=fam.per_channel_gate, seed=seed, **kw)
