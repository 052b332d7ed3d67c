"""``mindspeed_ops.utils``."""

__all__ = ["is_arch35"]


def is_arch35() -> bool:
    """Whether the device is an Ascend arch35 chip: never, here."""
    return False
