"""The ``twinkle`` console script: one sub-command per module under ``twinkle.cli``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from twinkle import __version__


def build_parser() -> argparse.ArgumentParser:
    from twinkle.cli import info_cmd, plugins_cmd

    parser = argparse.ArgumentParser(prog="twinkle", description="twinkle: a modular LLM training workbench.")
    parser.add_argument("--version", action="version", version=f"twinkle-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plugins_cmd.add_parser(sub)
    info_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
