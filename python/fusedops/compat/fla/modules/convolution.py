"""``fla.modules.convolution``: FLA's alias of the short-convolution names."""

from .causal_conv1d.ops import *  # noqa: F401,F403
from .causal_conv1d.ops import __all__  # noqa: F401
