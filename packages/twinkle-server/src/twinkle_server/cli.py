"""``twinkle serve [CONFIG] [--group.field value ...]`` and ``twinkle serve keygen OWNER --keys-file FILE``.

Options are written like ``twinkle train``'s (the same parser): ``--model.model-id ms://Qwen/Qwen3-0.6B``,
``--infra.mode ray --infra.dp-size 2``, ``--server.port 8000 --server.api-keys-file keys.txt``; a
YAML/TOML CONFIG gives the same fields nested by group.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: twinkle serve [CONFIG] [--group.field value ...]
       twinkle serve keygen OWNER --keys-file FILE

Run the Tinker-compatible training service (see docs/server.md). `keygen` creates an API key for
OWNER, appends its SHA-256 to FILE and prints the key once.
"""


def main(argv: Sequence[str]) -> int:
    from twinkle.cli.train_cmd import parse_overrides
    from twinkle.cli.train_help import options_help
    from twinkle.trainer._validate import ConfigError, build
    from twinkle.trainer.config import apply_overrides, load_config_file
    from twinkle_server.config import ServerConfig

    argv = list(argv)
    if {"-h", "--help"} & set(argv):
        print(USAGE + "\n" + options_help(config_cls=ServerConfig))
        return 0
    try:
        if argv[:1] == ["keygen"]:
            return _keygen(argv[1:])
        head = 1 if argv and not argv[0].startswith("--") else 0
        data = load_config_file(argv[0]) if head else {}
        config = build(ServerConfig, apply_overrides(data, parse_overrides(argv[head:], ServerConfig)))
        from twinkle_server.server import serve

        return serve(config)
    except ConfigError as exc:
        print(f"twinkle serve: error: {exc}", file=sys.stderr)
        return 2


def _keygen(argv: list[str]) -> int:
    from twinkle.trainer._validate import ConfigError
    from twinkle_server.auth import add_key

    if len(argv) != 3 or argv[1] != "--keys-file":
        raise ConfigError("usage: twinkle serve keygen OWNER --keys-file FILE")
    key = add_key(argv[2], argv[0])
    print(f"API key for {argv[0]} (shown once; its hash was added to {argv[2]}):\n{key}")
    return 0
