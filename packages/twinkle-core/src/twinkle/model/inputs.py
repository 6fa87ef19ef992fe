"""From whatever the DataLoader yields to a dict of tensors, for every backend.

A batch is either a dict (tensors, or lists of numbers) or a list of rows: encoded rows (with
``input_ids``) or raw conversations, which the group's template encodes. Rows are collated by the
group's processor (default: ``twinkle.processor.InputProcessor`` padding with the backend's pad
id; a VL template's media collator too). Collation ends with ``twinkle.model.batch_check``, so a
malformed batch is refused before any forward. What a backend's forward then takes from the dict
is the backend's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from twinkle.model.batch_check import check_batch
from twinkle.model.optimizer_group import OptimizerGroup


def default_processor(pad_token_id: int, template: Any = None) -> Any:
    """The processor used when a group has none: right padding with ``pad_token_id``; with a VL
    template, its media collator too (images/videos -> vision inputs)."""
    from twinkle.processor import InputProcessor

    if callable(getattr(template, "media_collator", None)):
        return InputProcessor.for_template(template)
    return InputProcessor(pad_token_id=pad_token_id)


def collate(inputs: Any, group: OptimizerGroup, pad_token_id: int, vocab_size: int | None = None,
            max_length: int | None = None) -> dict[str, Any]:
    """A checked dict of tensors from a dict batch or from a list of encoded (or raw, with a template) rows.

    The result passed :func:`~twinkle.model.batch_check.check_batch` (shapes agree, not empty, and
    with ``vocab_size`` every token id and trained label inside the vocabulary) and, with
    ``max_length`` (a multi-LoRA model's bound), has no longer rows.
    """
    if isinstance(inputs, Mapping):
        batch = inputs
    elif isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)) and inputs \
            and all(isinstance(row, Mapping) for row in inputs):
        processor = group.processor if group.processor is not None else default_processor(pad_token_id,
                                                                                            group.template)
        batch = processor(encoded_rows(list(inputs), group))
        if not isinstance(batch, Mapping):
            raise TypeError(f"The processor {type(processor).__name__} returned {type(batch).__name__}, "
                            "expected a dict of tensors.")
    else:
        raise TypeError(f"inputs must be a dict of tensors or a non-empty list of encoded rows (dicts), got "
                        f"{type(inputs).__name__}.")
    batch = {k: as_tensor(v) for k, v in batch.items()}
    check_batch(batch, vocab_size, group.loss)
    if max_length is not None:
        check_row_length(batch, max_length)
    return batch


def encoded_rows(rows: list[Mapping[str, Any]], group: OptimizerGroup) -> list[Mapping[str, Any]]:
    """Rows with ``input_ids``; raw conversation rows are encoded with the group's template."""
    raw = [i for i, row in enumerate(rows) if "input_ids" not in row]
    if not raw:
        return rows
    if group.template is None:
        raise ValueError(
            f"Rows {raw[:5]} of the batch have no 'input_ids' and group {group.name!r} has no template: encode the "
            "dataset first (dataset.set_template(...); dataset.encode()) or call model.set_template(...)."
        )
    out = list(rows)
    for i, (encoded, why) in zip(raw, group.template.batch_encode([rows[i] for i in raw])):
        if encoded is None:
            raise ValueError(f"Row {i} of the batch could not be encoded: {why}.")
        out[i] = encoded
    return out


def as_tensor(value: Any) -> Any:
    """Python lists of numbers become tensors (a single row gains a batch dimension)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        return torch.tensor([value])
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        return torch.tensor(value)
    return value


def to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor of ``batch`` on ``device`` (asynchronous copies where the device allows)."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def count_tokens(batch: Mapping[str, Any]) -> Any:
    """Real (non-padding) tokens of a batch, as a device tensor when there is a mask (no host sync)."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return mask.sum()
    ids = batch.get("input_ids")
    return ids.numel() if isinstance(ids, torch.Tensor) else 0


def check_row_length(batch: Mapping[str, Any], max_length: int) -> None:
    """Refuse rows longer than a multi-LoRA model's ``max_length``, naming both numbers."""
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.shape[-1] > max_length:
        raise ValueError(f"The batch has {ids.shape[-1]} tokens per row but this model was built with "
                         f"max_length={max_length}; truncate the rows or build it with a larger max_length.")
