"""Reversible, per-instance module patches: a new forward, a swapped class, or rebound globals.

Nothing here touches parameters, buffers or any module other than the one patched, and nothing
patches a class or a library module globally: two models of one class can be kernelized
differently, and :func:`restore` puts back exactly what was there (``__class__`` and the instance's
own ``forward`` attribute, if it had one).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_MISSING = object()


def _unwrapped_chain(fn: Any) -> list[Any]:
    """``fn`` and the functions it wraps (``functools.wraps``' ``__wrapped__``), outermost first."""
    chain = []
    while isinstance(fn, types.FunctionType) and fn not in chain:
        chain.append(fn)
        fn = getattr(fn, "__wrapped__", None)
    return chain


def forward_global(cls: type, name: str) -> Any:
    """The global ``name`` that ``cls.forward`` (or a function it wraps) looks up, or None."""
    for fn in _unwrapped_chain(getattr(cls, "forward", None)):
        if name in fn.__code__.co_names and name in fn.__globals__:
            return fn.__globals__[name]
    return None


def clone_with_globals(fn: Callable[..., Any], overrides: Mapping[str, Any]) -> Callable[..., Any]:
    """A copy of ``fn`` whose global lookups of ``overrides`` names return the given objects.

    Decorators made with ``functools.wraps`` (transformers' ``deprecate_kwarg`` on attention
    forwards) are cloned too: the wrapper's closure cell holding the wrapped function is replaced
    by one holding the clone, so the decorator's behaviour is kept.
    """
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"Cannot rebind globals of {fn!r}: not a Python function.")
    inner = getattr(fn, "__wrapped__", None)
    closure = fn.__closure__
    new_inner = None
    if isinstance(inner, types.FunctionType) and closure:
        new_inner = clone_with_globals(inner, overrides)
        closure = tuple(
            types.CellType(new_inner) if _cell_value(cell) is inner else cell for cell in closure
        )
    fn_globals = fn.__globals__
    if any(name in fn.__code__.co_names for name in overrides):
        fn_globals = {**fn.__globals__, **overrides}
    clone = types.FunctionType(fn.__code__, fn_globals, fn.__name__, fn.__defaults__, closure)
    clone.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(clone, fn)
    if new_inner is not None:
        clone.__wrapped__ = new_inner
    return clone


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # empty cell
        return _MISSING


@dataclass
class ModulePatch:
    """What one module looked like before patching, to put it back exactly."""

    module: Any
    old_class: type
    old_forward: Any  # the instance's own ``forward`` attribute, or _MISSING
    new_class: type | None = None  # the class swapped in, if any
    applied: dict[str, str] = field(default_factory=dict)  # op -> choice name


def can_patch(module: Any) -> bool:
    """False for modules that already carry an instance-level forward (someone else's hook or patch)."""
    return "forward" not in vars(module)


def apply_patch(module: Any, *, forward: Callable[..., Any] | None = None, module_class: type | None = None,
                overrides: Mapping[str, Any] | None = None, clone_cache: dict | None = None) -> ModulePatch:
    """Patch ``module`` in place and return the record :func:`restore` needs.

    ``clone_cache`` lets modules of one class with the same overrides share one cloned forward.
    """
    patch = ModulePatch(module, type(module), vars(module).get("forward", _MISSING))
    if module_class is not None:
        module.__class__ = module_class
        patch.new_class = module_class
    if forward is not None:
        module.forward = types.MethodType(forward, module)
    elif overrides:
        base = type(module).forward
        key = (base, tuple((name, id(value)) for name, value in sorted(overrides.items(), key=lambda kv: kv[0])))
        cache = clone_cache if clone_cache is not None else {}
        if key not in cache:
            cache[key] = clone_with_globals(base, overrides)
        cloned = cache[key]
        module.forward = types.MethodType(cloned, module)
    return patch


def restore(patch: ModulePatch) -> None:
    """Undo :func:`apply_patch`: the original class and the original instance attributes."""
    module = patch.module
    if patch.old_forward is _MISSING:
        vars(module).pop("forward", None)
    else:
        vars(module)["forward"] = patch.old_forward
    if patch.new_class is not None and type(module) is patch.new_class:
        module.__class__ = patch.old_class
