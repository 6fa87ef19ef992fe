"""PackingDataset: an encoded Dataset whose items are packs of rows up to ``max_length`` tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.dataset.dataset import Dataset
from twinkle.dataset.errors import DataError
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packing import GROUP_COLUMN, PackReport, pack_budget, pack_groups, pack_row
from twinkle.log import get_logger


class PackingDataset(Dataset):
    """A :class:`Dataset` that, after ``encode()``, is packed by :meth:`pack_dataset`.

    Each item is then a pack row (see :mod:`twinkle.dataset.packing`); ``len()`` counts packs. Feed
    the packs to a model through ``InputProcessor(padding_free=True)``: the loss over a batch of packs
    is the loss over the same rows unpacked, per token. ``packing_num_proc`` is accepted for upstream
    compatibility; packing is one pass over the ``length`` column and needs no processes. Consecutive
    rows sharing a ``group_id`` (preference pairs, see ``encode``) are packed together, in order.
    """

    def __init__(self, dataset_meta: DatasetMeta | str | None = None, packing_num_proc: int = 1,
                 **load_kwargs: Any) -> None:
        super().__init__(dataset_meta, **load_kwargs)
        self.packing_num_proc = packing_num_proc
        self._packs: list[list[int]] | None = None
        self.pack_report: PackReport | None = None

    def pack_dataset(self, max_length: int | None = None) -> PackReport:
        """Pack the encoded rows (best-fit decreasing) into packs of at most ``max_length`` tokens.

        Args:
            max_length: the pack budget; defaults to the template's ``max_length``.

        Returns:
            The :class:`~twinkle.dataset.packing.PackReport` (also kept as ``pack_report`` and logged).
        """
        max_length = pack_budget(self.template, max_length, needs="a template and encoded rows (encode() too)")
        self._packs = None  # the encoded rows themselves, not packs of them
        table = self.hf_dataset
        if "length" not in table.column_names:
            raise DataError(f"pack_dataset() needs encoded rows (a 'length' column); the dataset has columns "
                            f"{table.column_names}. Call encode() first.")
        lengths = table.data.column("length").to_numpy()
        groups = table.data.column(GROUP_COLUMN).to_pylist() if GROUP_COLUMN in table.column_names else None
        packs = pack_groups(lengths.tolist(), groups, max_length)
        self._packs = packs
        self.pack_report = PackReport(rows=len(lengths), packs=len(packs), tokens=int(lengths.sum()),
                                      max_length=max_length)
        get_logger("twinkle.dataset").info("packed %d rows into %d packs of <= %d tokens (fill ratio %.3f)",
                                           len(lengths), len(packs), max_length, self.pack_report.fill_ratio)
        return self.pack_report

    def _replace(self, updated: dict[str, Any]) -> None:
        super()._replace(updated)
        self._packs, self.pack_report = None, None  # rows changed: packs must be rebuilt

    def __len__(self) -> int:
        return len(self._packs) if self._packs is not None else super().__len__()

    def __getitem__(self, index: Any) -> Any:
        if self._packs is None:
            return super().__getitem__(index)
        if isinstance(index, slice):
            return self.get_rows(range(*index.indices(len(self))))
        if isinstance(index, Sequence) and not isinstance(index, str):
            return self.get_rows(index)
        return self.get_rows([int(index)])[0]

    def get_rows(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Packs at ``indices`` (rows before :meth:`pack_dataset`)."""
        if self._packs is None:
            return super().get_rows(indices)
        indices = list(indices)
        for i in indices:
            if not -len(self._packs) <= i < len(self._packs):
                raise IndexError(f"pack {i} of {len(self._packs)}")
        members = [self._packs[i] for i in indices]
        rows = super().get_rows([r for m in members for r in m])
        out, at = [], 0
        for m in members:
            out.append(pack_row(rows[at:at + len(m)]))
            at += len(m)
        return out

    def __iter__(self) -> Any:
        if self._packs is None:
            return super().__iter__()
        return (self.get_rows([i])[0] for i in range(len(self)))
