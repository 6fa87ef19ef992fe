"""From what the DataLoader yields to the tensors GPTModel.forward takes.

A batch is a dict of tensors or a list of encoded rows, collated by core
(``twinkle.model.inputs``). megatron-core applies rotary embeddings by position
in the row, so padding and packing are expressed in the attention mask instead: a ``[b, 1, s, s]``
boolean mask (True = masked) combining causality, the padding of ``attention_mask``, packed
sequence boundaries (``position_ids`` restarting at 0) and a sliding window. Rotary embeddings only
depend on distances, so within a row that is exact. The Transformer Engine attention ignores
explicit masks (it is causal by construction): there, batches must be right-padded and unpacked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.model import inputs as core_inputs
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.errors import MegatronConfigError


def collate(inputs: Any, group: OptimizerGroup, pad_token_id: int, vocab_size: int | None = None) -> dict[str, Any]:
    """Core's checked collation (dict batch, encoded or raw rows), then GPTModel's need: a 2-D ``input_ids``."""
    batch = core_inputs.collate(inputs, group, pad_token_id, vocab_size)
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("MegatronModel needs 'input_ids' as a (batch, sequence) tensor.")
    return batch


def _segments(position_ids: torch.Tensor) -> torch.Tensor:
    """Sequence index of each token: a new sequence starts wherever position_ids is 0."""
    return torch.cumsum((position_ids == 0).long(), dim=1)


def attention_mask(batch: Mapping[str, Any], sliding_window: int | None) -> torch.Tensor:
    """``[b, 1, s, s]`` bool, True where a query must not see a key (see module docstring)."""
    ids = batch["input_ids"]
    rows, length = ids.shape
    pos = torch.arange(length, device=ids.device)
    allowed = pos[None, :] <= pos[:, None]
    if sliding_window:
        allowed = allowed & ((pos[:, None] - pos[None, :]) < sliding_window)
    allowed = allowed.unsqueeze(0).expand(rows, length, length)
    position_ids = batch.get("position_ids")
    if isinstance(position_ids, torch.Tensor) and position_ids.shape == ids.shape:
        seg = _segments(position_ids.to(ids.device))
        allowed = allowed & (seg[:, :, None] == seg[:, None, :])
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        allowed = allowed & mask.to(ids.device).bool()[:, None, :]
    # every query may at least see itself, so fully padded rows give finite (ignored) outputs
    allowed = allowed | torch.eye(length, dtype=torch.bool, device=ids.device)
    return ~allowed.unsqueeze(1)


def check_plain_causal(batch: Mapping[str, Any]) -> None:
    """Transformer Engine attention is causal only: refuse left padding and packed rows there."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] > 1:
        m = mask.bool()
        if bool((~m[:, :-1] & m[:, 1:]).any()):
            raise MegatronConfigError("Left-padded rows reach Transformer Engine attention, which ignores padding "
                                      "masks; pad on the right (InputProcessor(padding_side='right')).")
    position_ids = batch.get("position_ids")
    if isinstance(position_ids, torch.Tensor) and position_ids.dim() == 2 and mask is None \
            and bool((position_ids[:, 1:] == 0).any()):
        raise MegatronConfigError("Packed rows (padding_free) need per-sequence attention, which this Transformer "
                                  "Engine path does not set up; use padded batches.")
