"""The one coercer: a value from any source, as its field's type, checked against its choices and range.

Strings (the command line, the environment, quoted file values) are parsed; native values (YAML,
TOML, Python) must already have the right type (an int is a valid float, a bool is never a number).
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from typing import Any

from twinkle.config.schema import ConfigError, Spec, brief

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
NONE_WORDS = ("none", "null", "")


def _bad(spec: Spec, option: str, value: Any, why: str = "", bound: str | None = None) -> ConfigError:
    """A wrong value; ``expected`` names the type (and the one bound ``value`` is outside of)."""
    expected = spec.label([] if bound is None else [bound])
    return ConfigError(f"{option}: invalid value {brief(value)}; expected {expected}{why}.", option=option, value=value,
                       expected=expected)


def _dtype_name(spec: Spec, value: Any) -> Any:
    """A ``torch.dtype`` (or its ``'torch.float32'`` spelling) for a str field with choices: its short name."""
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        value = str(value)
    if spec.choices and isinstance(value, str) and value.startswith("torch.") and value[6:] in spec.choices:
        return value[6:]
    return value


def _scalar(spec: Spec, kind: str, value: Any, option: str) -> Any:
    if kind == "str":
        value = _dtype_name(spec, value)
    if isinstance(value, str):
        word = value.strip().lower()
        if kind == "bool":
            if word in TRUE_WORDS or word in FALSE_WORDS:
                return word in TRUE_WORDS
            raise _bad(spec, option, value, f" ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)})")
        if kind in ("int", "float"):
            try:
                return int(value.strip()) if kind == "int" else float(value.strip())
            except ValueError:
                raise _bad(spec, option, value) from None
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "path" and isinstance(value, os.PathLike):
        return os.fspath(value)
    raise _bad(spec, option, value, f", got {type(value).__name__}")


def _one(spec: Spec, kind: str, written: Any, option: str) -> Any:
    """One value of ``kind``, checked against the choices and the range (errors show it as ``written``)."""
    value = _scalar(spec, kind, written, option)
    if value in spec.also:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(spec, option, written, " (a finite number; NaN and inf are never valid here)")
    if spec.choices and value not in spec.choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in spec.choices], n=1)
        raise _bad(spec, option, written, f" (did you mean {close[0]!r}?)" if close else "")
    for sign, bound, ok in ((">=", spec.min, lambda b: value >= b), (">", spec.gt, lambda b: value > b),
                            ("<=", spec.max, lambda b: value <= b), ("<", spec.lt, lambda b: value < b)):
        if bound is not None and not ok(bound):
            raise _bad(spec, option, written, bound=f"{sign} {bound}")
    return value


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def coerce(spec: Spec, value: Any, option: str) -> Any:
    """``value`` as ``spec``'s type, checked; ``option`` names it in the error (as the user wrote it)."""
    if spec.kind == "path" and isinstance(value, str) and not value.strip():
        # '' would otherwise mean none, i.e. the default directory: an empty path is a mistake, not a choice
        raise _bad(spec, option, value, " (an empty path; write none for the default)")
    if value is None or (spec.optional and isinstance(value, str) and value.strip().lower() in NONE_WORDS):
        if spec.optional:
            return None
        raise _bad(spec, option, value)
    if spec.kind == "any":
        return value
    if spec.kind == "table":
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except ValueError:
                raise _bad(spec, option, value, " (a JSON object on the command line)") from None
        if not isinstance(value, Mapping):
            raise _bad(spec, option, value, f", got {type(value).__name__}")
        return dict(value)
    if spec.kind == "list":
        if isinstance(value, str):
            if spec.scalar_ok and "," not in value:
                return _one(spec, spec.item, value.strip(), option)
            parts = _split(value)
            if not parts:
                raise _bad(spec, option, value, " (an empty list)")
        elif isinstance(value, (list, tuple)):
            parts = list(value)
        elif spec.scalar_ok:
            return _one(spec, spec.item, value, option)
        else:
            raise _bad(spec, option, value, f", got {type(value).__name__}")
        return [_one(spec, spec.item, part, option) for part in parts]
    return _one(spec, spec.kind, value, option)


def parse_extra(text: str) -> Any:
    """A value for no known option (a script's own): int, float, bool or None when it looks like one."""
    word = text.strip().lower()
    if word in ("true", "false"):
        return word == "true"
    if word in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            number = kind(text.strip())
        except ValueError:
            continue
        return number if math.isfinite(number) else text  # 'nan'/'inf' stay words
    return text
