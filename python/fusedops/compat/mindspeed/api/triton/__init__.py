"""``mindspeed_ops.api.triton``."""
