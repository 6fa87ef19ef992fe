"""IterablePackingDataset: a stream of packs, filled from a buffer of encoded rows as they stream."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from twinkle.dataset.errors import DataError
from twinkle.dataset.iterable_dataset import IterableDataset
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packing import GROUP_COLUMN, PackReport, pack_budget, pack_groups, pack_row, row_groups


class IterablePackingDataset(IterableDataset):
    """An :class:`IterableDataset` whose items are packs of up to ``max_length`` tokens.

    Rows are read ``packing_interval`` at a time, encoded, and packed best-fit-decreasing (see
    :mod:`twinkle.dataset.packing`); the packs of one buffer come out before the next buffer is read.
    Rows sharing a ``group_id`` pack together; the last group of a buffer is held for the next one,
    since the stream may go on with more of its rows.
    ``cyclic=True`` starts the stream over when it ends (an endless stream: train by steps).

    Packing needs every row encoded, so unlike a plain stream it is done on every data-parallel rank
    (the DataLoader then hands out whole packs, rank ``r`` taking packs ``r, r + R, ...`` of each
    global batch); resuming re-encodes and re-packs the stream up to the resume point, which makes
    it exact. ``packing_num_proc`` is accepted for upstream compatibility (packing is one pass).
    """

    def __init__(self, dataset_meta: DatasetMeta | str | None = None, packing_interval: int = 128,
                 packing_num_proc: int = 1, cyclic: bool = False, **load_kwargs: Any) -> None:
        if isinstance(packing_interval, bool) or not isinstance(packing_interval, int) or packing_interval < 1:
            raise DataError(f"packing_interval must be a positive integer (rows per packing buffer), got "
                            f"{packing_interval!r}.")
        super().__init__(dataset_meta, **load_kwargs)
        self.packing_interval = packing_interval
        self.packing_num_proc = packing_num_proc
        self.cyclic = bool(cyclic)
        self.max_length: int | None = None
        self._report = [0, 0, 0]  # rows, packs, tokens packed by this process

    def pack_dataset(self, max_length: int | None = None) -> IterablePackingDataset:
        """Start packing (encoding too, if ``encode()`` was not called).

        Args:
            max_length: the pack budget; defaults to the template's ``max_length``.
        """
        max_length = pack_budget(self.template, max_length)
        if not any(step.kind == "encode" for step in self._steps):
            self.encode()
        self.max_length = int(max_length)
        return self

    @property
    def pack_report(self) -> PackReport | None:
        """Fill of the packs this process has built so far."""
        rows, packs, tokens = self._report
        return PackReport(rows, packs, tokens, self.max_length) if self.max_length else None

    def _packs(self, epoch: int, shuffle_buffer: int, seed: int) -> Iterator[dict[str, Any]]:
        if self.max_length is None:
            raise DataError("call pack_dataset() before reading an IterablePackingDataset.")
        position = 0
        while True:
            buffer: list[tuple[str, dict[str, Any]]] = []
            carry: list[dict[str, Any]] = []  # a group's rows seen so far: it may go on in the next buffer
            for item in super().rows(epoch, 0, shuffle_buffer, seed):
                buffer.append(item)
                if len(buffer) == self.packing_interval:
                    rows, carry = _hold_last_group(carry + self._encode(buffer, position))
                    yield from self._pack(rows, position)
                    position, buffer = position + len(buffer), []
            rows = carry + (self._encode(buffer, position) if buffer else [])
            if rows:
                yield from self._pack(rows, position)
            position += len(buffer)
            if not self.cyclic:
                return
            if position == 0:
                raise DataError("a cyclic IterablePackingDataset over an empty stream would never give a pack.")
            epoch += 1

    def _encode(self, buffer: list[tuple[str, dict[str, Any]]], position: int) -> list[dict[str, Any]]:
        return super().transform([r for _, r in buffer], [k for k, _ in buffer],
                                 list(range(position, position + len(buffer))))

    def _pack(self, rows: list[dict[str, Any]], position: int) -> Iterator[dict[str, Any]]:
        lengths = [len(r["input_ids"]) for r in rows]
        packs = pack_groups(lengths, row_groups(rows), self.max_length, position)
        self._report[0] += len(rows)
        self._report[1] += len(packs)
        self._report[2] += sum(lengths)
        for members in packs:
            yield pack_row([rows[i] for i in members])

    def rows(self, epoch: int = 0, start: int = 0, shuffle_buffer: int = 0, seed: int = 42
             ) -> Iterator[tuple[str | None, dict[str, Any]]]:
        """``(None, pack)`` from pack ``start`` of ``epoch`` (the packs before it are rebuilt and skipped)."""
        packs = self._packs(epoch, shuffle_buffer, seed)
        for _ in range(start):
            if next(packs, None) is None:
                return iter(())
        return ((None, pack) for pack in packs)

    def num_rows(self) -> int:
        """Packs in one pass (encodes and packs the whole stream)."""
        if self.cyclic:
            raise DataError("a cyclic IterablePackingDataset is endless; it has no number of packs.")
        return sum(1 for _ in self._packs(0, 0, 0))

    def transform(self, rows: list[dict[str, Any]], sources: Sequence[str | None], indices: list[int]
                  ) -> list[dict[str, Any]]:
        return rows  # packs are encoded already

    @property
    def keeps_every_row(self) -> bool:
        return True  # its rows are the packs, built (and rows dropped) before a DataLoader sees them

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (pack for _, pack in self.rows())


def _hold_last_group(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows to pack now, the trailing rows of the last row's group, which the next buffer may continue)."""
    if not rows or rows[-1].get(GROUP_COLUMN) is None:
        return rows, []
    group, start = rows[-1][GROUP_COLUMN], len(rows) - 1
    while start > 0 and rows[start - 1].get(GROUP_COLUMN) == group:
        start -= 1
    return rows[:start], rows[start:]
