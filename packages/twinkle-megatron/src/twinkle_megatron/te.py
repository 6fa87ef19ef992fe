"""Is Transformer Engine usable? Cheap checks first; the real import is guarded with ``except Exception``.

The bare ``transformer-engine`` meta package (without its ``[pytorch]`` extension) raises
``RuntimeError`` on import, and a half-installed TE breaks ``import megatron.core`` the same way,
so every import of TE in this package goes through :func:`import_te`.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any


def te_installed() -> bool:
    """Whether TE's PyTorch extension is installed at all (no import: safe for plugin listing)."""
    try:
        return (importlib.util.find_spec("transformer_engine") is not None
                and importlib.util.find_spec("transformer_engine_torch") is not None)
    except (ImportError, ValueError):
        return False


@lru_cache(maxsize=1)
def import_te() -> tuple[Any | None, str]:
    """``(transformer_engine.pytorch, '')`` when TE imports, else ``(None, why)``."""
    if not te_installed():
        return None, "transformer-engine[pytorch] is not installed (pip install 'twinkle-megatron[fp8]')"
    try:
        import transformer_engine.pytorch as te_pytorch
    except Exception as exc:  # the meta package raises RuntimeError; broken builds raise anything
        return None, f"transformer_engine failed to import ({type(exc).__name__}: {exc})"
    return te_pytorch, ""


def te_available() -> bool:
    return import_te()[0] is not None
