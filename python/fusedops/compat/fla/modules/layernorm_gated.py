"""``fla.modules.layernorm_gated``: FLA's alias of ``fla.modules.norm.layernorm_gated``."""

from .norm.layernorm_gated import *  # noqa: F401,F403
from .norm.layernorm_gated import __all__  # noqa: F401
