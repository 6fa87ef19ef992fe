"""Errors of the Megatron backend; each says what was asked, what is supported, and how to fix it."""

from __future__ import annotations

from twinkle.errors import TwinkleError


class MegatronConfigError(TwinkleError, ValueError):
    """A model, mesh, optimizer or scheduler the Megatron backend cannot run (raised before weights load)."""


class MegatronRuntimeError(TwinkleError, RuntimeError):
    """A Megatron code path that needs hardware or software this process does not have."""
