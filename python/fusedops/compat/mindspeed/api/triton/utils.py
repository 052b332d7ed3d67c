"""``mindspeed_ops.api.triton.utils``."""

import torch

__all__ = ["get_available_device"]


def get_available_device() -> str:
    """``"cuda"`` when a CUDA device is available, else ``"cpu"`` (MindSpeed: ``"npu"``)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
