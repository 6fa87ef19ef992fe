"""Building a per-group component (loss, metric, template, processor, patch) from a name, class or instance.

Each may be given as a registered name (resolved through ``twinkle.registry``), a class
(constructed with the call's kwargs) or a ready instance. The facade's ``set_*`` methods build the
new component first and store it last, so a call that fails leaves the group exactly as it was.
"""

from __future__ import annotations

from typing import Any

from twinkle.registry import resolve


def build_component(kind: str, obj: Any, kwargs: dict[str, Any], *args: Any) -> Any:
    """Resolve ``obj`` of ``kind`` and construct it (with ``args`` then ``kwargs``) when it is a class."""
    resolved = resolve(kind, obj)
    if isinstance(resolved, type):
        try:
            return resolved(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"Could not construct {kind} {resolved.__name__} with {kwargs}: {exc}") from exc
    if kwargs:
        raise TypeError(f"{kind} {resolved!r} is already an instance; construction arguments {sorted(kwargs)} "
                        "cannot apply to it. Pass the class or its registered name instead.")
    return resolved


def build_callable(kind: str, obj: Any, kwargs: dict[str, Any], how: str) -> Any:
    """:func:`build_component`, refusing a result that cannot be called ``how`` (a loss, a processor)."""
    built = build_component(kind, obj, kwargs)
    if not callable(built):
        raise TypeError(f"A {kind} must be callable {how}; got {type(built).__name__}.")
    return built
