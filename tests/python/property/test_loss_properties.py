"""Property-based tests (hypothesis) of fused_cross_entropy_loss and chunk_loss: random row counts
(around the 64-row chunks), vocabularies (1, primes, vector boundaries +-1), dtypes, strided rows
and every option (ignore_index rows, loss weights, reduction, label smoothing, logit scale,
softcapping, z-loss; chunk sizes), loss and every gradient against the float64 reference under
the precision policy."""

from __future__ import annotations

import fusedops
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.python.property.common import (
    DTYPES,
    SETTINGS,
    check_against_reference,
    composite_of,
    dim,
    normal,
    strided,
)

CE = composite_of("test_cross_entropy")
CHUNK = composite_of("test_chunk_loss")


def labels_of(n: int, vocab: int, ignored: int, device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, vocab, (n,), generator=g)
    if ignored:
        y[::ignored] = -100
    return y.to(device)


OPTIONS = st.fixed_dictionaries({
    "label_smoothing": st.sampled_from([0.0, 0.1]),
    "logit_scale": st.sampled_from([1.0, 0.5]),
    "softcap": st.sampled_from([None, 30.0]),
    "lse_square_scale": st.sampled_from([0.0, 1e-4]),
})


@SETTINGS
@given(N=dim(130), V=dim(700), dtype=DTYPES, layout=st.sampled_from(["dense", "rows"]),
       ignored=st.sampled_from([0, 3]), weighted=st.booleans(),
       reduction=st.sampled_from(["mean", "sum", "none"]), opts=OPTIONS, seed=st.integers(0, 2**20))
def test_fused_cross_entropy_loss(device, N, V, dtype, layout, ignored, weighted, reduction, opts,
                                  seed):
    logits = strided(normal((N, V), dtype, device, seed, 3.0), layout)
    labels = labels_of(N, V, ignored, device, seed)
    inputs = {"z": logits, "w": (0.5 + torch.rand(N, generator=torch.Generator().manual_seed(seed)))
              .to(device) if weighted else None}
    kw = dict(reduction=reduction, label_smoothing=opts["label_smoothing"], logit_scale=opts["logit_scale"],
              lse_square_scale=opts["lse_square_scale"])
    softcap = opts["softcap"]
    check_against_reference(
        f"fused_cross_entropy_loss [{N},{V}] {dtype} {layout} ignored {ignored} weighted {weighted} "
        f"{kw} softcap {softcap} seed {seed}",
        lambda z, w: fusedops.fused_cross_entropy_loss(z, labels, w, logit_softcapping=softcap, **kw),
        lambda z, w: CE(z, labels, w, logit_softcapping=softcap, **kw)[0],
        lambda z, w: fusedops.reference.fused_cross_entropy_loss(z, labels, w, logit_softcapping=softcap, **kw),
        inputs, [k for k, v in inputs.items() if v is not None], seed)


@SETTINGS
@given(N=dim(200), H=dim(48), V=dim(300), dtype=DTYPES, layout=st.sampled_from(["dense", "rows"]),
       ignored=st.sampled_from([0, 4]), reduction=st.sampled_from(["sum", "mean"]),
       chunk=st.sampled_from([None, 1, 63, 64, 65]), alpha=st.sampled_from([None, 2.0]), opts=OPTIONS,
       seed=st.integers(0, 2**20))
def test_chunk_loss(device, N, H, V, dtype, layout, ignored, reduction, chunk, alpha, opts, seed):
    hidden = strided(normal((N, H), dtype, device, seed), layout)
    weight = normal((V, H), dtype, device, seed + 1, 0.3)
    labels = labels_of(N, V, ignored, device, seed)
    kw = dict(reduction=reduction, alpha=alpha, label_smoothing=opts["label_smoothing"],
              lse_square_scale=opts["lse_square_scale"], logit_scale=opts["logit_scale"])
    softcap = opts["softcap"]
    check_against_reference(
        f"chunk_loss [{N},{H}] V {V} {dtype} {layout} ignored {ignored} chunk {chunk} {kw} "
        f"softcap {softcap} seed {seed}",
        lambda h, w: fusedops.chunk_loss(h, w, labels, chunk_size=chunk, softcap=softcap, **kw),
        lambda h, w: CHUNK(h, w, labels, softcap=softcap, **kw)[0],
        lambda h, w: fusedops.reference.chunk_loss(h, w, labels, softcap=softcap, **kw),
        {"h": hidden, "w": weight}, ["h", "w"], seed)
