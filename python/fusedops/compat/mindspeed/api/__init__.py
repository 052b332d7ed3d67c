"""``mindspeed_ops.api``."""

from . import atb, triton  # noqa: F401
