"""Context parallelism: each CP rank gets its share of every sequence, split the way megatron-core splits it.

With causal attention a plain split in cp pieces would give the last rank most of the work, so
megatron cuts every row in ``2 * cp`` chunks and gives rank r chunks ``r`` and ``2*cp - 1 - r``
(``megatron.core.utils.get_batch_on_this_cp_rank``; its rotary embeddings are sliced the same way,
``get_pos_emb_on_this_cp_rank``). Every ``(batch, seq)`` tensor of the batch -- input ids, the
padding mask, ``position_ids`` and the already shifted next-token labels -- is split together, so
each rank sees its tokens at their original positions and every token is counted on exactly one
rank. Rows are first right-padded to a multiple of ``2 * cp`` (and of ``tp`` under sequence
parallelism): padded tokens are masked out and carry no label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.constants import IGNORE_INDEX


def _per_token(batch: Mapping[str, Any]) -> list[str]:
    """Keys holding one value per token: tensors shaped like ``input_ids``."""
    shape = tuple(batch["input_ids"].shape)
    return [k for k, v in batch.items() if isinstance(v, torch.Tensor) and tuple(v.shape[:2]) == shape]


def sequence_multiple(cp_size: int, tp_size: int, sequence_parallel: bool) -> int:
    """What megatron needs the sequence length to be divisible by."""
    return (2 * cp_size if cp_size > 1 else 1) * (tp_size if sequence_parallel else 1)


def pad_sequence(batch: Mapping[str, Any], multiple: int, pad_token_id: int) -> dict[str, Any]:
    """Right-pad every per-token tensor so the length divides by ``multiple`` (padding is masked, unlabelled)."""
    out = dict(batch)
    length = batch["input_ids"].shape[1]
    extra = -length % multiple
    if extra == 0:
        return out
    fill = {"input_ids": pad_token_id, "attention_mask": 0}
    for key in _per_token(batch):
        value = batch[key]
        if key == "position_ids":
            tail = value[:, -1:] + torch.arange(1, extra + 1, device=value.device, dtype=value.dtype)
        else:
            default = IGNORE_INDEX if "labels" in key else 0
            tail = value.new_full((value.shape[0], extra, *value.shape[2:]), fill.get(key, default))
        out[key] = torch.cat([value, tail], dim=1)
    if "attention_mask" not in out:  # padding must be distinguishable from tokens
        mask = torch.ones_like(batch["input_ids"])
        out["attention_mask"] = torch.cat([mask, mask.new_zeros(mask.shape[0], extra)], dim=1)
    return out


def chunk_indices(length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """The positions rank ``cp_rank`` holds: chunks ``cp_rank`` and ``2*cp_size - 1 - cp_rank`` of ``2*cp_size``."""
    if length % (2 * cp_size):
        raise ValueError(f"Sequence length {length} must be divisible by 2 * cp_size = {2 * cp_size}; pad first.")
    chunk = length // (2 * cp_size)
    first, second = cp_rank, 2 * cp_size - 1 - cp_rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk),
                      torch.arange(second * chunk, (second + 1) * chunk)])


def for_rank(batch: Mapping[str, Any], cp_size: int, cp_rank: int, tp_size: int, sequence_parallel: bool,
             pad_token_id: int) -> dict[str, Any]:
    """This rank's share of whole rows: padded to what megatron needs (:func:`sequence_multiple`), then split
    (:func:`split_for_rank`). Only needed with ``cp_size > 1`` or sequence parallelism over several TP ranks."""
    multiple = sequence_multiple(cp_size, tp_size, sequence_parallel)
    if multiple > 1:
        batch = pad_sequence(batch, multiple, pad_token_id)
    return split_for_rank(batch, cp_size, cp_rank)


def split_for_rank(batch: Mapping[str, Any], cp_size: int, cp_rank: int) -> dict[str, Any]:
    """This CP rank's share of every per-token tensor (other entries unchanged); ``position_ids`` made if absent."""
    if cp_size == 1:
        return dict(batch)
    ids = batch["input_ids"]
    index = chunk_indices(ids.shape[1], cp_size, cp_rank)
    out = dict(batch)
    if not isinstance(batch.get("position_ids"), torch.Tensor):
        out["position_ids"] = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    batch = dict(out)
    for key in _per_token(batch):
        out[key] = batch[key].index_select(1, index.to(batch[key].device))
    return out
