"""The ``twinkle`` console script: core's sub-commands plus those plugins register (kind ``command``).

Core's own commands are modules under ``twinkle.cli``. A plugin command (``twinkle serve`` from
twinkle-server) is a registered ``main(argv)`` function: it is imported only when it runs and gets
every argument after its name, so its own options and ``--help`` are its business.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from twinkle import __version__

#: Commands defined by core itself (modules under twinkle.cli); a plugin cannot take these names.
BUILTIN_COMMANDS = ("plugins", "info", "train", "plot")


def _plugin_commands() -> dict[str, str]:
    """Registered plugin commands -> their one-line help (registry listing only: nothing heavy is imported)."""
    from twinkle.registry import get_registry

    return {c.name: c.description or f"provided by {c.distribution} {c.version}"
            for c in get_registry().components("command") if c.name not in BUILTIN_COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    from twinkle.cli import info_cmd, plot_cmd, plugins_cmd, train_cmd

    parser = argparse.ArgumentParser(prog="twinkle", description="twinkle: a modular LLM training workbench.")
    parser.add_argument("--version", action="version", version=f"twinkle-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plugins_cmd.add_parser(sub)
    info_cmd.add_parser(sub)
    train_cmd.add_parser(sub)
    plot_cmd.add_parser(sub)
    for name, help_text in sorted(_plugin_commands().items()):
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def run_plugin_command(name: str, argv: Sequence[str]) -> int:
    """Import the command ``name`` registered by a plugin and run it with ``argv``."""
    from twinkle.errors import ComponentLoadError, ComponentNotFoundError
    from twinkle.registry import get_registry

    try:
        command = get_registry().load("command", name)
    except (ComponentNotFoundError, ComponentLoadError) as exc:
        sys.stderr.write(f"twinkle: error: {exc}\n")
        return 2
    return int(command(list(argv)) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in BUILTIN_COMMANDS:
        return run_plugin_command(argv[0], argv[1:])
    if argv[:1] == ["train"]:  # its options are the Trainer's, parsed by the config layer
        from twinkle.cli import train_cmd

        return train_cmd.run(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `twinkle` alone: the help is the answer
        parser.print_help()
        return 0
    return int(args.func(args) or 0)

if __name__ == "__main__":
    sys.exit(main())
