"""The transformers versions fusedops.transformers is written and tested against."""

from __future__ import annotations

import re

# The modeling files this package patches change between minor releases, so the range is one
# minor series; pyproject.toml's `transformers` extra and tools/requirements-dev.txt pin the same.
SUPPORTED_RANGE = ">=5.23.0,<5.24"
_LOW, _HIGH = (5, 23, 0), (5, 24, 0)


def _parse(version: str) -> tuple:
    """(major, minor, patch) of a version string ("5.23.0", "5.24.0rc1", "5.23.0.dev0")."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if m is None:
        return (0, 0, 0)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def check_transformers() -> str:
    """The installed transformers version; ImportError naming the supported range when it is
    missing or outside it."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"fusedops.transformers needs transformers {SUPPORTED_RANGE}: "
                          f"pip install 'fusedops[transformers]'") from e
    version = getattr(transformers, "__version__", None)
    if version is None:  # a directory named transformers on sys.path, not the package
        raise ImportError(f"fusedops.transformers needs transformers {SUPPORTED_RANGE}: "
                          f"pip install 'fusedops[transformers]'")
    if not _LOW <= _parse(version) < _HIGH:
        raise ImportError(f"fusedops.transformers supports transformers {SUPPORTED_RANGE}, found "
                          f"{version}: pip install 'transformers{SUPPORTED_RANGE}'")
    return version
