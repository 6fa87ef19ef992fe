"""Models: the :class:`TwinkleModel` protocol, and every registered model by attribute.

``from twinkle.model import TransformersModel`` resolves through the registry, so backends (and
third-party plugins) appear here once installed; a first-party backend that is missing raises an
ImportError naming the package to install.
"""

from __future__ import annotations

from typing import Any

from twinkle.errors import ComponentNotFoundError, MissingBackendError
from twinkle.model.base import TwinkleModel

__all__ = ["MultiTenantModel", "TwinkleModel"]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "MultiTenantModel":  # the protocol lives with its facade, which imports torch: loaded on use
        from twinkle.model.multi_tenant import MultiTenantModel

        return MultiTenantModel
    from twinkle.registry import resolve

    try:
        return resolve("model", name)
    except MissingBackendError:
        raise
    except ComponentNotFoundError as exc:
        raise AttributeError(f"module 'twinkle.model' has no attribute {name!r}. {exc}") from None


def __dir__() -> list[str]:
    from twinkle.registry import get_registry

    return sorted({*globals(), *get_registry().names("model")})
