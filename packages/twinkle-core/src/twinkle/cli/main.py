"""The ``twinkle`` console script: one sub-command per module under ``twinkle.cli``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from twinkle import __version__


def build_parser() -> argparse.ArgumentParser:
    from twinkle.cli import info_cmd, plugins_cmd, train_cmd

    parser = argparse.ArgumentParser(prog="twinkle", description="twinkle: a modular LLM training workbench.")
    parser.add_argument("--version", action="version", version=f"twinkle-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plugins_cmd.add_parser(sub)
    info_cmd.add_parser(sub)
    train_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if argv[:1] == ["train"] and not {"-h", "--help"} & set(argv[1:]):
        # `twinkle train [CONFIG] --group.field value ...`: the overrides are the Trainer's, not argparse's
        head = 2 if len(argv) > 1 and not argv[1].startswith("-") else 1
        argv, extra = argv[:head], argv[head:]
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "accepts_overrides", False):
        return int(args.func(args, extra) or 0)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
