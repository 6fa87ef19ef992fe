"""Refusing to save non-finite trainable weights: a diverged run must not overwrite good checkpoints silently."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twinkle.checkpoint.errors import CheckpointError


def check_finite(named_tensors: Iterable[tuple[str, Any]], what: str) -> None:
    """Raise CheckpointError (on every rank together) if any floating tensor holds NaN or inf.

    Sharded tensors (DTensor) are checked shard by shard; the ranks agree through
    ``twinkle.collective``, so all of them refuse or none does (one host sync per rank).
    """
    import torch

    from twinkle import collective

    named = [(n, t.to_local() if hasattr(t, "to_local") else t) for n, t in named_tensors]
    named = [(n, t.detach()) for n, t in named if t.is_floating_point() and t.numel()]
    bad: list[str] = []
    if named:
        flags = torch.stack([torch.isfinite(t).all().to(named[0][1].device) for _, t in named]).cpu()
        bad = [n for (n, _), ok in zip(named, flags.tolist()) if not ok]
    failed = collective.failed_ranks(not bad)
    if not failed:
        return
    where = f" (e.g. {bad[:3]})" if bad else f" on rank(s) {failed}"
    raise CheckpointError(
        f"Refusing to save {what}: its trainable weights are non-finite (NaN or inf){where}; training diverged. "
        "Resume from an earlier checkpoint (lower the lr or clip gradients), or pass allow_non_finite=True to "
        "save them anyway."
    )
