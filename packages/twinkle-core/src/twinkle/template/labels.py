"""Token labels from character spans, and max_length truncation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.constants import IGNORE_INDEX
from twinkle.dataset.errors import DataError


def labels_from_encoding(encoding: Any, spans: Sequence[tuple[int, int]]) -> list[int]:
    """Like :func:`labels_from_spans` for a ``tokenizers.Encoding``: O(spans) via ``char_to_token``."""
    ids = encoding.ids
    labels = [IGNORE_INDEX] * len(ids)
    for start, end in spans:
        if end <= start:
            continue
        first, last = encoding.char_to_token(start), encoding.char_to_token(end - 1)
        if first is None or last is None:  # a span edge on a character no token covers: walk the offsets
            return labels_from_spans(ids, encoding.offsets, spans)
        labels[first:last + 1] = ids[first:last + 1]
    return labels


def labels_from_spans(
    ids: Sequence[int], offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
) -> list[int]:
    """``ids[t]`` where token t overlaps a trained span, else -100 (spans sorted, disjoint)."""
    labels = [IGNORE_INDEX] * len(ids)
    j = 0
    for t, (start, end) in enumerate(offsets):
        while j < len(spans) and start >= spans[j][1]:
            j += 1
        if j == len(spans):
            break
        if end > spans[j][0] and end > start:
            labels[t] = ids[t]
    return labels


def truncate(
    ids: list[int], labels: list[int], max_length: int | None, strategy: str, where: str
) -> tuple[list[int], list[int]] | None:
    """Apply ``strategy`` to a row longer than ``max_length``; None means 'drop the row' (strategy 'delete')."""
    if max_length is None or len(ids) <= max_length:
        return ids, labels
    if strategy == "raise":
        raise DataError(
            f"{where} encodes to {len(ids)} tokens, more than max_length={max_length}. Raise max_length, or set "
            "truncation_strategy='left' (keep the end), 'right' (keep the start) or 'delete' (drop such rows)."
        )
    if strategy == "delete":
        return None
    if strategy == "left":
        return ids[-max_length:], labels[-max_length:]
    return ids[:max_length], labels[:max_length]
