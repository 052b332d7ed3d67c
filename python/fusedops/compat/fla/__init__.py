"""flash-linear-attention 0.6.0's public import paths for what fusedops implements.

``fusedops.compat.fla.X`` answers to ``fla.X`` (``fusedops.compat.install("fla")`` makes the
``fla`` name itself resolve here). Each function and module has FLA 0.6.0's positional order,
keyword names, defaults, return arity and math; see docs/compat.md for the table of mirrored
names and of the FLA arguments that are accepted and ignored or rejected.
"""

__version__ = "0.6.0"

from . import modules, ops  # noqa: E402

__all__ = ["modules", "ops"]
