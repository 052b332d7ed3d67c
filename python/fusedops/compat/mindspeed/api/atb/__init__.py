"""``mindspeed_ops.api.atb``."""
