"""Bin-packing encoded rows into packs of at most ``max_length`` tokens, and building a pack row.

The packer is best-fit decreasing: rows longest first, each into the open pack with the least room
that still fits it (a new pack when none does). Best fit needs "the smallest remaining room >= L";
remaining rooms are integers <= max_length, so a sorted list of the distinct rooms (at most
max_length + 1 of them) plus a stack of packs per room answers it with one bisect. That keeps
packing O(n log max_length) at a million rows, where the ``binpacking`` package's constant-volume
packer scans every open bin for every item.

A pack row holds its rows' tokens end to end and ``position_ids`` that restart at 0 at each row:
:class:`~twinkle.processor.InputProcessor` (``padding_free=True``) reads the restarts as sequence
boundaries, masks the label at each start, and transformers attends within each sequence only.
Rows are never split, so an RL row or a preference answer stays whole in one pack. Rows that belong
together (a chosen/rejected pair from ``Template.encode_preference``, a group of completions of one
prompt) carry the same ``group_id`` in consecutive rows: :func:`pack_groups` packs such a run as one
item, so its rows land in one pack, next to each other and in their order (a preference loss reads
a pair as two consecutive sequences).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twinkle.dataset.errors import DataError

#: per-token columns concatenated into a pack (RL rows' fields too); anything else cannot be packed
PACKED_TOKEN_COLUMNS = ("input_ids", "labels", "target_tokens", "weights", "logprobs", "advantages", "ref_logprobs")
#: consecutive rows with the same value here are packed together, in order (a preference pair, an RL group)
GROUP_COLUMN = "group_id"
#: per-row columns a pack may drop: recomputed (length, position_ids), implied (attention_mask all ones) or
#: used up by packing (group_id: the group's rows are adjacent in the pack)
REBUILT_COLUMNS = ("length", "position_ids", "attention_mask", GROUP_COLUMN)


def pack_budget(template: Any, max_length: int | None, needs: str = "a template") -> int:
    """The tokens per pack: ``max_length`` or the template's, refused naming the fix when neither is set.

    Args:
        template: the dataset's template (None when ``set_template`` was not called).
        max_length: the budget ``pack_dataset`` was given, or None.
        needs: what ``pack_dataset`` needs besides, for the message.

    Returns:
        The budget in tokens.
    """
    if template is None:
        raise DataError(f"pack_dataset() needs {needs}: set_template(..., max_length=N) first.")
    max_length = max_length if max_length is not None else template.max_length
    if max_length is None:
        raise DataError("pack_dataset() needs a token budget: set_template(..., max_length=N) or "
                        "pack_dataset(max_length=N).")
    return max_length


def pack_lengths(lengths: Sequence[int], max_length: int, first_index: int = 0) -> list[list[int]]:
    """Best-fit-decreasing packs of ``lengths`` (each a list of positions into ``lengths``).

    Ties keep the input order (a stable sort), so the result is a pure function of the lengths.
    ``first_index`` only shifts the row numbers in the error for a row longer than ``max_length``.
    """
    _check_budget(max_length)
    order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    packs: list[list[int]] = []
    rooms: list[int] = []  # sorted distinct remaining rooms of the open packs
    by_room: dict[int, list[int]] = {}  # room -> open packs with that room (a stack: the newest first)
    for i in order:
        n = int(lengths[i])
        _check_row(n, max_length, first_index + i)
        at = bisect.bisect_left(rooms, n)
        if at == len(rooms):
            pack, room = len(packs), max_length - n
            packs.append([i])
        else:
            room = rooms[at]
            stack = by_room[room]
            pack = stack.pop()
            if not stack:
                del by_room[room]
                del rooms[at]
            packs[pack].append(i)
            room -= n
        if room:
            if room not in by_room:
                bisect.insort(rooms, room)
                by_room[room] = []
            by_room[room].append(pack)
    return packs


def pack_groups(lengths: Sequence[int], groups: Sequence[Any] | None, max_length: int, first_index: int = 0
                ) -> list[list[int]]:
    """Best-fit-decreasing packs of rows where each run of consecutive rows sharing a group id is one item.

    Args:
        lengths: tokens per row.
        groups: each row's ``group_id`` (None: a row of its own), or None when no row has one.
        max_length: tokens per pack.
        first_index: shifts the row numbers in error messages.

    Returns:
        Packs as lists of row positions; a group's rows are consecutive in its pack, in their order.
    """
    if groups is None:
        return pack_lengths(lengths, max_length, first_index)
    units: list[list[int]] = []
    for i, group in enumerate(groups):
        if group is not None and units and groups[units[-1][0]] == group:
            units[-1].append(i)
        else:
            units.append([i])
    sizes = [sum(int(lengths[i]) for i in unit) for unit in units]
    _check_budget(max_length)
    for unit, size in zip(units, sizes):
        for i in unit:
            _check_row(int(lengths[i]), max_length, first_index + i)
        if size > max_length:
            raise DataError(f"rows {first_index + unit[0]}..{first_index + unit[-1]} share {GROUP_COLUMN} "
                            f"{groups[unit[0]]!r} and have {size} tokens together; a group packs whole, so it needs "
                            f"at most max_length={max_length}. Raise the pack budget, or encode with a smaller "
                            "max_length.")
    packs = pack_lengths(sizes, max_length, first_index)
    return [[i for u in pack for i in units[u]] for pack in packs]


def row_groups(rows: Sequence[Mapping[str, Any]]) -> list[Any] | None:
    """The rows' ``group_id`` values (None where a row has none), or None when no row has one."""
    groups = [row.get(GROUP_COLUMN) for row in rows]
    return groups if any(g is not None for g in groups) else None


def _check_budget(max_length: Any) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise DataError(f"max_length for packing must be a positive integer, got {max_length!r}.")


def _check_row(n: int, max_length: int, row: int) -> None:
    if n > max_length or n < 1:
        raise DataError(f"row {row} has {n} tokens; packing needs 1..max_length={max_length}. "
                        "Encode with the same max_length and a truncation_strategy ('delete', 'right', 'left').")


@dataclass(frozen=True)
class PackReport:
    """How full the packs are: ``fill_ratio`` = tokens / (packs x max_length)."""

    rows: int
    packs: int
    tokens: int
    max_length: int

    @property
    def fill_ratio(self) -> float:
        return self.tokens / (self.packs * self.max_length) if self.packs else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {"rows": self.rows, "packs": self.packs, "tokens": self.tokens, "max_length": self.max_length,
                "fill_ratio": self.fill_ratio}


def pack_row(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One pack row from encoded rows: per-token columns end to end, ``position_ids`` restarting per row."""
    if not rows:
        raise DataError("a pack needs at least one row.")
    columns = [c for c in PACKED_TOKEN_COLUMNS if c in rows[0]]
    for k, row in enumerate(rows):
        other = [c for c in row if c not in PACKED_TOKEN_COLUMNS and c not in REBUILT_COLUMNS]
        if other:
            raise DataError(f"cannot pack a row with columns {other} (pack row {k}): only token rows (input_ids, "
                            "labels and per-token RL fields) pack; images/videos and pair columns need padded batches.")
        if [c for c in PACKED_TOKEN_COLUMNS if c in row] != columns:
            raise DataError(f"rows of one pack carry different token columns ({columns} and "
                            f"{[c for c in PACKED_TOKEN_COLUMNS if c in row]}); encode them the same way.")
    out: dict[str, Any] = {c: [v for row in rows for v in row[c]] for c in columns}
    out["position_ids"] = [p for row in rows for p in range(len(row["input_ids"]))]
    out["length"] = len(out["input_ids"])
    return out
