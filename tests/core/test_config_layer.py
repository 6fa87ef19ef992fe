"""twinkle.config on a config of its own: aliases of groups and fields, Path fields, required options,
one error type naming the option as written, and the help text — what issue 24's xtuner spellings build on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from twinkle.config import (
    Config,
    ConfigError,
    build,
    check_required,
    from_argv,
    from_mapping,
    opt,
    render_help,
    schema_of,
)


@dataclass
class Optim(Config):
    """The optimizer."""

    lr: float = opt(1e-3, "peak learning rate", gt=0, aliases=("learning_rate",))
    name: str = opt("AdamW", "optimizer name", choices=("AdamW", "SGD"))


@dataclass
class Infra(Config):
    mode: str = opt("local", "where it runs", choices=("local", "ray"), top_aliases=("infra_mode",))
    cp_size: int = opt(1, "context-parallel size", min=1, aliases=("sp_size",))


@dataclass
class Job(Config):
    optimizer: Optim = opt(factory=Optim, aliases=("optim_cfg",))
    infra: Infra = opt(factory=Infra)
    work_dir: str | Path = opt("out", "where it writes")
    keys_file: str | Path | None = opt(None, "the keys", required="make one with `keygen`.")
    total_step: int | None = opt(None, "steps", min=1)


def _job(data: dict, *argv: str) -> Job:
    schema = schema_of(Job)
    return build(Job, [from_mapping(schema, data), from_argv(schema, list(argv))], required=False)


def test_one_field_and_one_group_take_several_spellings():
    assert _job({"optim_cfg": {"learning_rate": 0.5}}).optimizer.lr == 0.5
    assert _job({}, "--optim_cfg.lr", "0.25").optimizer.lr == 0.25
    assert _job({}, "--learning-rate", "0.125", "--sp-size", "4", "--infra-mode", "ray").infra.cp_size == 4
    assert _job({"infra_mode": "ray"}).infra.mode == "ray"
    with pytest.raises(ConfigError, match=r"infra.cp_size: also set as infra.sp_size \(2 there, 4 here\)"):
        _job({"infra": {"sp_size": 2, "cp_size": 4}})


def test_paths_are_accepted_and_held_as_strings(tmp_path):
    assert _job({"work_dir": tmp_path}).work_dir == str(tmp_path)
    assert Job(work_dir=tmp_path).work_dir == str(tmp_path)
    assert Job(optimizer={"lr": "0.5"}).optimizer.lr == 0.5  # a group given as a table is built and checked


@pytest.mark.parametrize(("data", "argv", "message"), [
    ({"optimizer": {"lr": 0}}, [], "optimizer.lr: invalid value 0; expected float > 0."),
    ({}, ["--lr", "fast"], "--lr: invalid value 'fast'; expected float."),
    ({}, ["--name", "Adam"], "--name: invalid value 'Adam'; expected {AdamW,SGD} (did you mean 'AdamW'?)."),
    ({"optim_cfg": {"lrr": 1}}, [], "optim_cfg.lrr: unknown field; did you mean 'lr'?"),
    ({"total_stepp": 1}, [], "total_stepp: unknown field; did you mean 'total_step'?"),
    ({}, ["--total-step", "0"], "--total-step: invalid value '0'; expected int >= 1 or none."),
])
def test_every_error_names_the_option_as_written(data, argv, message):
    with pytest.raises(ConfigError) as error:
        _job(data, *argv)
    assert str(error.value) == message


def test_required_options_are_checked_when_built_and_on_request():
    with pytest.raises(ConfigError, match=r"^keys_file is required: make one with `keygen`\.$"):
        build(Job, [])
    with pytest.raises(ConfigError, match="keys_file is required"):
        check_required(Job())
    check_required(Job(keys_file="k.txt"))


def test_help_shows_spellings_types_defaults_and_required():
    text = render_help(schema_of(Job), "usage: job")
    assert "optimizer (also optim_cfg): The optimizer." in text
    assert "--optimizer.lr, --lr, --learning-rate FLOAT" in text and "(float > 0; default: 0.001)" in text
    assert "--infra.mode, --mode, --infra-mode {local,ray}" in text
    assert "--keys-file PATH" in text and "the keys (required)" in text
