"""The last check on a collated batch before any forward: shapes that agree, token ids the model has.

A mask or labels of another shape than ``input_ids`` trains silently on misaligned tokens, and an id
outside the vocabulary raises ``IndexError`` deep inside an embedding (or a device-side assert on
GPU). Core's collation (``twinkle.model.inputs.collate``, used by every backend) ends with
:func:`check_batch`, so the error names the field,
the shapes or the offending id, and nothing has run yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.constants import IGNORE_INDEX


def check_batch(batch: Mapping[str, Any], vocab_size: int | None = None, loss: Any = None) -> Mapping[str, Any]:
    """Return ``batch`` unchanged, or raise ValueError naming what is wrong and how to fix it.

    ``vocab_size``: the model's input vocabulary (token ids and labels must lie in ``[0, vocab)``,
    labels may also be the loss's ``ignore_index``, -100 by default). ``None`` skips the range check.
    """
    import torch

    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not isinstance(ids, torch.Tensor):
        if isinstance(batch, Mapping) and "inputs_embeds" in batch:
            return batch
        keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(f"The batch has no 'input_ids' tensor (it holds {keys}); pass a dict with input_ids of shape "
                         "(batch, sequence), or a non-empty list of encoded rows.")
    if ids.dim() != 2 or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"input_ids must be an integer tensor of shape (batch, sequence), got {ids.dtype} of shape "
                         f"{tuple(ids.shape)}; add a batch dimension (ids.unsqueeze(0)) or cast with .long().")
    if ids.numel() == 0:
        raise ValueError(f"The batch is empty: input_ids has shape {tuple(ids.shape)}. Give at least one row with at "
                         "least one token (an empty list or a filtered-out batch cannot be trained on).")
    rows, length = ids.shape
    _check_shape(batch, "attention_mask", ids, lambda s: s == (rows, length) or (
        len(s) == 4 and s[0] == rows and s[-1] == length))
    _check_shape(batch, "position_ids", ids, lambda s: len(s) >= 2 and s[-1] == length and s[-2] in (rows, 1))
    labels = batch.get("labels")
    per_token = isinstance(labels, torch.Tensor) and labels.dim() == 2
    _check_shape(batch, "labels", ids, lambda s: s == (rows, length) or s == (rows,))
    if vocab_size is not None:
        ignore = getattr(loss, "ignore_index", IGNORE_INDEX)
        _check_range(ids, labels if per_token else None, int(vocab_size), ignore)
    loss_check = getattr(loss, "check_batch", None)
    if callable(loss_check):  # what a loss needs of the batch's structure, checked here on the host
        loss_check(batch)
    return batch


def _check_shape(batch: Mapping[str, Any], name: str, ids: Any, fits: Any) -> None:
    import torch

    value = batch.get(name)
    if isinstance(value, torch.Tensor) and not fits(tuple(value.shape)):
        raise ValueError(f"{name} has shape {tuple(value.shape)} but input_ids has {tuple(ids.shape)}; they must "
                         f"match (one {name} entry per token). Collate the rows together (e.g. with "
                         "twinkle.processor.InputProcessor) so padding is applied to every field.")


def _check_range(ids: Any, labels: Any, vocab: int, ignore: int) -> None:
    """The min and max of the ids and of the trained labels, read in one go where ``ids`` live.

    No boolean indexing (its size depends on the data: a host sync of its own on a device): ignored
    labels are replaced by 0, which is inside every vocabulary. A batch on the host stays there; a
    batch on an accelerator costs one sync (the ``tolist``).
    """
    import torch

    values = list(torch.aminmax(ids))
    if labels is not None:
        values += list(torch.aminmax(labels.masked_fill(labels == ignore, 0)))
    found = torch.stack([v.to(ids.device, torch.int64) for v in values]).tolist()
    low, high = found[0], found[1]
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids holds token id {bad}, outside this model's vocabulary [0, {vocab}). Encode the "
                         "data with this model's tokenizer (a template with the same model_id), or resize the "
                         "embeddings if you added tokens.")
    if len(found) == 4 and (found[2] < 0 or found[3] >= vocab):
        bad = found[2] if found[2] < 0 else found[3]
        raise ValueError(f"labels holds {bad}, outside this model's vocabulary [0, {vocab}) and not the ignore "
                         f"index {ignore}; mark untrained tokens with {ignore} and encode with this model's tokenizer.")
