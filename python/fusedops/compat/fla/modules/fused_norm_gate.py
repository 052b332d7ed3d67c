"""``fla.modules.fused_norm_gate``: FLA's alias of ``fla.modules.norm.fused_norm_gate``."""

from .norm.fused_norm_gate import *  # noqa: F401,F403
from .norm.fused_norm_gate import __all__  # noqa: F401
