"""Where option values come from: a mapping (config file or ``from_args`` defaults), the environment, argv.

Each reader returns :class:`Layer` — checked field values plus ``extra`` — and ``CLI.parse`` applies
the layers in increasing precedence: defaults < ``--config`` file < ``TWINKLE_*`` environment < argv.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle.cli.args_schema import (
    FALSE_WORDS,
    TRUE_WORDS,
    CLIError,
    Schema,
    coerce,
    norm,
    parse_extra,
    resolve,
)

ENV_PREFIX = "TWINKLE_"
ENV_SEPARATOR = "__"


@dataclass
class Layer:
    """The values one source sets: ``fields[(group, name)]`` and unrecognised ``extra`` keys."""

    fields: dict[tuple[str, str], Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    config: str | None = None  # argv only: the --config path
    help: bool = False  # argv only: -h/--help was given


def from_mapping(schema: Schema, data: Mapping[str, Any], source: str) -> Layer:
    """A nested ``{group: {field: value}}`` mapping; top-level non-group keys are flat field names or extra."""
    layer = Layer()
    for raw_key, value in data.items():
        key = norm(str(raw_key))
        if key == "extra":
            if not isinstance(value, Mapping):
                raise CLIError(f"{source}: 'extra' must be a table of key: value, got {type(value).__name__}.")
            layer.extra.update({norm(str(k)): v for k, v in value.items()})
        elif key in schema.groups:
            if not isinstance(value, Mapping):
                raise CLIError(f"{source}: '{raw_key}' is an option group and needs a table of fields, "
                               f"got {value!r}.", option=f"{source}: {raw_key}", value=value)
            for raw_name, item in value.items():
                _set(layer, schema, f"{key}.{raw_name}", item, f"{source}: {key}.{raw_name}")
        elif not _set(layer, schema, key, value, f"{source}: {raw_key}"):
            layer.extra[key] = value  # no field of that name: kept for the script, like an unknown --option
            warn_if_misspelled(schema, key, f"{source}: {raw_key!r}")
    return layer


def warn_if_misspelled(schema: Schema, key: str, where: str) -> None:
    """An unknown key close to a group or option name is most likely a typo: say so (it still goes to extra)."""
    import difflib
    import warnings

    known = [*schema.groups, *(name for name in schema.names if "." not in name)]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    if close:
        warnings.warn(f"{where} is not a twinkle option and was kept in extra; did you mean {close[0]!r}? (Put a "
                      "script's own keys under 'extra:' to silence this.)", UserWarning, stacklevel=4)


def _set(layer: Layer, schema: Schema, name: str, value: Any, option: str) -> bool:
    """Set the field ``name`` (any spelling ``--name`` accepts) from a file/env value; False if no such field."""
    hit = resolve(schema, name, option)
    if hit is None:
        return False
    spec, negated = hit
    parsed = coerce(spec, value, option)
    layer.fields[(spec.group, spec.name)] = (not parsed) if negated else parsed
    return True


def load_config(path: str | Path, schema: Schema) -> Layer:
    """Read a ``.yaml``/``.yml`` (PyYAML, imported only here) or ``.toml`` file nested by group."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise _config_error(path, "expected a .yaml, .yml or .toml file.")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _config_error(path, f"cannot read it ({exc.strerror or exc}).") from None
    loads, parse_error, kind = _parser(suffix, path)
    try:
        data = loads(text)
    except parse_error as exc:
        raise _config_error(path, f"not valid {kind}: {exc}.") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise _config_error(path, f"the top level must be a mapping of groups, got {type(data).__name__}.")
    return from_mapping(schema, data, str(path))


def _config_error(path: Path, message: str) -> CLIError:
    return CLIError(f"--config {path}: {message}", option="--config", value=str(path))


def _parser(suffix: str, path: Path) -> tuple[Callable[[str], Any], type[Exception], str]:
    """(loads, its error type, the format's name) for a config file; a missing library names its package."""
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - exercised on Python 3.10 only
            try:
                import tomli as tomllib
            except ImportError:
                raise _config_error(path, "reading TOML on Python 3.10 needs tomli: pip install tomli.") from None
        return tomllib.loads, tomllib.TOMLDecodeError, "TOML"
    try:
        import yaml
    except ImportError:
        raise _config_error(path, "reading YAML needs PyYAML: pip install pyyaml (or use a .toml file).") from None
    return yaml.safe_load, yaml.YAMLError, "YAML"


def from_env(schema: Schema, environ: Mapping[str, str]) -> Layer:
    """``TWINKLE_<GROUP>__<FIELD>=value`` (and ``TWINKLE_EXTRA__<KEY>``); other ``TWINKLE_*`` names are ignored."""
    layer = Layer()
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name:
            continue
        group, _, field_name = name[len(ENV_PREFIX):].lower().partition(ENV_SEPARATOR)
        value = environ[name]
        if group == "extra":
            layer.extra[field_name] = parse_extra(value)
        elif group in schema.groups:
            _set(layer, schema, f"{group}.{field_name}", value, name)
    return layer


def _is_option(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def from_argv(schema: Schema, argv: Sequence[str]) -> Layer:
    """``--name value``, ``--name=value``, ``--group.name``, ``--flag``/``--no-flag``; unknown names go to extra."""
    layer = Layer()
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token in ("-h", "--help"):
            layer.help = True
            continue
        if not _is_option(token):
            raise CLIError(f"unexpected argument {token!r}: options are written --name value or --name=value "
                           "(booleans: --flag, --no-flag or --flag=false).", option=token, value=token)
        name, eq, inline = token[2:].partition("=")
        value: str | None = inline if eq else None
        if norm(name) == "config":
            if value is None:
                if i >= len(argv) or _is_option(argv[i]):
                    raise CLIError("--config needs a file path.", option="--config")
                value, i = argv[i], i + 1
            layer.config = value
            continue
        hit = resolve(schema, name, f"--{name}")
        if hit is None:
            key = norm(name)
            warn_if_misspelled(schema, key, f"--{name}")
            if value is None and i < len(argv) and not _is_option(argv[i]):
                value, i = argv[i], i + 1
            if value is not None:
                layer.extra[key] = parse_extra(value)
            elif key.startswith("no_"):
                layer.extra[key[3:]] = False
            else:
                layer.extra[key] = True
            continue
        spec, negated = hit
        option = f"--{name}"
        if spec.kind == "bool":
            if value is None and i < len(argv) and argv[i].strip().lower() in TRUE_WORDS + FALSE_WORDS:
                value, i = argv[i], i + 1
            if negated and value is not None:
                raise CLIError(f"{option} takes no value (write --{spec.name.replace('_', '-')}={value}).",
                               option=option, value=value)
            layer.fields[(spec.group, spec.name)] = not negated if value is None else coerce(spec, value, option)
            continue
        if value is None:
            if i >= len(argv) or _is_option(argv[i]):
                raise CLIError(f"{option} needs a value ({spec.type_label()}).", option=option,
                               expected=spec.type_label())
            value, i = argv[i], i + 1
        parsed = coerce(spec, value, option)
        previous = layer.fields.get((spec.group, spec.name))
        if spec.kind in ("list", "str_or_list") and previous is not None:  # repeated: accumulate
            parsed = _as_list(previous) + _as_list(parsed)
        layer.fields[(spec.group, spec.name)] = parsed
    return layer


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]
