"""Where values come from: a YAML/TOML file or a mapping, the environment, the command line.

Each reader returns a :class:`Layer` of checked values; :func:`twinkle.config.build` applies layers
in order, later ones winning (``CLI.parse``: defaults < ``--config`` file < ``TWINKLE_*`` < argv).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from twinkle.config.schema import ConfigError, Schema, Spec, brief, dash, norm, resolve, unknown
from twinkle.config.values import FALSE_WORDS, TRUE_WORDS, coerce, parse_extra

ENV_PREFIX = "TWINKLE_"
ENV_SEPARATOR = "__"


@dataclass
class Layer:
    """The values one source sets, ``fields[(group, name)]`` (group ``''``: top level), and ``extra`` keys."""

    fields: dict[tuple[str, str], Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    config: str | None = None  # argv only: the config file named on the command line
    help: bool = False  # argv only: -h/--help was given
    written: dict[tuple[str, str], str] = field(default_factory=dict)  # how each field was spelled
    #: extra keys set under a name that is no option (not through ``extra:``/``--extra.NAME``), as written
    loose: dict[str, str] = field(default_factory=dict)


def _set(layer: Layer, schema: Schema, name: str, value: Any, option: str) -> bool:
    """Set the field ``name`` means (any spelling) from a file or mapping value; False if it is no field."""
    hit = resolve(schema, name, option)
    if hit is None:
        return False
    spec, negated = hit
    parsed = coerce(spec, value, option)
    parsed = (not parsed) if negated else parsed
    key = (spec.group, spec.name)
    if key in layer.fields and layer.fields[key] != parsed:
        raise ConfigError(f"{option}: also set as {layer.written[key]} ({brief(layer.fields[key])} there, "
                          f"{brief(parsed)} here); set {spec.dotted} once.", option=option, value=value)
    layer.fields[key], layer.written[key] = parsed, option
    return True


def from_mapping(schema: Schema, data: Mapping[str, Any], source: str | None = None) -> Layer:
    """Nested ``{group: {field: value}}`` plus top-level fields; a key may also be any option spelling.

    A group's value may be a table or an instance of its dataclass. Unknown keys go to ``extra``
    when the schema has one (recorded in ``Layer.loose``: :func:`check_declared` refuses the undeclared),
    else they are errors.
    """
    layer = Layer()
    prefix = f"{source}: " if source else ""
    for raw_key, value in data.items():
        key = norm(str(raw_key))
        group = schema.group_names.get(key)
        if key == "extra" and schema.extra:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}extra: must be a table of key: value, got {type(value).__name__}.",
                                  option=f"{prefix}extra", value=value)
            layer.extra.update({norm(str(k)): v for k, v in value.items()})
        elif group is not None:
            if value is None:  # a group given as None keeps its defaults (xtuner's ``fsdp_cfg=None``)
                continue
            if isinstance(value, (list, tuple)) and getattr(schema.groups[group], "LIST_FIELD", None):
                value = {schema.groups[group].LIST_FIELD: list(value)}  # ``dataset_cfg=[...]``
            if is_dataclass(value) and not isinstance(value, type):
                value = _set_fields(schema, group, value)
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{raw_key}: '{raw_key}' is an option group and needs a table of fields, "
                                  f"got {brief(value)}.", option=f"{prefix}{raw_key}", value=value)
            for raw_name, item in value.items():
                _set(layer, schema, f"{group}.{raw_name}", item, f"{prefix}{raw_key}.{raw_name}")
        elif not _set(layer, schema, key, value, f"{prefix}{raw_key}"):
            if not schema.extra:
                raise unknown(schema, key, f"{prefix}{raw_key}")
            layer.extra[key] = value  # no field of that name: kept for the script, like an unknown --option
            layer.loose[key] = f"{prefix}{raw_key}"  # refused later unless the script declares it (check_declared)
    return layer


def _set_fields(schema: Schema, group: str, value: Any) -> dict[str, Any]:
    """A group object as the fields it sets: those whose value differs from the schema's default.

    So two objects for one group (``optim_cfg=AdamWConfig(...)`` beside ``optimizer=...``) conflict only
    where both set a field, and a subclass that only changes defaults (``AdamWConfig``) keeps them.
    """
    out = {}
    for f in fields(value):
        spec = schema.specs.get((group, f.name))
        item = getattr(value, f.name)
        if spec is None or item != spec.default:
            out[f.name] = item
    return out


def closest_option(schema: Schema, key: str) -> str | None:
    """The group or option name an unknown ``key`` most likely misspells, or None."""
    import difflib

    known = [*schema.group_names, *(n for n in [*schema.names, *schema.bare] if "." not in n)]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    return close[0] if close else None


def check_declared(schema: Schema, layers: Sequence[Layer], declared: set[str]) -> None:
    """Every extra key set under a name that is no option must be ``declared`` (a script's own option), else it is
    most likely a typo (``--learning-rat 0.5``): a ConfigError naming it, the closest option and the ways to
    declare one."""
    for layer in layers:
        for key, written in layer.loose.items():
            if key in declared:
                continue
            close = closest_option(schema, key)
            hint = f"did you mean --{dash(close)}? " if close else ""
            raise ConfigError(f"{written}: unknown option; {hint}A script's own option is declared by giving it a "
                              f"default (CLI.parse(..., {key}=...)), written as --extra.{dash(key)} (extra: in a "
                              "config file, TWINKLE_EXTRA__NAME), or allowed freely with CLI.parse(..., "
                              "allow_extra=True).", option=written, value=key)


def from_env(schema: Schema, environ: Mapping[str, str]) -> Layer:
    """``TWINKLE_<GROUP>__<FIELD>=value`` (and ``TWINKLE_EXTRA__<KEY>``); other ``TWINKLE_*`` names are ignored."""
    layer = Layer()
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name:
            continue
        group, _, field_name = name[len(ENV_PREFIX):].lower().partition(ENV_SEPARATOR)
        if group == "extra" and schema.extra:
            layer.extra[field_name] = parse_extra(environ[name])
        elif group in schema.group_names:
            _set(layer, schema, f"{group}.{field_name}", environ[name], name)
    return layer


def _is_option(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def from_argv(schema: Schema, argv: Sequence[str], *, positional_config: bool = False) -> Layer:
    """``--name value``, ``--name=value``, ``--group.name``, ``--flag``/``--no-flag``, ``--config FILE``.

    ``positional_config``: a first argument that is no option names the config file (``twinkle train
    job.yaml``). A list option given twice collects both. Unknown names go to ``extra`` when the
    schema has one (``--extra.NAME`` explicitly; others are recorded in ``Layer.loose``), else they are errors.
    """
    layer = Layer()
    i = 0
    if positional_config and argv and not argv[0].startswith("-"):
        layer.config, i = argv[0], 1
    while i < len(argv):
        token = argv[i]
        i += 1
        if token in ("-h", "--help"):
            layer.help = True
            continue
        if not _is_option(token):
            raise ConfigError(f"unexpected argument {brief(token)}: options are written --name value or --name=value "
                              "(booleans: --flag, --no-flag or --flag=false).", option=token, value=token)
        name, eq, inline = token[2:].partition("=")
        value: str | None = inline if eq else None
        option = f"--{name}"
        if norm(name) == "config":
            if value is None:
                if i >= len(argv) or _is_option(argv[i]):
                    raise ConfigError("--config needs a file path.", option="--config")
                value, i = argv[i], i + 1
            layer.config = value
            continue
        hit = resolve(schema, name, option)
        if hit is None:
            if not schema.extra:
                raise unknown(schema, name, option)
            i = _extra(layer, schema, norm(name), value, argv, i, option)
            continue
        spec, negated = hit
        if spec.kind == "bool":
            if value is None and i < len(argv) and argv[i].strip().lower() in TRUE_WORDS + FALSE_WORDS:
                value, i = argv[i], i + 1
            if negated and value is not None:
                raise ConfigError(f"{option} takes no value (write --{dash(spec.name)}={value}).",
                                  option=option, value=value)
            layer.fields[(spec.group, spec.name)] = not negated if value is None else coerce(spec, value, option)
            continue
        if value is None:
            if i >= len(argv) or _is_option(argv[i]):
                raise ConfigError(f"{option} needs a value ({spec.label([])}).", option=option, expected=spec.label([]))
            value, i = argv[i], i + 1
        _put(layer, spec, coerce(spec, value, option))
    return layer


def _put(layer: Layer, spec: Spec, parsed: Any) -> None:
    """Set a value from the command line: later wins, except that a repeated list option collects."""
    key = (spec.group, spec.name)
    previous = layer.fields.get(key)
    if spec.kind == "list" and previous is not None and parsed is not None:
        parsed = (previous if isinstance(previous, list) else [previous]) + (
            parsed if isinstance(parsed, list) else [parsed])
    layer.fields[key] = parsed


def _extra(layer: Layer, schema: Schema, key: str, value: str | None, argv: Sequence[str], i: int,
           written: str) -> int:
    """An option no group defines, for the script's ``extra`` (``--extra.NAME``: explicitly so); returns the next
    argument's index."""
    explicit = key.startswith("extra.")
    key = key[len("extra."):] if explicit else key
    if value is None and i < len(argv) and not _is_option(argv[i]):
        value, i = argv[i], i + 1
    if value is not None:
        layer.extra[key] = parse_extra(value)
    elif key.startswith("no_"):
        key = key[3:]
        layer.extra[key] = False
    else:
        layer.extra[key] = True
    if not explicit:
        layer.loose[key] = written
    return i
