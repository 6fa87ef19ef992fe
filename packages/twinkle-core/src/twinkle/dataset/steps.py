"""Recorded transforms (map / filter / encode) applied to a handful of rows at a time.

:class:`~twinkle.dataset.Dataset` hands its transforms to ``datasets.map`` over the whole table;
the lazy and streaming datasets record them as :class:`Step` s instead and apply them to the
rows they are about to hand out, through the same batched callables (``transforms``), so a row
comes out the same whichever dataset class read it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from twinkle.dataset import transforms
from twinkle.dataset.batched import BatchCall, function_name, looks_batched, to_columns
from twinkle.dataset.errors import DataError
from twinkle.dataset.packing import GROUP_COLUMN
from twinkle.log import get_logger

StepKind = Literal["preprocess", "row", "batched", "filter", "encode"]


@dataclass
class Step:
    """One transform; ``source`` (a DatasetMeta id) limits it to that source's rows, None means all."""

    kind: StepKind
    fn: Any
    source: str | None = None
    strict: bool = True
    remove_columns: tuple[str, ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or (type(self.fn).__name__ if self.kind in ("preprocess", "encode")
                                  else function_name(self.fn))


def map_step(proc: Any, batched: bool | None, probe_rows: Sequence[Mapping[str, Any]], *, source: str | None,
             strict: bool, remove_columns: Sequence[str] = ()) -> Step:
    """The step for ``map(proc)``: a Preprocessor, a batched function or a per-row one (probed when
    ``batched`` is None, see :func:`~twinkle.dataset.batched.looks_batched`)."""
    if hasattr(proc, "output_features"):
        return Step("preprocess", proc, source, strict)
    if batched is None:
        batched = looks_batched(proc, probe_rows)
    if remove_columns and not batched:
        raise DataError("remove_columns only applies to a batched function (batched=True).")
    return Step("batched" if batched else "row", proc, source, strict, tuple(remove_columns))


@dataclass
class DropLog:
    """Counts the rows steps dropped; warns once per reason (a stream would otherwise warn per batch)."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, what: str, reasons: Sequence[str]) -> None:
        for reason in reasons:
            category, _, example = reason.partition(transforms.REASON_SEP)
            key = f"{what}: {category}"
            if key not in self.counts:
                get_logger("twinkle.dataset").warning("%s drops rows (%s%s); later drops are counted in "
                                                      "dataset.drop_counts.", what, category,
                                                      f", first: {example}" if example else "")
            self.counts[key] += 1


def apply_steps(steps: Sequence[Step], rows: list[dict[str, Any]], indices: list[int],
                sources: Sequence[str | None] | None = None, drops: DropLog | None = None,
                one_to_one: str | None = None) -> list[dict[str, Any]]:
    """Run ``steps`` over ``rows`` (stream/table positions ``indices``, source keys ``sources``).

    Consecutive rows of one source go through together; a step bound to another source passes
    them unchanged. Returns the surviving rows in order (a batched step may also split rows).
    ``one_to_one`` (the caller's name) makes a step that drops or splits a row an error naming it.
    """
    if not steps or not rows:
        return rows
    sources = list(sources) if sources is not None else [None] * len(rows)
    out: list[dict[str, Any]] = []
    start = 0
    while start < len(rows):
        end = start + 1
        while end < len(rows) and sources[end] == sources[start]:
            end += 1
        run, run_idx = rows[start:end], indices[start:end]
        for step in steps:
            if step.source is not None and step.source != sources[start]:
                continue
            before = run_idx
            run, run_idx = _apply(step, run, run_idx, drops)
            if one_to_one and len(run) != len(before):
                lost = sorted(set(before) - set(run_idx)) or before[:1]
                raise DataError(f"{step.kind}({step.name}) turned rows {before[0]}..{before[-1]} into {len(run)} rows "
                                f"(row {lost[0]} first); {one_to_one} needs one row per row. Filter such rows first "
                                "(dataset.filter), or use Dataset, which can drop and split rows.")
            if not run:
                break
        out += run
        start = end
    return out


def _apply(step: Step, rows: list[dict[str, Any]], indices: list[int],
           drops: DropLog | None) -> tuple[list[dict[str, Any]], list[int]]:
    if step.kind == "row":
        call = transforms.RowCall(step.fn, "map")
        return [{**row, **call(row, i)} for row, i in zip(rows, indices)], indices
    if step.kind == "filter":
        call = transforms.RowCall(step.fn, "filter")
        kept = [(row, i) for row, i in zip(rows, indices) if call(row, i)]
        return [r for r, _ in kept], [i for _, i in kept]
    if step.kind == "batched":
        cols = BatchCall(step.fn, step.remove_columns)(to_columns(rows), indices)
        out = transforms.to_rows(cols)
        # split rows keep the position of the batch's first row in error messages
        return out, indices if len(out) == len(rows) else [indices[0]] * len(out)
    if step.kind == "preprocess":
        columns = list(transforms.preprocess_features(step.fn, None))
        cols = transforms.PreprocessBatch(step.fn, columns, step.strict)(to_columns(rows), indices)
    elif step.kind == "encode":
        cols = transforms.EncodeBatch(step.fn)(to_columns(rows), indices)
    else:  # pragma: no cover - Step.kind is a Literal
        raise DataError(f"unknown step kind {step.kind!r}")
    marks = cols.pop(transforms.DROP_COLUMN)
    if drops is not None:
        drops.add(f"{step.kind}({step.name})", [m for m in marks if m is not None])
    kept = [k for k, m in enumerate(marks) if m is None]
    out = transforms.to_rows(cols)
    # a preference pair is two rows out of one: each names its source row in its group id
    positions = indices if len(marks) == len(rows) else cols[GROUP_COLUMN]
    return [out[k] for k in kept], [positions[k] for k in kept]
