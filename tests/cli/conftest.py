"""Shared helpers for the CLI argument tests: a parse with a controlled environment, temp config files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from twinkle.cli import CLI


@pytest.fixture(autouse=True)
def _no_twinkle_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own TWINKLE_<GROUP>__<FIELD> variables must not leak into these tests."""
    import os

    for name in list(os.environ):
        if name.startswith("TWINKLE_") and "__" in name:
            monkeypatch.delenv(name)


@pytest.fixture
def parse() -> Callable[..., CLI]:
    """parse(*argv, env={...}, cls=CLI, **defaults) -> CLI, with exactly that environment."""

    def run(*argv: str, env: dict[str, str] | None = None, cls: type[CLI] = CLI, **defaults: object) -> CLI:
        return cls.parse(list(argv), environ=env or {}, **defaults)

    return run


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], str]:
    """write('cfg.yaml', text) -> the path of a new file under tmp_path."""

    def make(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return make


def help_entries(text: str) -> dict[str, str]:
    """A ``--help`` text's options by their first spelling (``--[no-]`` as ``--``), wrapped lines joined."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("  --"):
            current = line.split()[0].rstrip(",").replace("[no-]", "")
            entries[current] = line.strip()
        elif current is not None and line.startswith("      "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.fixture(name="help_entries")
def _help_entries() -> Callable[[str], dict[str, str]]:
    return help_entries
