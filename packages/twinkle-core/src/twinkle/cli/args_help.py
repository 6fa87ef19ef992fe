"""The ``--help`` text of a ``CLI`` class: every option with its group, type and default."""

from __future__ import annotations

from twinkle.cli.args_schema import FieldSpec, Schema
from twinkle.cli.args_sources import ENV_PREFIX, ENV_SEPARATOR

METAVARS = {"int": "INT", "float": "FLOAT", "str": "STR", "list": "A,B,...", "str_or_list": "A[,B,...]"}


def _dash(name: str) -> str:
    return name.replace("_", "-")


def _spellings(schema: Schema, spec: FieldSpec) -> str:
    """How the option can be written: the flat name when it is unique, else only ``--group.name``."""
    prefix = "" if len(schema.names.get(spec.name, [])) == 1 else f"{spec.group}."
    if spec.kind != "bool":
        metavar = "{" + ",".join(spec.choices) + "}" if spec.choices else METAVARS[spec.kind]
        unique_aliases = [a for a in spec.aliases if len(schema.names.get(a, [])) == 1]
        return ", ".join(f"--{prefix}{_dash(n)} {metavar}" for n in [spec.name, *unique_aliases])
    name = _dash(spec.name)
    written = f"--{prefix}{name}, --{prefix}no-{name}"
    if spec.name.startswith("enable_"):
        short = spec.name[len("enable_"):]
        short_prefix = "" if len(schema.names.get(short, [])) == 1 else f"{spec.group}."
        written += f", --{short_prefix}{_dash(short)}, --{short_prefix}no-{_dash(short)}"
    return written


def _default(spec: FieldSpec) -> str:
    value = spec.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def render_help(schema: Schema, prog: str) -> str:
    """The full help text."""
    lines = [
        f"usage: {prog} [--config FILE] [--NAME VALUE | --GROUP.NAME VALUE | --FLAG | --no-FLAG ...]",
        "",
        "Sources, later wins: defaults < --config FILE (YAML or TOML, nested by group) < environment "
        f"{ENV_PREFIX}<GROUP>{ENV_SEPARATOR}<NAME> < command line.",
        "'-' and '_' are interchangeable; a name alone works when one group has it, else write --GROUP.NAME.",
        "Lists take comma-separated or repeated values. Unrecognised --key value pairs go to args.extra.",
        "",
        "  --config FILE  a .yaml/.yml or .toml file: {group: {name: value}}",
        "  -h, --help     show this help and exit",
    ]
    by_group: dict[str, list[FieldSpec]] = {}
    for spec in schema.specs.values():
        by_group.setdefault(spec.group, []).append(spec)
    for group, specs in by_group.items():
        lines += ["", f"{group}:"]
        for spec in specs:
            lines.append(f"  {_spellings(schema, spec)}")
            detail = f"[{spec.dotted}: {spec.type_label()}, default: {_default(spec)}]"
            lines.append(f"      {spec.help}  {detail}" if spec.help else f"      {detail}")
    return "\n".join(lines) + "\n"
