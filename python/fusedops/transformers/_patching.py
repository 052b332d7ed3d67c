"""How fusedops goes into a transformers model (the machinery behind every ``apply_fusedops_to_*``).

* **On a model** (``model=``): each module whose class one of the model's rules names gets its
  ``__class__`` switched to a fusedops subclass of that very class (same parameters, buffers and
  state-dict keys; ``isinstance`` still holds; ``__name__`` is kept so that ``save_pretrained``
  and ``_no_split_modules`` see the transformers name, ``repr`` shows ``Fusedops<Name>``). Only
  this model changes; other models in the process keep transformers' code. MoE experts go
  through transformers' experts registry (``set_experts_implementation("fusedops")``).
* **Before construction** (no ``model``): a hook on the model family's ``PreTrainedModel.post_init``
  applies the same per-model patch to every model of that family built afterwards
  (``from_config``, ``from_pretrained``, direct construction).
* :func:`revert` undoes either: the original classes come back, the experts implementation that
  was set before, and the construction hooks are removed.

Applying again replaces the previous choice of switches (it does not stack).
"""

from __future__ import annotations

import functools
import importlib
import types
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ._version import check_transformers

# (base class, attribute overrides key) -> fused subclass
_SUBCLASSES: dict = {}
# spec name -> (PreTrainedModel class, the post_init it had in its own __dict__ or None)
_HOOKS: dict = {}


@dataclass(frozen=True)
class ModelSpec:
    """What ``apply_fusedops_to_<name>`` does.

    ``swaps`` maps a class name of the modeling module to ``build(base_cls, on) -> dict | None``:
    the attributes of the fused subclass for the active switches ``on`` (None: the class stays).
    ``experts`` maps the experts class names that take the registered "fusedops" implementation
    (under the ``experts`` switch) to ``gate(module) -> clipped_swiglu kwargs | None``.
    """

    name: str
    model_types: tuple
    module: str
    pretrained: str
    switches: tuple
    swaps: dict = field(default_factory=dict)
    experts: dict = field(default_factory=dict)

    def modeling(self):
        return importlib.import_module(self.module)


def fused_class(base: type, attrs: dict) -> type:
    """The fusedops subclass of ``base`` with ``attrs`` (cached: the same attrs give the same
    class, so re-applying does not multiply classes)."""
    key = (base, tuple(sorted((k, id(v)) for k, v in attrs.items())))
    entry = _SUBCLASSES.get(key)
    if entry is None:
        body = dict(attrs)
        body.update(_fusedops_base=base, __module__=base.__module__, __qualname__=base.__qualname__,
                    _get_name=lambda self: "Fusedops" + base.__name__)
        # the class holds attrs, whose ids are in the key, alive
        entry = _SUBCLASSES[key] = type(base.__name__, (base,), body)
    return entry


def base_class(module: torch.nn.Module) -> type:
    return getattr(type(module), "_fusedops_base", type(module))


def with_kernels(func: Callable, slots: dict) -> Callable:
    """``func`` (a forward as transformers wrote it, possibly wrapped by decorators that use
    ``functools.wraps``) with the module-level kernel functions named in ``slots`` replaced:
    the same code, reading its globals from a copy of its module's namespace with those names
    rebound. Decorator wrappers are rebuilt around the new inner function."""
    chain = [func]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    inner = chain[-1]
    glb = dict(inner.__globals__)
    glb.update(slots)
    new = _copy_function(inner, glb, inner.__closure__)
    for outer, old_inner in zip(reversed(chain[:-1]), reversed(chain[1:])):
        cells = outer.__closure__ or ()
        if not any(c.cell_contents is old_inner for c in cells):
            raise RuntimeError(f"fusedops.transformers: cannot rebuild the decorator around "
                               f"{inner.__qualname__}: the wrapper does not close over it")
        closure = tuple(types.CellType(new) if c.cell_contents is old_inner else c for c in cells)
        new = _copy_function(outer, outer.__globals__, closure)
    return new


def _copy_function(f, glb, closure):
    g = types.FunctionType(f.__code__, glb, f.__name__, f.__defaults__, closure)
    g.__kwdefaults__ = f.__kwdefaults__
    functools.update_wrapper(g, f, updated=())
    g.__dict__.pop("__wrapped__", None)
    return g


# ---------------------------------------------------------------------------------------------
# Per model


def _owner_prev_experts(model: torch.nn.Module) -> Optional[str]:
    for m in model.modules():
        if "_fusedops_prev_experts" in m.__dict__:
            return m.__dict__["_fusedops_prev_experts"]
    return None


def patch_model(spec: ModelSpec, model: torch.nn.Module, on: frozenset) -> None:
    mod = spec.modeling()
    targets = {getattr(mod, name): build for name, build in spec.swaps.items()}
    for m in model.modules():
        base = base_class(m)
        build = targets.get(base)
        if build is None:
            continue
        attrs = build(base, on)
        m.__class__ = fused_class(base, attrs) if attrs else base
    _set_experts(spec, model, "experts" in on)
    model.__dict__["_fusedops_applied"] = (spec.name, on)


def _has_experts(spec: ModelSpec, model: torch.nn.Module) -> bool:
    if not spec.experts:
        return False
    mod = spec.modeling()
    classes = tuple(getattr(mod, n) for n in spec.experts)
    return any(isinstance(m, classes) for m in model.modules())


def _set_experts(spec: ModelSpec, model: torch.nn.Module, on: bool) -> None:
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_experts_implementation") or not _has_experts(spec, model):
        return
    from ._kernels import EXPERT_GATES, register_experts

    mod = spec.modeling()
    for name, gate in spec.experts.items():
        EXPERT_GATES[getattr(mod, name)] = gate
    current = config._experts_implementation
    if on:
        register_experts()
        if current != "fusedops":
            model.__dict__["_fusedops_prev_experts"] = current
            model.set_experts_implementation("fusedops")
        elif "_fusedops_prev_experts" not in model.__dict__:
            # set by a sub-model's patch (the construction hook patches it first): keep its record
            prev = _owner_prev_experts(model)
            if prev is not None:
                model.__dict__["_fusedops_prev_experts"] = prev
    elif current == "fusedops":
        _restore_experts(model)


def _restore_experts(model: torch.nn.Module) -> None:
    prev = _owner_prev_experts(model)
    if prev is not None and model.config._experts_implementation == "fusedops":
        model.set_experts_implementation(prev)
    for m in model.modules():
        m.__dict__.pop("_fusedops_prev_experts", None)


def revert_model(model: torch.nn.Module) -> None:
    for m in model.modules():
        base = getattr(type(m), "_fusedops_base", None)
        if base is not None:
            m.__class__ = base
    if getattr(getattr(model, "config", None), "_experts_implementation", None) == "fusedops":
        _restore_experts(model)
    for m in model.modules():
        m.__dict__.pop("_fusedops_applied", None)


# ---------------------------------------------------------------------------------------------
# Before construction


def install_hook(spec: ModelSpec, on: frozenset) -> None:
    pre = getattr(spec.modeling(), spec.pretrained)
    if spec.name in _HOOKS:
        original = _HOOKS[spec.name][1]
    else:
        original = pre.__dict__.get("post_init")
        _HOOKS[spec.name] = (pre, original)

    def post_init(self):
        if original is not None:
            original(self)
        else:
            super(pre, self).post_init()
        patch_model(spec, self, on)

    post_init._fusedops_switches = on
    pre.post_init = post_init


def remove_hooks() -> None:
    for pre, original in _HOOKS.values():
        if original is not None:
            pre.post_init = original
        else:
            del pre.post_init
    _HOOKS.clear()


def hooked(spec_name: str) -> Optional[frozenset]:
    """The switches of the construction hook of a model family, None when there is none."""
    if spec_name not in _HOOKS:
        return None
    pre = _HOOKS[spec_name][0]
    return pre.__dict__["post_init"]._fusedops_switches


# ---------------------------------------------------------------------------------------------
# Entry point of every apply_fusedops_to_*


def apply(spec: ModelSpec, switches: dict, model: Optional[torch.nn.Module]):
    check_transformers()
    on = frozenset(k for k, v in switches.items() if v)
    if model is None:
        install_hook(spec, on)
        return None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in spec.model_types:
        raise TypeError(f"fusedops.transformers: apply_fusedops_to_{spec.name} takes a model with "
                        f"config.model_type in {list(spec.model_types)}, got {type(model).__name__} "
                        f"with model_type {model_type!r} (apply_fusedops(model) picks the right one)")
    patch_model(spec, model, on)
    return model
