"""oneDNN's library for the extension (imported before fusedops._C).

The CPU GEMMs are oneDNN's (libdnnl.so.3, PyPI's onednn-cpu-gomp). A binary wheel carries its own
copy. A source build looks for it on its run-time search path: <prefix>/lib beside the
interpreter's site-packages, where pip puts the package's library, then the folder the build found
it in. Where neither has it (a venv that sees the package in its base installation, a user install,
a build environment that is gone) the extension fails to load; the library of the installed
package is then loaded first and serves the extension's dependency by its soname.
"""

import ctypes
import importlib
import importlib.metadata


def library():
    """Where pip put libdnnl.so.3 of the onednn-cpu-gomp package (None without it)."""
    try:
        dist = importlib.metadata.distribution("onednn-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "libdnnl.so.3":
            return dist.locate_file(f)
    return None


def _ensure_loaded() -> None:
    try:
        importlib.import_module("fusedops._C")
    except ImportError as e:
        path = library() if "libdnnl" in str(e) else None
        if path is None:
            raise
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


_ensure_loaded()
