"""The order of a stream: several sources mixed by weight, then a seeded shuffle buffer.

Both are pure functions of their seeds, so every rank and every DataLoader worker computes the same
global order without talking to the others, and a resumed run recomputes where it was. The mixing
draws depend on the row position only (drawn in fixed blocks), so the sources' read positions after
``n`` rows are known without reading them: a mixed stream seeks like its sources do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

StoppingStrategy = Literal["first_exhausted", "all_exhausted"]
DRAW_BLOCK = 4096


class MixChoices:
    """Which source gives row ``j`` of the mixed stream: round robin without weights, else seeded draws."""

    def __init__(self, num_sources: int, weights: Sequence[float] | None, seed: int) -> None:
        self.num_sources = num_sources
        self.cumulative = None if weights is None else np.cumsum(np.asarray(weights, float) / float(sum(weights)))
        self.seed = seed

    def block(self, b: int) -> np.ndarray:
        """Source of rows ``[b * DRAW_BLOCK, (b + 1) * DRAW_BLOCK)``."""
        if self.cumulative is None:
            return np.arange(b * DRAW_BLOCK, (b + 1) * DRAW_BLOCK) % self.num_sources
        draws = np.random.default_rng([self.seed, b]).random(DRAW_BLOCK)
        return np.minimum(np.searchsorted(self.cumulative, draws, side="right"), self.num_sources - 1)

    def counts_before(self, n: int) -> np.ndarray:
        """How many of the first ``n`` mixed rows each source gave."""
        counts = np.zeros(self.num_sources, dtype=np.int64)
        full, rest = divmod(n, DRAW_BLOCK)
        for b in range(full):
            counts += np.bincount(self.block(b), minlength=self.num_sources)
        if rest:
            counts += np.bincount(self.block(full)[:rest], minlength=self.num_sources)
        return counts

    def iter_from(self, start: int) -> Iterator[int]:
        b, offset = divmod(start, DRAW_BLOCK)
        while True:
            yield from self.block(b)[offset:].tolist()
            b, offset = b + 1, 0


def mix(open_source: Callable[[int, int], Iterator[Any]], choices: MixChoices, start: int,
        stopping_strategy: StoppingStrategy, lengths: Callable[[], Sequence[int]]) -> Iterator[tuple[int, Any]]:
    """``(source, row)`` of the mixed stream from row ``start``; ``open_source(k, pos)`` reads source k from pos.

    ``first_exhausted`` ends at the first draw of a source that has no row left; ``all_exhausted``
    restarts a finished source from its first row until every source has finished once (it needs
    the sources' lengths to seek).
    """
    counts = choices.counts_before(start)
    if stopping_strategy == "all_exhausted":
        sizes = list(lengths())
        # every draw gives one row (a finished source restarts at once), so source k is at row counts[k] of
        # its cycle; it is marked finished by the draw after its last row, as in an uninterrupted read
        finished = {k for k in range(choices.num_sources) if counts[k] > sizes[k]}
        positions = [(int(counts[k]) - 1) % sizes[k] + 1 if counts[k] and sizes[k] else 0
                     for k in range(choices.num_sources)]
    else:
        finished, positions = set(), [int(c) for c in counts]
    readers = [open_source(k, positions[k]) for k in range(choices.num_sources)]
    for k in choices.iter_from(start):
        row = next(readers[k], _END)
        if row is _END:
            if stopping_strategy == "first_exhausted":
                return
            finished.add(k)
            if len(finished) == choices.num_sources:
                return
            readers[k] = open_source(k, 0)
            row = next(readers[k], _END)
            if row is _END:
                return  # an empty source
        yield k, row


_END = object()


def shuffled(rows: Iterable[Any], buffer_size: int, seed: Sequence[int]) -> Iterator[Any]:
    """A seeded shuffle buffer: each incoming row replaces a uniformly drawn one, which is emitted.

    Holds ``buffer_size`` rows at most; the draws come from ``numpy`` seeded by ``seed`` (e.g.
    ``[seed, epoch]``), in blocks, so the order is a pure function of the input order and the seed.
    """
    if buffer_size <= 1:
        yield from rows
        return
    rng = np.random.default_rng(list(seed))
    buffer: list[Any] = []
    draws: list[int] = []
    for row in rows:
        if len(buffer) < buffer_size:
            buffer.append(row)
            continue
        if not draws:
            draws = rng.integers(0, buffer_size, DRAW_BLOCK).tolist()[::-1]
        j = draws.pop()
        out, buffer[j] = buffer[j], row
        yield out
    for j in rng.permutation(len(buffer)).tolist():
        yield buffer[j]
