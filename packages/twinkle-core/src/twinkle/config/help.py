"""The ``--help`` text of a config: one line per option with its spellings, help, type and default."""

from __future__ import annotations

import inspect
import json
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.config.schema import Schema, Spec, dash

NBSP = "\xa0"
METAVARS = {"int": "INT", "float": "FLOAT", "str": "STR", "path": "PATH", "table": "JSON", "any": "VALUE"}
SYNTAX = ("Options: --GROUP.NAME VALUE, or the name alone when one group has it ('-' and '_' are interchangeable); "
          "booleans: --NAME / --no-NAME; lists: comma-separated or repeated; none for an optional value.")


def show(value: Any) -> str:
    """A value as an option would be written."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _unique(schema: Schema, name: str) -> bool:
    """Whether ``--name`` alone means one group field (no top-level field and no second group has it)."""
    return name not in schema.names and len({s.dotted for s, _ in schema.bare.get(name, [])}) == 1


def spellings(schema: Schema, spec: Spec) -> str:
    """How the option can be written: ``--group.name``, the name alone when unique, its aliases."""
    flag = "[no-]" if spec.kind == "bool" else ""
    names = [spec.name, *spec.aliases]
    if spec.kind == "bool" and spec.name.startswith("enable_"):
        names.append(spec.name[len("enable_"):])
    prefix = f"{dash(spec.group)}." if spec.group else ""
    out = [f"--{prefix}{flag}{dash(spec.name)}"]
    if spec.group:
        out += [f"--{flag}{dash(name)}" for name in names if _unique(schema, name)]
    out += [f"--{dash(alias)}" for alias in spec.top_aliases]
    if spec.kind == "bool":
        return ", ".join(out)
    if spec.choices:
        metavar = "{" + ",".join(map(str, spec.choices)) + "}"
    elif spec.kind == "list":
        metavar = f"{METAVARS[spec.item]}[,...]"
    else:
        metavar = METAVARS[spec.kind]
    return f"{', '.join(out)} {metavar}"


def _heading(schema: Schema, group: str) -> str:
    if not group:
        return "options:"
    aliases = [g for g, name in schema.group_names.items() if name == group and g != group]
    doc = (inspect.getdoc(schema.groups[group]) or "").split("\n")[0].replace("``", "")
    also = f" (also {', '.join(aliases)})" if aliases else ""
    return f"{group}{also}:" + (f" {doc}" if doc else "")


def facts(spec: Spec, value: Any, note: str = "") -> str:
    """``(type; default: X)`` of an option: its type when the metavar does not say it all, and its default."""
    label = spec.label()
    plain = not spec.bounds() and not spec.also and (not spec.optional or bool(spec.required))
    parts = [] if plain and (spec.choices or spec.kind in METAVARS or spec.kind == "bool") else [label]
    if spec.required:
        return "(" + "; ".join([*parts, "required"]) + ")"
    parts.append(f"default: {show(value)}")
    if note and show(value) != show(spec.default):
        parts.append(f"{note}: {show(spec.default)}")
    return "(" + "; ".join(parts) + ")"


def render_help(schema: Schema, usage: str, intro: Sequence[str] = (), *,
                shown: Mapping[tuple[str, str], Any] | None = None, note: str = "", width: int = 100) -> str:
    """The help text: ``usage``, ``intro`` lines, then every option by group, wrapped at ``width`` columns.

    ``shown`` replaces the defaults displayed (what a command uses when nothing is given); where it
    differs from the schema's own default, that one follows as ``{note}: X``.
    """
    lines = [usage, "", *intro, *([""] if intro else []), *textwrap.wrap(SYNTAX, width)]
    by_group: dict[str, list[Spec]] = {}
    for spec in schema.specs.values():
        by_group.setdefault(spec.group, []).append(spec)
    left = {key: spellings(schema, spec) for key, spec in schema.specs.items()}
    column = min(max(map(len, left.values())), 34) + 4
    for group in sorted(by_group, key=lambda g: g != ""):
        lines += ["", *textwrap.wrap(_heading(schema, group), width, subsequent_indent="  ")]
        for spec in by_group[group]:
            key = (spec.group, spec.name)
            value = shown[key] if shown and key in shown else spec.default
            kept = facts(spec, value, note).replace(" ", NBSP).replace(f";{NBSP}", "; ")  # not broken inside a part
            text = " ".join(filter(None, [spec.help, kept]))
            head = f"  {left[key]}"
            body = [line.replace(NBSP, " ") for line in textwrap.wrap(text, width - column)] or [""]
            if len(head) + 2 > column:
                lines.append(head)
            else:
                lines.append(f"{head:<{column}}{body.pop(0)}")
            lines += [" " * column + line for line in body]
    return "\n".join(lines) + "\n"
