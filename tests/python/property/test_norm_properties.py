"""Property-based tests (hypothesis) of rmsnorm_without_weight, l2norm and rms_norm_gated: random
shapes (1, primes, vector and block boundaries +-1), dtypes, layouts, eps and gate options,
forward and every gradient against the float64 reference under the precision policy."""

from __future__ import annotations

import fusedops
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

EPS = st.sampled_from([1e-6, 1e-12, 1e-2])
# Imported here, not inside a test (the modules define @given tests of their own).
RMSNORM, L2NORM, GATED = (composite_of(m) for m in ("test_rmsnorm", "test_l2norm", "test_rmsnorm_gated"))


@SETTINGS
@given(rows=dim(40), D=dim(300), dtype=DTYPES, layout=LAYOUTS, eps=EPS, seed=st.integers(0, 2**20))
def test_rmsnorm_without_weight(device, rows, D, dtype, layout, eps, seed):
    x = strided(normal((rows, D), dtype, device, seed), layout)
    composite = RMSNORM
    check_against_reference(
        f"rmsnorm_without_weight [{rows},{D}] {dtype} {layout} eps {eps} seed {seed}",
        lambda x: fusedops.rmsnorm_without_weight(x, eps, True),
        lambda x: composite(x, eps, True),
        lambda x: fusedops.reference.rmsnorm_without_weight(x, eps, True),
        {"x": x}, ["x"], seed)


@SETTINGS
@given(rows=dim(40), D=dim(300), dtype=DTYPES, layout=LAYOUTS, eps=EPS, seed=st.integers(0, 2**20))
def test_l2norm(device, rows, D, dtype, layout, eps, seed):
    x = strided(normal((rows, D), dtype, device, seed), layout)
    composite = L2NORM
    check_against_reference(
        f"l2norm [{rows},{D}] {dtype} {layout} eps {eps} seed {seed}",
        lambda x: fusedops.l2norm(x, eps), lambda x: composite(x, eps)[0],
        lambda x: fusedops.reference.l2norm(x, eps), {"x": x}, ["x"], seed)


@SETTINGS
@given(rows=dim(24), groups=st.sampled_from([1, 2, 4]), gsize=dim(96), dtype=DTYPES,
       layout=LAYOUTS, gate=st.sampled_from(["none", "silu", "sigmoid", "gate_first"]),
       affine=st.booleans(), seed=st.integers(0, 2**20))
def test_rms_norm_gated(device, rows, groups, gsize, dtype, layout, gate, affine, seed):
    D = groups * gsize
    x = strided(normal((rows, D), dtype, device, seed), layout)
    z = None if gate == "none" else normal((rows, D), dtype, device, seed + 1)
    w = normal((D,), dtype, device, seed + 2) if affine else None
    b = normal((D,), dtype, device, seed + 3) if affine else None
    kw = dict(eps=1e-6, group_size=gsize if groups > 1 else None, norm_before_gate=gate != "gate_first",
              activation="sigmoid" if gate == "sigmoid" else "silu")
    composite = GATED
    inputs = {"x": x, "z": z, "w": w, "b": b}
    check_against_reference(
        f"rms_norm_gated [{rows},{D}] groups {groups} {dtype} {layout} {gate} affine {affine} seed {seed}",
        lambda x, z, w, b: fusedops.rms_norm_gated(x, z, w, b, **kw),
        lambda x, z, w, b: composite(x, z, w, b, **kw)[0],
        lambda x, z, w, b: fusedops.reference.rms_norm_gated(x, z, w, b, **kw),
        inputs, [k for k in ("x", "z", "w", "b") if inputs[k] is not None], seed)
