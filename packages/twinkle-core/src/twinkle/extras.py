"""Optional dependencies: which extra installs each, and the one error line that says so.

``require("PIL", "drawing the shapes")`` imports an optional module or raises
:class:`MissingExtraError`: ``drawing the shapes needs Pillow, which is not installed: pip install
'twinkle-core[vision]'``. :func:`hint` gives the same line for a ``ModuleNotFoundError`` raised
elsewhere (``twinkle``'s commands print it instead of the bare error). ``./dev``'s environment has
the extras marked ``in_dev``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from twinkle.errors import TwinkleError


@dataclass(frozen=True)
class Extra:
    distribution: str  #: what pip installs (the name users know)
    install: str  #: the pip requirement naming the extra
    in_dev: bool = False  #: ./dev's environment installs it


#: top-level module -> the extra that provides it
EXTRAS: dict[str, Extra] = {
    "PIL": Extra("Pillow", "twinkle-core[vision]", in_dev=True),
    "modelscope": Extra("the ModelScope client", "twinkle-core[modelscope]", in_dev=True),
    "ray": Extra("Ray", "twinkle-core[ray]"),
    "liger_kernel": Extra("liger-kernel", "twinkle-hf[liger]"),
    "vllm": Extra("vLLM (CUDA only)", "twinkle-hf[vllm]"),
    "tensorboard": Extra("tensorboard", "tensorboard"),
    "fastapi": Extra("FastAPI", "twinkle-server", in_dev=True),
    "uvicorn": Extra("uvicorn", "twinkle-server", in_dev=True),
    "tinker": Extra("the tinker client", "twinkle-server", in_dev=True),
}


class MissingExtraError(TwinkleError, ImportError):
    """An optional dependency is not installed; the message names the pip extra that installs it."""

    def __init__(self, message: str, *, module: str) -> None:
        super().__init__(message, name=module)
        self.msg = message

    def __str__(self) -> str:
        return self.msg

    def __reduce__(self) -> tuple:
        return _rebuild, (self.msg, self.name)


def _rebuild(message: str, module: str) -> MissingExtraError:
    return MissingExtraError(message, module=module)


def _install(module: str) -> str:
    extra = EXTRAS[module.split(".")[0]]
    return f"pip install '{extra.install}'" + (" (./dev's environment has it)" if extra.in_dev else "")


def message(module: str, purpose: str) -> str:
    """``{purpose} needs {distribution}, which is not installed: pip install '{extra}'``."""
    return f"{purpose} needs {EXTRAS[module.split('.')[0]].distribution}, which is not installed: {_install(module)}"


def require(module: str, purpose: str) -> ModuleType:
    """``import module``, or a :class:`MissingExtraError` naming the extra (``module`` must be in :data:`EXTRAS`)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the module is there but one of its own dependencies is missing: not ours to rename
        raise MissingExtraError(message(module, purpose), module=module) from None


def hint(exc: BaseException) -> str | None:
    """The one line naming the extra for a ``ModuleNotFoundError`` of an optional module, else None."""
    name = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not name or name.split(".")[0] not in EXTRAS:
        return None
    return f"{exc}: it comes with {EXTRAS[name.split('.')[0]].distribution}: {_install(name)}"
