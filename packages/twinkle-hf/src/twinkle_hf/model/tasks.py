"""Forward flavours selected by ``task=``: next-token logits, or pooled sentence embeddings.

``causal_lm`` runs the model (with its head) and returns its output (``logits``...).
``fused_lm_ce`` runs the backbone and hands the hidden states and the lm_head weight to
``LigerFusedLinearCrossEntropyLoss``, so the (batch, seq, vocab) logits never exist.
``embedding`` runs the backbone without the LM head and pools the last hidden states into one
vector per row: ``mean`` over real tokens (BERT-style encoders such as MiniLM/GTE), ``last`` real
token (decoder embedders such as Qwen3-Embedding) or ``cls``. By default decoders pool ``last`` and
encoders ``mean``. The result is ``{'embeddings': (rows, hidden), 'last_hidden_state': ...}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle_hf.model.inputs import accepts, model_kwargs

TASKS = ("causal_lm", "embedding", "fused_lm_ce")
POOLINGS = ("mean", "last", "cls")


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not one of {', '.join(TASKS)}.")
    return task


def is_causal_model(module: torch.nn.Module) -> bool:
    """Whether the attention is causal (decoder): any submodule says ``is_causal = True``."""
    return any(getattr(m, "is_causal", False) is True for m in module.modules())


def run_task(model: torch.nn.Module, hf_model: torch.nn.Module, task: str, batch: Mapping[str, Any],
             pooling: str | None = None) -> Any:
    """The forward of ``task``; ``model`` may be the peft wrapper of ``hf_model``."""
    if task == "causal_lm":
        kwargs = model_kwargs(batch, hf_model)
        if accepts(hf_model, "use_cache"):
            kwargs["use_cache"] = False  # no KV cache while training
        return model(**kwargs)
    backbone = getattr(hf_model, "base_model", hf_model)
    kwargs = model_kwargs(batch, backbone)
    if task == "fused_lm_ce":
        from twinkle_hf.kernels.fused_ce_loss import fused_ce_outputs

        if accepts(backbone, "use_cache"):
            kwargs["use_cache"] = False
        return fused_ce_outputs(backbone(**kwargs).last_hidden_state, hf_model.get_output_embeddings())
    hidden = backbone(**kwargs).last_hidden_state
    pooling = pooling or ("last" if is_causal_model(backbone) else "mean")
    return {"embeddings": pool(hidden, batch.get("attention_mask"), pooling), "last_hidden_state": hidden}


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """One vector per row from ``hidden`` (rows, tokens, dim), ignoring padding."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}.")
    if attention_mask is None or attention_mask.dim() != 2:
        attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
    mask = attention_mask.to(hidden.device)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    # last real token: the right-most position with mask 1 (works for left and right padding)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, torch.zeros_like(positions)).max(dim=1).values
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
