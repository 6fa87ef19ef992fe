"""How a command prints an error: one ``twinkle CMD: error: ...`` message that names the option.

A missing optional module is named with the extra that installs it (:func:`twinkle.extras.hint`).

An id that does not resolve (:class:`twinkle.hub.HubError`) is reported with the option(s) of the
command's config that hold it, so ``--model.model-id ./no/such/dir`` reads
``twinkle train: error: --model.model-id './no/such/dir': no such local file or directory ...``.
"""

from __future__ import annotations

import os
from typing import Any


def options_holding(config: Any, value: str) -> list[str]:
    """The command-line spellings (``--model.model-id``) of the config fields whose value is ``value``."""
    from twinkle.config import schema_of

    found = []
    for spec in schema_of(type(config)).specs.values():
        held = config
        for part in spec.dotted.split("."):
            held = getattr(held, part, None)
        if isinstance(held, (str, os.PathLike)) and os.fspath(held) == value:
            found.append(spec.option)
    return found


def describe(exc: BaseException, config: Any = None) -> str:
    """The error's text: twinkle's own errors as they are, others with their type; a hub id with its option."""
    from twinkle.errors import TwinkleError
    from twinkle.extras import hint
    from twinkle.hub import HubError

    if isinstance(exc, HubError) and config is not None:
        options = options_holding(config, exc.id)
        if options:
            return f"{' / '.join(options)} {exc.id!r}: {exc.reason}"
    return str(exc) if isinstance(exc, TwinkleError) else hint(exc) or f"{type(exc).__name__}: {exc}"
