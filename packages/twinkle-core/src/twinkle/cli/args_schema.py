"""What ``CLI`` knows about its options: one :class:`FieldSpec` per group field, name lookup and value checks.

Every source (config file, environment, command line, ``from_args`` defaults) goes through
:func:`coerce`, so a value is checked against the same type, choices and range whatever its origin,
and the error names the option as the user wrote it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
NONE_WORDS = ("none", "null", "")


class CLIError(ValueError):
    """A bad option, value or config file. ``from_args`` prints it and exits with status 2."""

    def __init__(self, message: str, *, option: str | None = None, value: Any = None,
                 expected: str | None = None) -> None:
        super().__init__(message)
        self.option = option
        self.value = value
        self.expected = expected


@dataclass(frozen=True)
class FieldSpec:
    """One option: ``group.name``, its value kind (int/float/str/bool/list/str_or_list) and checks."""

    group: str
    name: str
    kind: str
    item: type | None
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...] | None
    min: float | None
    max: float | None
    aliases: tuple[str, ...] = ()

    @property
    def dotted(self) -> str:
        return f"{self.group}.{self.name}"

    def type_label(self) -> str:
        """The type as ``--help`` shows it."""
        if self.choices:
            label = "{" + ",".join(self.choices) + "}"
        elif self.kind == "list":
            label = f"list of {self.item.__name__}"
        elif self.kind == "str_or_list":
            label = "str or list of str"
        else:
            label = self.kind
        return f"{label} or none" if self.optional else label


@dataclass(frozen=True)
class Schema:
    """The groups of one ``CLI`` class and every name an option can be written with."""

    groups: dict[str, type]
    specs: dict[tuple[str, str], FieldSpec]
    # normalised name -> [(spec, negated)]; a flat name with two specs is ambiguous
    names: dict[str, list[tuple[FieldSpec, bool]]]


def norm(name: str) -> str:
    """``-`` and ``_`` are interchangeable in option names."""
    return name.strip().replace("-", "_")


def _kind(tp: Any) -> tuple[str, type | None, bool]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        optional = len(members) < len(args)
        if set(members) == {str, list[str]}:
            return "str_or_list", str, optional
        if len(members) == 1:
            kind, item, _ = _kind(members[0])
            return kind, item, optional
    elif origin is list and len(args) == 1 and args[0] in (int, float, str):
        return "list", args[0], False
    elif tp in (int, float, str, bool):
        return tp.__name__, None, False
    raise TypeError(f"CLI fields support int, float, str, bool, list[...] and their optionals, not {tp!r}.")


def group_classes(cli_cls: type) -> dict[str, type]:
    """The dataclass-typed fields of a ``CLI`` (sub)class, in declaration order."""
    hints = typing.get_type_hints(cli_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cli_cls) if dataclasses.is_dataclass(hints[f.name])}


@cache
def schema_of(cli_cls: type) -> Schema:
    """Build (once per class) the option table of a ``CLI`` class."""
    groups = group_classes(cli_cls)
    specs: dict[tuple[str, str], FieldSpec] = {}
    names: dict[str, list[tuple[FieldSpec, bool]]] = {}
    for group, group_cls in groups.items():
        hints = typing.get_type_hints(group_cls)
        for f in dataclasses.fields(group_cls):
            kind, item, optional = _kind(hints[f.name])
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            meta = f.metadata
            spec = FieldSpec(group, f.name, kind, item, optional, default, meta.get("help", ""),
                             meta.get("choices"), meta.get("min"), meta.get("max"),
                             tuple(norm(a) for a in meta.get("aliases", ())))
            specs[(group, f.name)] = spec
            spellings = [(f.name, False)] + [(alias, False) for alias in spec.aliases]
            if kind == "bool":
                spellings.append((f"no_{f.name}", True))
                if f.name.startswith("enable_"):  # --fused-ce / --no-fused-ce for enable_fused_ce
                    short = f.name[len("enable_"):]
                    spellings += [(short, False), (f"no_{short}", True)]
            for spelling, negated in spellings:
                for key in (spelling, f"{group}.{spelling}"):
                    names.setdefault(key, []).append((spec, negated))
    return Schema(groups, specs, names)


def resolve(schema: Schema, written: str, option: str) -> tuple[FieldSpec, bool] | None:
    """The field an option name means, ``None`` if it is no field; ambiguous or misspelt group fields raise."""
    key = norm(written)
    hits = schema.names.get(key)
    if hits and len(hits) > 1:
        where = " or ".join(f"--{spec.group}.{key.replace('_', '-')}" for spec, _ in hits)
        raise CLIError(f"{option} is ambiguous: groups {', '.join(s.group for s, _ in hits)} all have it; "
                       f"write {where}.", option=option)
    if hits:
        return hits[0]
    group, dot, rest = key.partition(".")
    if dot and group in schema.groups:
        raise unknown_field(schema, group, rest, option)
    return None


def unknown_field(schema: Schema, group: str, name: str, option: str) -> CLIError:
    """The error for a field that a known group does not have, with close spellings."""
    fields = [n for g, n in schema.specs if g == group]
    close = difflib.get_close_matches(norm(name), fields, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else f" Its fields: {', '.join(fields)}."
    return CLIError(f"{option}: group '{group}' has no field '{name}'.{hint}", option=option, value=name)


def _bad(spec: FieldSpec, option: str, value: Any, why: str = "") -> CLIError:
    expected = spec.type_label()
    return CLIError(f"{option}: invalid value {value!r}; expected {expected}{why}.",
                    option=option, value=value, expected=expected)


def _scalar_from_str(spec: FieldSpec, kind: str, text: str, option: str) -> Any:
    word = text.strip().lower()
    if kind == "bool":
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise _bad(spec, option, text, f" ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)})")
    try:
        return {"int": int, "float": float}.get(kind, str)(text.strip() if kind != "str" else text)
    except ValueError:
        raise _bad(spec, option, text) from None


def _scalar(spec: FieldSpec, kind: str, value: Any, option: str) -> Any:
    if isinstance(value, str):
        return _scalar_from_str(spec, kind, value, option)
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise _bad(spec, option, value, f", got {type(value).__name__}")


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def coerce(spec: FieldSpec, value: Any, option: str) -> Any:
    """``value`` (a string from argv/env, or a native value from a file) as this field's type, checked."""
    if value is None or (spec.optional and isinstance(value, str) and value.strip().lower() in NONE_WORDS):
        if spec.optional:
            return None
        raise _bad(spec, option, value)
    if spec.kind in ("list", "str_or_list"):
        if isinstance(value, str):
            parts = _split(value)
            if spec.kind == "str_or_list" and "," not in value:
                return value.strip()
        elif isinstance(value, (list, tuple)):
            parts = list(value)
        else:
            raise _bad(spec, option, value, f", got {type(value).__name__}")
        out = [_scalar(spec, spec.item.__name__, part, option) for part in parts]
        if not out:
            raise _bad(spec, option, value, " (an empty list)")
        return out
    out = _scalar(spec, spec.kind, value, option)
    if spec.kind == "float" and not math.isfinite(out):
        raise _bad(spec, option, value, " (a finite number; NaN and inf are never valid here)")
    if spec.choices and out not in spec.choices:
        raise _bad(spec, option, value)
    if spec.min is not None and out < spec.min:
        raise _bad(spec, option, value, f" >= {spec.min}")
    if spec.max is not None and out > spec.max:
        raise _bad(spec, option, value, f" <= {spec.max}")
    return out


def parse_extra(text: str) -> Any:
    """An unrecognised option's value: int, float, bool or None when it looks like one, else the string."""
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
