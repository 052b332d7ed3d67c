"""``fla.modules.l2norm``: FLA's alias of ``fla.modules.norm.l2norm``."""

from .norm.l2norm import *  # noqa: F401,F403
from .norm.l2norm import __all__  # noqa: F401
