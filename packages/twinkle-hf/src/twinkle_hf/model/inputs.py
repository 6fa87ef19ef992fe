"""From whatever the DataLoader yields to the tensors a transformers forward takes.

A batch is either a dict of tensors (already collated) or a list of encoded rows, which the
group's processor (default: ``twinkle.processor.InputProcessor``) pads or packs. Keys the model's
``forward`` does not take (``labels``, ``length``...) stay in the batch for the loss and metrics
but are not passed to the model: twinkle computes the loss itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch

from twinkle.model.optimizer_group import OptimizerGroup

#: Keys never passed to the model: the loss and the bookkeeping read them.
NOT_MODEL_INPUTS = frozenset({"labels", "length", "group_size"})


def default_processor(pad_token_id: int, template: Any = None) -> Any:
    """The processor used when a group has none: right padding with ``pad_token_id``; a VL template's
    media collator too (images/videos -> vision inputs)."""
    from twinkle.processor import InputProcessor

    if callable(getattr(template, "media_collator", None)):
        return InputProcessor.for_template(template)
    return InputProcessor(pad_token_id=pad_token_id)


def collate(inputs: Any, group: OptimizerGroup, pad_token_id: int) -> dict[str, Any]:
    """A dict of tensors from a dict batch or from a list of encoded rows."""
    if isinstance(inputs, Mapping):
        return {k: _as_tensor(v) for k, v in inputs.items()}
    if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)) and inputs \
            and all(isinstance(row, Mapping) for row in inputs):
        rows = _encoded_rows(list(inputs), group)
        processor = group.processor if group.processor is not None else default_processor(pad_token_id,
                                                                                            group.template)
        batch = processor(rows)
        if not isinstance(batch, Mapping):
            raise TypeError(f"The processor {type(processor).__name__} returned {type(batch).__name__}, "
                            "expected a dict of tensors.")
        return {k: _as_tensor(v) for k, v in batch.items()}
    raise TypeError(f"inputs must be a dict of tensors or a non-empty list of encoded rows (dicts), got "
                    f"{type(inputs).__name__}.")


def _encoded_rows(rows: list[Mapping[str, Any]], group: OptimizerGroup) -> list[Mapping[str, Any]]:
    """Rows with ``input_ids``; raw conversation rows are encoded with the group's template."""
    raw = [i for i, row in enumerate(rows) if "input_ids" not in row]
    if not raw:
        return rows
    if group.template is None:
        raise ValueError(
            f"Rows {raw[:5]} of the batch have no 'input_ids' and group {group.name!r} has no template: encode the "
            "dataset first (dataset.set_template(...); dataset.encode()) or call model.set_template(...)."
        )
    results = group.template.batch_encode([rows[i] for i in raw])
    out = list(rows)
    for i, (encoded, why) in zip(raw, results):
        if encoded is None:
            raise ValueError(f"Row {i} of the batch could not be encoded: {why}.")
        out[i] = encoded
    return out


def _as_tensor(value: Any) -> Any:
    """Python lists of numbers become tensors (a single row gains a batch dimension)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        return torch.tensor([value])
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        return torch.tensor(value)
    return value


def to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@lru_cache(maxsize=64)
def _forward_params(forward: Any) -> frozenset[str] | None:
    params = inspect.signature(forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        named = frozenset(n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD)
        return named | {"input_ids", "attention_mask", "position_ids", "token_type_ids"}
    return frozenset(params)


def model_kwargs(batch: Mapping[str, Any], module: torch.nn.Module) -> dict[str, Any]:
    """The entries of ``batch`` that ``module.forward`` accepts, minus labels and bookkeeping."""
    accepted = _forward_params(type(module).forward)
    return {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS and (accepted is None or k in accepted)}


def accepts(module: torch.nn.Module, name: str) -> bool:
    """Whether ``module.forward`` takes the keyword ``name``."""
    accepted = _forward_params(type(module).forward)
    return accepted is None or name in accepted


def count_tokens(batch: Mapping[str, Any]) -> Any:
    """Real (non-padding) tokens of a batch, as a device tensor (no host sync)."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return mask.sum()
    ids = batch.get("input_ids")
    return ids.numel() if isinstance(ids, torch.Tensor) else 0
