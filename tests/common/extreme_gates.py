"""Extreme gates for the chunked linear-attention families (GDN: one log-decay per value head,
KDA: one per key channel), shared by tests/python/ops/test_extreme_gates_{gdn,kda}.py.

Each setting replaces the per-step log-gates of some steps (or all of them) by a constant:
-1e4 (decay far below fp32's range), -88 (exp just above fp32's smallest normal), -104 (exp
underflows to 0 in fp32), or sets every gate to 0. The kernels must stay in the error class of
ordinary gates: every output and gradient, measured against the float64 per-token recurrence,
within 10x of the same backend's error at ordinary gates (an fp32 gate cumsum gave 1e-3 here).
The CUDA backends, whose gate cumsum is still fp32, are held to that or to the cumsum's ulp
bound, whichever is larger (`check`).
"""

from __future__ import annotations

import functools

import torch

from tests.common import tolerance

# (id, step value, fraction of steps set; 1.0 = every step; value 0.0 with 1.0 = all-zero gates)
SETTINGS = [
    ("some -1e4", -1e4, 0.15),
    ("some -88", -88.0, 0.15),
    ("some -104", -104.0, 0.15),
    ("all -1e4", -1e4, 1.0),
    ("all zero", 0.0, 1.0),
]
FACTOR = 10.0  # allowed ratio to the ordinary-gate error
ULP_FP32 = 2.0**-23
SHAPE = dict(B=2, T=70, H=1, HV=2, K=16, V=16)  # chunk 32: two full chunks and a partial one
BT = 32


def extreme(g: torch.Tensor, value: float, fraction: float, seed: int = 0) -> torch.Tensor:
    """g with `fraction` of its steps (whole tokens of a head: every channel of a KDA gate) set to
    `value`."""
    g = g.clone()
    if fraction >= 1.0:
        g.fill_(value)
        return g
    gen = torch.Generator().manual_seed(seed + 11)
    m = torch.rand(g.shape[:3], generator=gen) < fraction
    if g.dim() == 4:
        m = m[..., None].expand_as(g)
    g[m] = value
    return g


def relative_errors(ours, ref) -> dict:
    """{name: max-abs error / max(1, max|ref|)} of o, final_state and every gradient."""
    o, ht, grads = ours
    o64, ht64, g64 = ref
    out = {"o": (o, o64), "final_state": (ht, ht64)}
    out.update({"d" + n: (grads[n], g64[n]) for n in grads})
    return {n: tolerance.max_abs_error(a, r) / tolerance.scale_of(r) for n, (a, r) in out.items()}


def make_runner(fam):
    """errors(backend_case, setting) for a family module (its make_inputs, forced, run_ours and
    run_composite); the float64 oracles are computed once per (dtype, setting)."""

    @functools.cache
    def inputs_and_oracle(dtype, value, fraction):
        s = SHAPE
        d = fam.make_inputs(s["B"], s["T"], s["H"], s["HV"], s["K"], s["V"], dtype, seed=7)
        if value is not None:
            d["g"] = extreme(d["g"], value, fraction)
        ref = fam.run_composite(d, s["K"] ** -0.5, None, {}, BT, torch.float64, kind="recurrent")
        return d, ref

    def errors(bc, value, fraction):
        """(errors, largest |chunk-local cumsum| of the gates passed)."""
        d, ref = inputs_and_oracle(bc.dtype, value, fraction)
        with fam.forced(bc.backend):
            ours = fam.run_ours(d, SHAPE["K"] ** -0.5, None, {}, BT, bc.device)
        return relative_errors(ours, ref), max_chunk_cumsum(d["g"])

    return errors


def max_chunk_cumsum(g: torch.Tensor) -> float:
    """The largest |chunk-local cumsum| (chunks of BT along T) of log-gates g [B, T, ...]."""
    B, T = g.shape[:2]
    pad = (-T) % BT
    x = torch.nn.functional.pad(g.double().movedim(1, -1), (0, pad)).reshape(
        *g.shape[:1], *g.shape[2:], -1, BT
    )
    return float(x.cumsum(-1).abs().max()) if x.numel() else 0.0


def check(tag, bc, errors_fn, value, fraction):
    """Every output's error at the setting within FACTOR of its error at ordinary gates (or of
    the dtype's floor, when the ordinary error is smaller). The CUDA backends keep the chunk-local
    gate cumsum in fp32 (a known issue, in the family READMEs): each in-chunk difference then
    carries up to one ulp of the largest cumsum magnitude M in its chunk, so their bound is the
    larger of that and M * 2^-23 (exp's relative error for such a difference)."""
    base, _ = errors_fn(bc, None, 0.0)
    ext, M = errors_fn(bc, value, fraction)
    floor = tolerance.floor_for(bc.dtype)
    fp32_cumsum = str(bc.device).startswith("cuda")
    bad = []
    for n, e in ext.items():
        bound = FACTOR * max(base[n], floor)
        if fp32_cumsum:
            bound = max(bound, M * ULP_FP32)
        tolerance.report(f"{tag} {n} (ordinary gates {base[n]:.2e})", e, base[n], e, bound)
        if not e <= bound:  # also catches NaN
            bad.append(
                f"{n}: {e:.2e} > {bound:.2e} = {FACTOR:g} x max(ordinary {base[n]:.2e}, floor {floor:.1e})"
                + (f" or M x 2^-23, M = {M:.3g}" if fp32_cumsum else "")
            )
    assert not bad, f"{tag}: " + "; ".join(bad)
