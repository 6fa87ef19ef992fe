"""The derived bound within which a distributed run (ranks, a Ray actor pair) must match its one-process reference.

The ranks run the reference's float32 operations in another summation order (a gradient summed per rank, then
all-reduced or reduce-scattered; a matmul over a shard). One step's loss or gradient then differs by at most
``tiny_hf(seq, rows).step_bound()`` relative (tests/rounding.py: the hf_testing model, 12-token rows). The scenarios
train under AdamW with ``eps = 1`` (scripts/scenarios.py): its update is Lipschitz in the gradient with constant
at most ``2 lr / eps`` (derived in tests/server/test_ray_mode.py), where ``eps = 1e-8`` would turn the rounding
of a near-zero gradient into an update of ``lr * sign(g)`` that no bound covers. Step k carries the rounding of
the k - 1 steps that made its weights, twice each, and its own: ``2 (steps - 1) + 1`` step bounds cover a run.
Weights are compared per tensor by norm: the bound times the update, plus float32 storage of each step's weight
(``u * |w|`` per step, which way it rounds can differ once the update differs); every compared tensor must have
moved far beyond that room, so the comparison can fail.
"""

from __future__ import annotations

import pytest
from hf_testing import VOCAB
from rounding import U, tiny_hf


def run_bound(steps: int, rows: int = 4, seq: int = 12) -> float:
    """Relative bound on any loss, gradient norm or weight update of a ``steps``-step run on ``rows`` rows."""
    shape = tiny_hf(seq, rows, VOCAB)
    return (2 * (steps - 1) + 1) * shape.step_bound()


def flat(losses: list) -> list[float]:
    return [x for item in losses for x in (item if isinstance(item, list) else [item])]


def assert_trained_alike(got: dict, want: dict, steps: int, rows: int = 4) -> None:
    """``got``'s losses and trained weights within :func:`run_bound` of ``want`` (both from scenarios.train)."""
    bound = run_bound(steps, rows)
    assert flat(got["losses"]) == pytest.approx(flat(want["losses"]), rel=bound, abs=0)
    assert sorted(got["params"]) == sorted(want["params"])
    for key, final in want["params"].items():
        update = (final - want["initial"][key]).norm().item()
        room = bound * update + steps * U * final.norm().item()
        assert (got["params"][key] - final).norm().item() <= room, (key, room)
        assert update > 10 * room, (key, update, room)  # the weight moved far beyond the bound
