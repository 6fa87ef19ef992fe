"""twinkle-server's registrations (entry point ``twinkle = server``): the ``twinkle serve`` command."""

from __future__ import annotations

from twinkle.hookspecs import hookimpl
from twinkle.registry import ComponentSpec


@hookimpl
def register_commands():
    return {"serve": ComponentSpec("twinkle_server.cli:main",
                                   description="run the Tinker-compatible multi-tenant training service")}
