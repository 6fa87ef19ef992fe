"""Eager, typed construction of the Trainer's dataclass configs from plain dicts.

Every error names the full dotted field (``optimizer.lr``) and what was expected, and is raised
before anything heavy (torch, a model) is imported.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from twinkle.cli.args_schema import FALSE_WORDS, TRUE_WORDS
from twinkle.errors import TwinkleError


class ConfigError(TwinkleError, ValueError):
    """A Trainer configuration is invalid; the message names the field."""


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_describe(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against (and, for dataclasses/strings from a command line, converted to) ``tp``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        errors = []
        for option in typing.get_args(tp):
            try:
                return coerce(value, option, where)
            except ConfigError as exc:
                errors.append(exc)
        raise ConfigError(f"{where}: expected {_describe(tp)}, got {value!r}.")
    if tp is type(None):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        raise ConfigError(f"{where}: expected null, got {value!r}.")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(tp)], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: expected one of {_describe(tp)}, got {value!r}{hint}.")
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table of {tp.__name__} fields, got {value!r}.")
        return build(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in (*TRUE_WORDS, *FALSE_WORDS):
            return value.lower() in TRUE_WORDS
        raise ConfigError(f"{where}: expected a boolean, got {value!r}.")
    if tp in (int, float):  # an int is a valid float, a bool is neither; strings from a command line are parsed
        native = (int,) if tp is int else (int, float)
        if isinstance(value, str) or (isinstance(value, native) and not isinstance(value, bool)):
            try:
                return tp(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected {'an integer' if tp is int else 'a number'}, got {value!r}.")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}.")
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}.")
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table (mapping), got {value!r}.")
        return dict(value)
    raise ConfigError(f"{where}: unsupported field type {_describe(tp)}.")  # pragma: no cover - a config bug


def build(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """Construct dataclass ``cls`` from ``data``; unknown keys and wrong types are errors naming the field."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_norm = str(key).replace("-", "_")
        path = f"{where}.{key_norm}" if where else key_norm
        if key_norm not in names:
            close = difflib.get_close_matches(key_norm, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(names)}"
            raise ConfigError(f"{path}: unknown field{hint}")
        kwargs[key_norm] = coerce(value, hints[key_norm], path)
    try:
        obj = cls(**kwargs)
    except ConfigError as exc:
        if where and not str(exc).startswith(where):
            raise ConfigError(f"{where}.{exc}") from None
        raise
    return obj
