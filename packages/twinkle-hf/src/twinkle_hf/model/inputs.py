"""Which entries of a collated batch a transformers ``forward`` takes.

Collation itself (dict batches, encoded or raw rows, the default processor) is core's
(``twinkle.model.inputs``). Keys the model's ``forward`` does not take (``labels``, ``length``...)
stay in the batch for the loss and metrics but are not passed to the model: twinkle computes the
loss itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

#: Keys never passed to the model: the loss and the bookkeeping read them.
NOT_MODEL_INPUTS = frozenset({"labels", "length", "group_size"})


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
