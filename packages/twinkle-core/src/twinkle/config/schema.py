"""One description of a configuration: dataclass fields with their help, checks and spellings.

A configuration is a dataclass (the *root*) whose fields are options (``total_step``) or groups of
options (a dataclass-typed field, one level deep: ``optimizer.lr``). Declare a field with
:func:`opt` to give it help text, choices, a range, other spellings or required-ness; its type
hint gives the kind of value. The same :class:`Spec` checks a value whatever its source (a file, a
mapping, the environment, the command line, a constructor call), and every mistake is a
:class:`ConfigError` naming the option as the user wrote it.
"""

from __future__ import annotations

import dataclasses
import difflib
import reprlib
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from twinkle.errors import TwinkleError

SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}
#: a config error message longer than this is cut in the middle (a value repeated by YAML aliases, a pasted blob)
MAX_MESSAGE = 1000
_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 120
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 8
_BRIEF.maxlevel = 3


def brief(value: Any) -> str:
    """``repr(value)`` bounded in length and in the work it takes (nested and shared values are elided)."""
    return _BRIEF.repr(value)


def cut(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` at most about ``limit`` characters: its start and end, with what was cut counted."""
    if len(message) <= limit:
        return message
    head, tail = message[: limit * 3 // 4], message[-(limit // 4):]
    return f"{head} [... {len(message) - len(head) - len(tail)} characters cut ...] {tail}"


class ConfigError(TwinkleError, ValueError):
    """A bad option, value or config file; the message names the option and what was expected.

    ``option`` is the option as written (``--lr``, ``job.yaml: optimizer.lr``), ``value`` what was
    given and ``expected`` the type or choices it should have been.
    """

    def __init__(self, message: str, *, option: str | None = None, value: Any = None,
                 expected: str | None = None) -> None:
        super().__init__(cut(message))
        self.option, self.value, self.expected = option, value, expected


def opt(default: Any = None, help: str = "", *, factory: Any = None, choices: tuple[Any, ...] | None = None,
        min: float | None = None, max: float | None = None, gt: float | None = None, lt: float | None = None,
        also: tuple[Any, ...] = (), aliases: tuple[str, ...] = (), top_aliases: tuple[str, ...] = (),
        required: str = "") -> Any:
    """A dataclass field with its help text, checks and extra spellings.

    ``min``/``max`` are inclusive bounds, ``gt``/``lt`` exclusive ones; ``also`` are values accepted
    outside them (``-1``: turned off). ``aliases`` are other names in the same group (``lr`` for
    ``learning_rate``; on a group field: other names of the group, ``optim_cfg`` for ``optimizer``);
    ``top_aliases`` spell a group's field at the top level (``infra_mode`` for ``infra.mode``).
    ``required`` (how to provide it) makes a missing value an error when a config is built from its
    sources. For a group, pass ``factory=TheGroupClass``.
    """
    meta = {"help": help, "choices": choices, "min": min, "max": max, "gt": gt, "lt": lt, "also": also,
            "aliases": aliases, "top_aliases": top_aliases, "required": required}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Spec:
    """One option: where it lives (``group`` is ``''`` at the top level), its kind of value and checks.

    kind: bool, int, float, str, path (``str | Path``; held as str), list (of ``item``; with
    ``scalar_ok`` a single item stays as it is: ``str | list[str]``), table (a dict) or any.
    """

    group: str
    name: str
    kind: str
    item: str | None = None
    scalar_ok: bool = False
    optional: bool = False
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    gt: float | None = None
    lt: float | None = None
    also: tuple[Any, ...] = ()
    aliases: tuple[str, ...] = ()
    top_aliases: tuple[str, ...] = ()
    required: str = ""

    @property
    def dotted(self) -> str:
        return f"{self.group}.{self.name}" if self.group else self.name

    @property
    def option(self) -> str:
        """The command-line spelling with its group: ``--optimizer.lr``."""
        return "--" + dash(self.dotted)

    def bounds(self) -> list[str]:
        return [f"{sign} {bound}" for sign, bound in ((">=", self.min), (">", self.gt), ("<=", self.max),
                                                      ("<", self.lt)) if bound is not None]

    def label(self, bounds: list[str] | None = None) -> str:
        """The expected value in words (``int >= 1 or none``), with ``bounds`` (default: all of them)."""
        if self.choices:
            base = "{" + ",".join(map(str, self.choices)) + "}"
        elif self.kind == "list":
            base = f"{self.item} or list of {self.item}" if self.scalar_ok else f"list of {self.item}"
        else:
            base = self.kind
        bounds = self.bounds() if bounds is None else bounds
        text = f"{base} {' and '.join(bounds)}" if bounds else base
        return " or ".join([text, *map(str, self.also), *(["none"] if self.optional and not self.required else [])])


@dataclass(frozen=True)
class Schema:
    """Every option of one root dataclass and every way to write it."""

    root: type
    groups: dict[str, type]  # group name -> its dataclass
    group_names: dict[str, str]  # each spelling of a group (its name, its aliases) -> the group
    specs: dict[tuple[str, str], Spec]
    names: dict[str, list[tuple[Spec, bool]]]  # full spellings (top-level and group.name) -> (spec, negated)
    bare: dict[str, list[tuple[Spec, bool]]]  # a group field's name alone (valid when only one group has it)
    extra: bool  # the root has an ``extra`` dict: unknown keys go there instead of being errors

    def top_level(self) -> list[str]:
        """What may stand at the top level of a config: top-level fields and groups (for suggestions)."""
        return [*(n for (g, n) in self.specs if not g), *self.groups]


def dash(name: str) -> str:
    return name.replace("_", "-")


def norm(name: str) -> str:
    """``-`` and ``_`` are interchangeable in option names."""
    return name.strip().replace("-", "_")


def _kind(tp: Any, where: str) -> dict[str, Any]:
    """Spec fields for a type hint: kind, item, scalar_ok, optional, choices."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    members = [tp]
    optional = False
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        optional = len(members) < len(args)
    if set(members) == {str, Path}:
        return {"kind": "path", "optional": optional}
    if len(members) == 2:  # T | list[T]: one item or several
        lists = [m for m in members if typing.get_origin(m) is list]
        scalar = [m for m in members if m in SCALARS]
        if len(lists) == 1 and scalar and typing.get_args(lists[0]) == (scalar[0],):
            return {"kind": "list", "item": SCALARS[scalar[0]], "scalar_ok": True, "optional": optional}
    if len(members) == 1:
        (member,) = members
        member_origin, member_args = typing.get_origin(member), typing.get_args(member)
        if member in SCALARS:
            return {"kind": SCALARS[member], "optional": optional}
        if member is Path:
            return {"kind": "path", "optional": optional}
        if member_origin is Literal:
            return {"kind": "str", "choices": member_args, "optional": optional}
        if member_origin is list and len(member_args) == 1 and member_args[0] in SCALARS:
            return {"kind": "list", "item": SCALARS[member_args[0]], "optional": optional}
        if member is dict or member_origin is dict:
            return {"kind": "table", "optional": optional}
        if member is Any:
            return {"kind": "any", "optional": True}
    raise TypeError(f"{where}: config fields are bool, int, float, str, Path, Literal[...], list[...], "
                    f"X | list[X], dict or optionals of those, not {tp!r}.")


def _spec(group: str, f: dataclasses.Field, tp: Any, where: str) -> Spec:
    meta = dict(f.metadata)
    kind = _kind(tp, where)
    if meta.get("choices"):
        kind["choices"] = tuple(meta["choices"])
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    return Spec(group=group, name=f.name, default=default, help=meta.get("help", ""),
                min=meta.get("min"), max=meta.get("max"), gt=meta.get("gt"), lt=meta.get("lt"),
                also=tuple(meta.get("also", ())), aliases=tuple(norm(a) for a in meta.get("aliases", ())),
                top_aliases=tuple(norm(a) for a in meta.get("top_aliases", ())),
                required=meta.get("required", ""), **kind)


def _spellings(spec: Spec) -> list[tuple[str, bool]]:
    """(name, negated) for every way to write a field inside its group: name, aliases, no-name, enable_X's X."""
    out = [(name, False) for name in (spec.name, *spec.aliases)]
    if spec.kind == "bool":
        out += [(f"no_{name}", True) for name, _ in list(out)]
        if spec.name.startswith("enable_"):  # --fused-ce / --no-fused-ce for enable_fused_ce
            short = spec.name[len("enable_"):]
            out += [(short, False), (f"no_{short}", True)]
    return out


@cache
def schema_of(root: type) -> Schema:
    """The options of a root dataclass (built once per class)."""
    hints = typing.get_type_hints(root)
    groups: dict[str, type] = {}
    group_names: dict[str, str] = {}
    specs: dict[tuple[str, str], Spec] = {}
    extra = False
    for f in dataclasses.fields(root):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            groups[f.name] = tp
            for spelling in (f.name, *f.metadata.get("aliases", ())):
                group_names[norm(spelling)] = f.name
        elif f.name == "extra" and typing.get_origin(tp) is dict:
            extra = True
        else:
            specs[("", f.name)] = _spec("", f, tp, f"{root.__name__}.{f.name}")
    for group, group_cls in groups.items():
        group_hints = typing.get_type_hints(group_cls)
        for f in dataclasses.fields(group_cls):
            specs[(group, f.name)] = _spec(group, f, group_hints[f.name], f"{group_cls.__name__}.{f.name}")
    names: dict[str, list[tuple[Spec, bool]]] = {}
    bare: dict[str, list[tuple[Spec, bool]]] = {}
    for spec in specs.values():
        spellings = _spellings(spec)
        if not spec.group:
            for spelling, negated in spellings:
                names.setdefault(spelling, []).append((spec, negated))
            continue
        for group_spelling in (g for g, name in group_names.items() if name == spec.group):
            for spelling, negated in spellings:
                names.setdefault(f"{group_spelling}.{spelling}", []).append((spec, negated))
        for spelling, negated in spellings:
            bare.setdefault(spelling, []).append((spec, negated))
        for alias in spec.top_aliases:
            names.setdefault(alias, []).append((spec, False))
    return Schema(root, groups, group_names, specs, names, bare, extra)


def resolve(schema: Schema, written: str, option: str) -> tuple[Spec, bool] | None:
    """The field an option name means (with whether it is negated), ``None`` if it is none.

    A full spelling (a top-level field, ``group.field``) wins over a group field's name alone; that
    short form must belong to one group only. A misspelt field of a known group is an error.
    """
    key = norm(written)
    if key in schema.names:
        return schema.names[key][0]
    hits = schema.bare.get(key, [])
    distinct = list({spec.dotted: spec for spec, _ in hits}.values())
    if len(distinct) > 1:
        raise ConfigError(f"{option} is ambiguous: write one of {', '.join(s.option for s in distinct)}.",
                          option=option)
    if hits:
        return hits[0]
    group, dot, rest = key.partition(".")
    if dot and group in schema.group_names:
        raise unknown(schema, key, option)
    return None


def unknown(schema: Schema, key: str, option: str) -> ConfigError:
    """The error for a name that is no option, with the closest known names."""
    group, dot, rest = norm(key).partition(".")
    if dot and group in schema.group_names:
        known = [name for g, name in schema.specs if g == schema.group_names[group]]
        key = rest
    else:
        known = schema.top_level()
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(known)}."
    return ConfigError(f"{option}: unknown field; {hint}", option=option, value=key)
