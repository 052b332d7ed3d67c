"""Drop-in call forms of other libraries, mapped onto the native fusedops operators.

* :mod:`fusedops.compat.fla` — flash-linear-attention 0.6.0's import paths (``fla.ops...``,
  ``fla.modules...``), positional order, keywords, defaults, return arity and module math;
* :mod:`fusedops.compat.causal_conv1d` — the ``causal-conv1d`` package's ``causal_conv1d_fn``
  and ``causal_conv1d_update`` (``[B, D, T]`` layout, ``[D, W]`` weight);
* :mod:`fusedops.compat.mindspeed` — MindSpeed Ops' ``mindspeed_ops.api...`` call forms and
  ``torch.ops.mindspeed_ops.*``.

These modules contain no math: argument reordering, layout transposes, unit conversions of the
gates that FLA's sub-operators keep in log2 units, accepted-but-ignored arguments and clear
errors for what fusedops does not support (docs/compat.md lists every name).

Callers that cannot edit their imports call :func:`install` once, before anything imports the
original package::

    import fusedops.compat
    fusedops.compat.install("fla")            # then `import fla...` resolves to fusedops
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

__all__ = ["install", "uninstall", "installed", "PACKAGES"]

#: original top-level module name -> the fusedops package that answers to it
PACKAGES = {
    "fla": "fusedops.compat.fla",
    "causal_conv1d": "fusedops.compat.causal_conv1d",
    "mindspeed_ops": "fusedops.compat.mindspeed",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``alias`` and ``alias.x.y`` to the module objects of ``target`` and
    ``target.x.y`` (the same objects, registered under both names)."""

    def __init__(self, alias: str, target: str) -> None:
        self.alias = alias
        self.target = target

    def _real_name(self, fullname: str) -> str | None:
        if fullname == self.alias:
            return self.target
        if fullname.startswith(self.alias + "."):
            return self.target + fullname[len(self.alias):]
        return None

    def find_spec(self, fullname, path=None, target=None):
        real_name = self._real_name(fullname)
        if real_name is None:
            return None
        try:
            real = importlib.import_module(real_name)
        except ModuleNotFoundError as e:
            if e.name == real_name:
                return None  # not mirrored: the normal "No module named ..." error follows
            raise
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=hasattr(real, "__path__"))
        spec.loader_state = real.__spec__
        return spec

    def create_module(self, spec):
        return sys.modules[spec.loader_state.name]

    def exec_module(self, module):
        # module_from_spec gave the (already executed) module the alias spec; it keeps its own.
        alias_spec = module.__spec__
        if alias_spec is not None and alias_spec.loader is self:
            module.__spec__ = alias_spec.loader_state


_FINDERS: dict[str, _AliasFinder] = {}


def _is_ours(module, name: str) -> bool:
    return getattr(module, "__name__", "").startswith(PACKAGES[name])


def install(name: str) -> None:
    """Make ``import <name>`` (and every ``<name>.x.y`` that fusedops mirrors) resolve to the
    matching ``fusedops.compat`` package: ``"fla"``, ``"causal_conv1d"`` or
    ``"mindspeed_ops"``. Idempotent. Raises ``RuntimeError`` when the original package is
    already imported (its modules would mix with fusedops'); install first."""
    if name not in PACKAGES:
        raise ValueError(f"fusedops.compat.install: unknown package {name!r}; known: "
                         f"{', '.join(sorted(PACKAGES))}")
    if name in _FINDERS:
        return
    clash = [m for k, m in sys.modules.items()
             if (k == name or k.startswith(name + ".")) and m is not None and not _is_ours(m, name)]
    if clash:
        where = getattr(clash[0], "__file__", None) or "?"
        raise RuntimeError(
            f"fusedops.compat.install({name!r}): the original package {name!r} is already "
            f"imported (module {clash[0].__name__} from {where}); call install() before anything "
            f"imports {name!r}, or import {PACKAGES[name]} directly instead")
    finder = _AliasFinder(name, PACKAGES[name])
    sys.meta_path.insert(0, finder)
    _FINDERS[name] = finder


def uninstall(name: str) -> None:
    """Undo :func:`install`: remove the finder and the ``<name>`` entries it put in
    ``sys.modules`` (the fusedops modules themselves stay imported)."""
    finder = _FINDERS.pop(name, None)
    if finder is None:
        return
    sys.meta_path.remove(finder)
    for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[k]


def installed() -> list[str]:
    """The names :func:`install` currently answers for."""
    return sorted(_FINDERS)
