"""``fla.modules.causal_conv1d``."""

from .ops import ShortConvolution, causal_conv1d, causal_conv1d_update

__all__ = ["ShortConvolution", "causal_conv1d", "causal_conv1d_update"]
