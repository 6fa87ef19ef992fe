"""From whatever the DataLoader yields to a dict of tensors, for every backend.

A batch is either a dict (tensors, or lists of numbers) or a list of rows: encoded rows (with
``input_ids``) or raw conversations, which the group's template encodes. Rows are collated by the
group's processor (default: ``twinkle.processor.InputProcessor`` padding with the backend's pad
id; a VL template's media collator too). Collation ends with :func:`check_batch`, so a malformed batch
is refused before any forward. What a backend's forward then takes from the dict
is the backend's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from twinkle.constants import IGNORE_INDEX
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

    The result passed :func:`check_batch` (shapes agree, not empty, and
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


# ------------------------------------------------------------------ the batch check
# The last check on a collated batch before any forward: shapes that agree, token ids the model has. A
# mask or labels of another shape than ``input_ids`` trains silently on misaligned tokens, and an id
# outside the vocabulary raises ``IndexError`` deep inside an embedding (or a device-side assert on GPU);
# here the error names the field, the shapes or the offending id, and nothing has run yet.


def check_batch(batch: Mapping[str, Any], vocab_size: int | None = None, loss: Any = None) -> Mapping[str, Any]:
    """Return ``batch`` unchanged, or raise ValueError naming what is wrong and how to fix it.

    ``vocab_size``: the model's input vocabulary (token ids and labels must lie in ``[0, vocab)``,
    labels may also be the loss's ``ignore_index``, -100 by default). ``None`` skips the range check.
    """
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


#: Device tensors known (from their host copies) to say only what the model assumes without them: an
#: ``attention_mask`` of ones and ``position_ids`` counting 0, 1, ... in every row. transformers' mask
#: builders read such inputs back to decide that (``attention_mask.all()`` in the sdpa mask, the packed-
#: sequence check of ``position_ids`` when there is no mask): a host sync per forward on an accelerator.
#: Without them it takes the same causal path on the same positions without asking, so they are not passed
#: to the model; the losses still read the mask from the batch.
_DEFAULT_INPUTS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def is_default_input(value: Any) -> bool:
    """Whether ``value`` is a device mask or positions tensor noted by ``note_default_inputs``."""
    return isinstance(value, torch.Tensor) and value in _DEFAULT_INPUTS


def note_default_inputs(host: Mapping[str, Any], moved: Mapping[str, Any]) -> None:
    """Remember ``moved``'s mask and positions as defaults when their host copies in ``host`` are (host reads)."""
    mask, positions = host.get("attention_mask"), host.get("position_ids")
    if not (isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and mask.dim() == 2 and bool(mask.all())):
        return
    if positions is not None:
        if not (isinstance(positions, torch.Tensor) and positions.device.type == "cpu"
                and positions.shape == mask.shape
                and torch.equal(positions, torch.arange(mask.shape[1]).expand_as(positions))):
            return
        _DEFAULT_INPUTS[moved["position_ids"]] = True
    _DEFAULT_INPUTS[moved["attention_mask"]] = True
