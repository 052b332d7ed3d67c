"""``mindspeed_ops.api.triton.clipped_swiglu``: GPT-OSS's clamped SwiGLU (CANN's
``clipped_swiglu`` signature)."""

from fusedops.ops.clipped_swiglu import clipped_swiglu, clipped_swiglu_grad

__all__ = ["clipped_swiglu", "clipped_swiglu_grad"]
