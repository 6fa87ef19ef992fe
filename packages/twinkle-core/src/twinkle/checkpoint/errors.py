"""The error raised for unusable checkpoints and save names."""

from __future__ import annotations

from twinkle.errors import TwinkleError


class CheckpointError(TwinkleError, ValueError):
    """A checkpoint directory is missing, incomplete or corrupt, or a save name is unsafe."""
