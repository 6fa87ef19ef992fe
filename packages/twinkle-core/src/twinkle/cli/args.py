"""``CLI``: the argument object a training script reads (``args = CLI.from_args()``; the reference user script's flow).

Options are grouped (``args.training.batch_size``) so one name means one thing in scripts, config
files and the environment alike. Subclass it as a dataclass to add groups of your own::

    @dataclass
    class MyCLI(CLI):
        reward: RewardArgs = field(default_factory=RewardArgs)

The options are a schema of :mod:`twinkle.config` (the layer ``twinkle train`` and ``twinkle serve``
use too). Only the standard library is imported here; PyYAML loads only when a ``.yaml`` config is given.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from twinkle.cli.args_groups import (
    DatasetArgs,
    InfraArgs,
    LoraArgs,
    ModelArgs,
    OptimizerArgs,
    SchedulerArgs,
    TemplateArgs,
    TrainingArgs,
)
from twinkle.config import ConfigError, build, from_argv, from_env, from_mapping, load_file, render_help, schema_of
from twinkle.config.sources import ENV_PREFIX, ENV_SEPARATOR, check_declared

#: The errors of ``CLI.parse``: :class:`twinkle.config.ConfigError` (``.option``, ``.value``, ``.expected``).
CLIError = ConfigError

C = TypeVar("C", bound="CLI")
_PLAIN_MODULE_NAME = re.compile(r"\w+")


class CLIHelpRequested(Exception):
    """``-h``/``--help`` was given to :meth:`CLI.parse`; ``text`` is the help. ``from_args`` prints it and exits 0."""

    def __init__(self, text: str) -> None:
        super().__init__("help requested")
        self.text = text


@dataclass
class CLI:
    """Every option of a twinkle training script, by group, plus ``extra`` for the script's own keys."""

    infra: InfraArgs = field(default_factory=InfraArgs)
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    dataset: DatasetArgs = field(default_factory=DatasetArgs)
    template: TemplateArgs = field(default_factory=TemplateArgs)
    training: TrainingArgs = field(default_factory=TrainingArgs)
    optimizer: OptimizerArgs = field(default_factory=OptimizerArgs)
    scheduler: SchedulerArgs = field(default_factory=SchedulerArgs)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls: type[C], argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None,
              allow_extra: bool = False, **defaults: Any) -> C:
        """Library entry: build the arguments, raising :class:`ConfigError` (or :class:`CLIHelpRequested`).

        Args:
            argv: the arguments (default: ``sys.argv[1:]``).
            environ: the environment (default: ``os.environ``).
            allow_extra: accept any unknown option into ``extra``. Otherwise an option no group defines is
                an error (a typo such as ``--learning-rat``) unless the script declared it: a default here,
                ``--extra.NAME VALUE``, an ``extra:`` table in the config file or ``TWINKLE_EXTRA__NAME``.
            defaults: the script's own defaults (``batch_size=8`` or ``training={'batch_size': 8}``; other
                names are its extra options), below every source.

        Returns:
            The arguments.
        """
        schema = schema_of(cls)
        argv = list(sys.argv[1:] if argv is None else argv)
        cli_layer = from_argv(schema, argv)
        if cli_layer.help:
            raise CLIHelpRequested(cls.help_text())
        script = from_mapping(schema, defaults, "CLI defaults")
        layers = [script]
        if cli_layer.config is not None:
            layers.append(from_mapping(schema, load_file(cli_layer.config), cli_layer.config))
        layers += [from_env(schema, os.environ if environ is None else environ), cli_layer]
        if not allow_extra:
            check_declared(schema, layers[1:], set(script.extra) | {k for layer in layers[1:] for k in layer.extra
                                                                    if k not in layer.loose})
        return build(cls, layers)

    @classmethod
    def from_args(cls: type[C], argv: Sequence[str] | None = None, *, allow_extra: bool = False,
                  **defaults: Any) -> C:
        """Script entry: like :meth:`parse`, but ``--help`` prints and exits 0, and a bad option exits 2."""
        try:
            return cls.parse(argv, allow_extra=allow_extra, **defaults)
        except CLIHelpRequested as help_request:
            sys.stdout.write(help_request.text)
            raise SystemExit(0) from None
        except ConfigError as exc:
            sys.stderr.write(f"{_prog()}: error: {exc}\n(see {_prog()} --help)\n")
            raise SystemExit(2) from None

    @classmethod
    def help_text(cls, prog: str | None = None) -> str:
        """The ``--help`` text: every option with its spellings, help, type and default."""
        prog = prog or _prog()
        return render_help(schema_of(cls), f"usage: {prog} [--config FILE] [--NAME VALUE | --GROUP.NAME VALUE ...]", [
            f"Sources, later wins: defaults < --config FILE (YAML or TOML, nested by group) < environment "
            f"{ENV_PREFIX}<GROUP>{ENV_SEPARATOR}<NAME> < command line. A script's own options go to args.extra: "
            "--extra.NAME VALUE, or --NAME VALUE when the script declares NAME (a default); other unknown "
            "options are errors.",
            "  --config FILE  a .yaml/.yml or .toml file: {group: {name: value}}",
            "  -h, --help     show this help and exit",
        ])

    def get_lora_args(self) -> dict[str, Any]:
        """Keyword arguments for ``peft.LoraConfig`` (peft's names) from the ``lora`` group.

        A single plain module name becomes a one-item list: peft reads a string as a regex over the
        full module path, so ``'q_proj'`` alone would match nothing. ``'all-linear'`` and regexes pass as-is.
        """
        lora = self.lora
        targets = lora.target_modules
        if isinstance(targets, str) and _PLAIN_MODULE_NAME.fullmatch(targets):
            targets = [targets]
        kwargs: dict[str, Any] = {"r": lora.r, "lora_alpha": lora.lora_alpha, "lora_dropout": lora.lora_dropout,
                                  "target_modules": list(targets) if isinstance(targets, list) else targets}
        if lora.modules_to_save:
            kwargs["modules_to_save"] = list(lora.modules_to_save)
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        """Every value, nested by group, for logging and experiment trackers (a deep copy)."""
        return dataclasses.asdict(self)


def _prog() -> str:
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "twinkle"
