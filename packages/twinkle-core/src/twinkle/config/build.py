"""From layers of values to the config object, and the checks a config makes when it is constructed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from twinkle.config.schema import ConfigError, Schema, brief, schema_of
from twinkle.config.sources import Layer, from_mapping
from twinkle.config.values import coerce

T = TypeVar("T")


class _Spellings(type):
    """Config classes take every spelling of their options as keywords: ``TrainerConfig(optim_cfg=...)``,
    ``DatasetConfig(anno_path=...)``. Keywords that are all field names construct the dataclass directly;
    any other spelling goes through :func:`from_mapping` and :func:`build`, with the same checks and errors."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if kwargs and not args and dataclasses.is_dataclass(cls):
            if not set(kwargs) <= {f.name for f in dataclasses.fields(cls)}:
                return build(cls, [from_mapping(schema_of(cls), kwargs)], required=False)
        return super().__call__(*args, **kwargs)


class Config(metaclass=_Spellings):
    """Base of config dataclasses: every field is checked (and converted) when the object is made.

    ``LoraConfig(r=0)`` fails like ``--lora.r 0`` does; a group given as a mapping is built (``None``: its
    defaults; a list: the group's ``LIST_FIELD``). Any spelling of a field works as a keyword.
    Override :meth:`check` for rules across fields.
    """

    def __post_init__(self) -> None:
        schema = schema_of(type(self))
        for (group, name), spec in schema.specs.items():
            if not group:
                setattr(self, name, coerce(spec, getattr(self, name), name))
        for name, group_cls in schema.groups.items():
            value = getattr(self, name)
            if value is None:
                value = group_cls()
                setattr(self, name, value)
            if isinstance(value, (list, tuple)) and getattr(group_cls, "LIST_FIELD", None):
                value = {group_cls.LIST_FIELD: list(value)}
            if isinstance(value, Mapping):
                setattr(self, name, _group(group_cls, name, from_mapping(schema, {name: value}).fields))
            elif not isinstance(value, group_cls):
                raise ConfigError(f"{name}: expected a table of {group_cls.__name__} fields, got {brief(value)}.",
                                  option=name, value=value)
        self.check()

    def check(self) -> None:
        """Rules across fields (a subclass's); raise :class:`ConfigError` naming them."""


def build(cls: type[T], layers: Iterable[Layer], *, required: bool = True) -> T:
    """The config ``cls`` from ``layers`` (later wins); missing ``required`` options are errors."""
    schema = schema_of(cls)
    values: dict[tuple[str, str], Any] = {}
    extra: dict[str, Any] = {}
    for layer in layers:
        values.update(layer.fields)
        extra.update(layer.extra)
    if required:
        _check_required(schema, lambda group, name: values.get((group, name), schema.specs[(group, name)].default))
    kwargs: dict[str, Any] = {name: value for (group, name), value in values.items() if not group}
    for group, group_cls in schema.groups.items():
        kwargs[group] = _group(group_cls, group, values)
    if schema.extra:
        kwargs["extra"] = extra
    return cls(**kwargs)


def _group(group_cls: type, group: str, values: Mapping[tuple[str, str], Any]) -> Any:
    """The group ``group`` from the values set for it; an error of a rule across its fields names the group."""
    try:
        return group_cls(**{name: value for (g, name), value in values.items() if g == group})
    except ConfigError as exc:
        if str(exc).startswith(f"{group}."):
            raise
        raise ConfigError(f"{group}.{exc}", option=exc.option, value=exc.value, expected=exc.expected) from None


def check_required(config: Any) -> None:
    """Every ``required`` option of ``config`` (a built object) is set, else a :class:`ConfigError`."""
    schema = schema_of(type(config))
    _check_required(schema, lambda group, name: getattr(getattr(config, group) if group else config, name))


def _check_required(schema: Schema, value_of: Any) -> None:
    for (group, name), spec in schema.specs.items():
        if spec.required and value_of(group, name) is None:
            raise ConfigError(f"{spec.dotted} is required: {spec.required}", option=spec.option)

