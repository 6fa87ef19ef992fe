"""``twinkle serve [CONFIG] [--group.field value ...]`` and ``twinkle serve keygen OWNER --keys-file FILE``.

Options are written like ``twinkle train``'s (the same config layer): ``--model.model-id ms://Qwen/Qwen3-0.6B``,
``--infra.mode ray --infra.dp-size 2``, ``--server.port 8000 --server.api-keys-file keys.txt``; a
YAML/TOML CONFIG gives the same fields nested by group.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

USAGE = "usage: twinkle serve [CONFIG] [--GROUP.NAME VALUE ...]\n       twinkle serve keygen OWNER --keys-file FILE"
INTRO = ["Run the Tinker-compatible training service (see docs/server.md). `keygen` creates an API key for",
         "OWNER, appends its SHA-256 to FILE and prints the key once.", "",
         "  CONFIG  a .yaml/.yml/.toml file with the options below, nested by group"]


def main(argv: Sequence[str]) -> int:
    from twinkle.cli.errors import describe
    from twinkle.config import ConfigError, build, from_argv, from_mapping, load_file, render_help, schema_of
    from twinkle.hub import HubError
    from twinkle_server.config import ServerConfig

    argv = list(argv)
    schema = schema_of(ServerConfig)
    if {"-h", "--help"} & set(argv):
        print(render_help(schema, USAGE, INTRO), end="")
        return 0
    config = None
    try:
        if argv[:1] == ["keygen"]:
            return _keygen(argv[1:])
        options = from_argv(schema, argv, positional_config=True)
        layers = [from_mapping(schema, load_file(options.config), options.config)] if options.config else []
        config = build(ServerConfig, [*layers, options])
        _check_names(config)
        from twinkle_server.server import serve

        return serve(config)
    except (ConfigError, HubError) as exc:  # a hub id that does not resolve: named with its option
        print(f"twinkle serve: error: {describe(exc, config)}", file=sys.stderr)
        return 2


def _check_names(config: Any) -> None:
    """The model class the config names is registered: a ConfigError naming --model.type before anything loads."""
    from twinkle.config import ConfigError
    from twinkle.errors import ComponentNotFoundError
    from twinkle.registry import get_registry

    try:
        get_registry().get("model", config.model.type)
    except ComponentNotFoundError as exc:
        raise ConfigError(f"--model.type: {exc}", option="--model.type", value=config.model.type) from None


def _keygen(argv: list[str]) -> int:
    from twinkle.config import ConfigError
    from twinkle_server.auth import add_key

    if len(argv) != 3 or argv[1] != "--keys-file":
        raise ConfigError("usage: twinkle serve keygen OWNER --keys-file FILE")
    key = add_key(argv[2], argv[0])
    print(f"API key for {argv[0]} (shown once; its hash was added to {argv[2]}):\n{key}")
    return 0
