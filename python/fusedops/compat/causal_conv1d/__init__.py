"""The ``causal-conv1d`` package's API (``causal_conv1d_fn``, ``causal_conv1d_update``) on
fusedops; ``fusedops.compat.install("causal_conv1d")`` makes ``import causal_conv1d`` resolve
here."""

__version__ = "1.7.0"

from .causal_conv1d_interface import causal_conv1d_fn, causal_conv1d_update  # noqa: E402

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]
