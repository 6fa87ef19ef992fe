"""Forward flavours selected by ``task=``: next-token logits, or pooled sentence embeddings.

Keys of a collated batch that the model's ``forward`` does not take (``labels``, ``length``...) stay
in the batch for the loss and metrics but are not passed to the model (:func:`model_kwargs`):
twinkle computes the loss itself.

``causal_lm`` runs the model (with its head) and returns its output (``logits``...).
``fused_lm_ce`` runs the backbone and hands the hidden states and the lm_head weight to
``LigerFusedLinearCrossEntropyLoss``, so the (batch, seq, vocab) logits never exist.
``embedding`` runs the backbone without the LM head and pools the last hidden states into one
vector per row: ``mean`` over real tokens, ``last`` real token or ``cls`` (the first token). Each
family pools its own way, and says which in the sentence-transformers files beside its weights
(``modules.json`` -> ``1_Pooling/config.json``): Qwen3-Embedding the last token (the end-of-text token
its tokenizer appends), GTE (``thenlper/gte-*-zh``) the ``[CLS]`` token, all-MiniLM the mean. That
choice is read from the model's directory (:func:`family_pooling`); a model without those files pools
``last`` when it is a decoder and ``mean`` when it is an encoder; ``pooling=`` overrides both. The
result is ``{'embeddings': (rows, hidden), 'last_hidden_state': ...}``; the vectors are not normalised
(InfoNCE takes cosines; normalise them yourself to compare with a family's normalised output).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from twinkle.constants import SHIFT_LABELS
from twinkle.model.inputs import is_default_input
from twinkle.utils.checks import check_choice

#: Keys never passed to the model: the loss and the bookkeeping read them.
NOT_MODEL_INPUTS = frozenset({"labels", SHIFT_LABELS, "length", "group_size"})


@lru_cache(maxsize=64)
def _forward_params(forward: Any) -> frozenset[str] | None:
    params = inspect.signature(forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        named = frozenset(n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD)
        return named | {"input_ids", "attention_mask", "position_ids", "token_type_ids"}
    return frozenset(params)


def model_kwargs(batch: Mapping[str, Any], module: torch.nn.Module) -> dict[str, Any]:
    """The entries of ``batch`` that ``module.forward`` accepts, minus labels, bookkeeping and default inputs."""
    accepted = _forward_params(type(module).forward)
    return {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS and (accepted is None or k in accepted)
            and not (k in ("attention_mask", "position_ids") and is_default_input(v))}


def accepts(module: torch.nn.Module, name: str) -> bool:
    """Whether ``module.forward`` takes the keyword ``name``."""
    accepted = _forward_params(type(module).forward)
    return accepted is None or name in accepted


TASKS = ("causal_lm", "embedding", "fused_lm_ce")
POOLINGS = ("mean", "last", "cls")


def check_task(task: str) -> str:
    return check_choice(task, "task", TASKS)


def is_causal_model(module: torch.nn.Module) -> bool:
    """Whether the attention is causal (decoder): any submodule says ``is_causal = True``."""
    return any(getattr(m, "is_causal", False) is True for m in module.modules())


def run_task(model: torch.nn.Module, hf_model: torch.nn.Module, task: str, batch: Mapping[str, Any],
             pooling: str | None = None, through_root: bool = False) -> Any:
    """The forward of ``task``; ``model`` may be the peft wrapper of ``hf_model``.

    ``through_root``: under FSDP2 every forward must enter through the root module, whose hooks
    gather the root's own parameters (embeddings, final norm, lm_head); calling the backbone
    directly would leave them sharded and make ranks gather the head ad hoc, in different orders
    (the first-step deadlock of the fused loss). See :func:`_hidden_through_root`.
    """
    if through_root and task != "causal_lm":
        hidden = _hidden_through_root(model, hf_model, batch)
        if task == "fused_lm_ce":
            from twinkle_hf.kernels.fused_ce_loss import fused_ce_outputs

            return fused_ce_outputs(hidden, hf_model.get_output_embeddings())
        return _pooled(hidden, batch, pooling, getattr(hf_model, "base_model", hf_model))
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
    return _pooled(backbone(**kwargs).last_hidden_state, batch, pooling, backbone)


def _pooled(hidden: torch.Tensor, batch: Mapping[str, Any], pooling: str | None, backbone: torch.nn.Module) -> Any:
    pooling = pooling or family_pooling(backbone) or ("last" if is_causal_model(backbone) else "mean")
    return {"embeddings": pool(hidden, batch.get("attention_mask"), pooling), "last_hidden_state": hidden}


#: sentence-transformers' pooling flags (``1_Pooling/config.json``) -> twinkle's pooling
_ST_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}
_ST_NAMES = {"cls": "cls", "mean": "mean", "lasttoken": "last"}
_UNREAD = object()


def family_pooling(model: torch.nn.Module) -> str | None:
    """The pooling a model's own sentence-transformers config names, read once from the directory it was
    loaded from (``modules.json``'s Pooling module, else ``1_Pooling/config.json``); None without one.

    A pooling twinkle does not implement (``max``, ``weightedmean``...) is an error naming it.
    """
    cached = getattr(model, "_twinkle_pooling", _UNREAD)
    if cached is not _UNREAD:
        return cached
    found = read_pooling_config(getattr(model, "name_or_path", None) or "")
    model.__dict__["_twinkle_pooling"] = found  # a plain attribute: not a parameter, never saved
    return found


def read_pooling_config(directory: str | Path) -> str | None:
    """``cls``, ``mean`` or ``last`` from a sentence-transformers model directory; None when it has no pooling."""
    root = Path(directory)
    if not str(directory) or not root.is_dir():
        return None
    folder = "1_Pooling"
    modules = _read_json(root / "modules.json")
    if isinstance(modules, list):
        folder = next((m.get("path") for m in modules if isinstance(m, dict)
                       and str(m.get("type", "")).endswith("Pooling")), folder)
    config = _read_json(root / folder / "config.json")
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("pooling_mode"), str):  # newer sentence-transformers write the mode by name
        mode = config["pooling_mode"]
        if mode not in _ST_NAMES:
            raise ValueError(f"{root}: the model pools with {mode!r} ({folder}/config.json); twinkle pools "
                             f"{', '.join(POOLINGS)}: pass forward(..., pooling=...) to choose one.")
        return _ST_NAMES[mode]
    chosen = [flag for flag, value in config.items() if flag.startswith("pooling_mode_") and value is True]
    if not chosen:
        return None
    if len(chosen) > 1 or chosen[0] not in _ST_MODES:
        raise ValueError(f"{root}: the model pools with {chosen} ({folder}/config.json); twinkle pools "
                         f"{', '.join(POOLINGS)}: pass forward(..., pooling=...) to choose one.")
    return _ST_MODES[chosen[0]]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _hidden_through_root(model: torch.nn.Module, hf_model: torch.nn.Module, batch: Mapping[str, Any]) -> Any:
    """Final hidden states from a forward of the root module with the LM head made an identity.

    The root's FSDP2 unit stays unsharded from its forward until its backward, so the head weight
    the fused loss reads afterwards is the gathered parameter and its gradient is reduced with the
    root's: the same collectives, in the same order, on every rank.
    """
    head = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
    kwargs = model_kwargs(batch, hf_model)
    if accepts(hf_model, "use_cache"):
        kwargs["use_cache"] = False
    if head is None:  # a bare backbone (AutoModel) is its own root
        return model(**kwargs).last_hidden_state
    head.forward = _identity
    try:
        return model(**kwargs).logits
    finally:
        del head.forward


def _identity(hidden: torch.Tensor) -> torch.Tensor:
    return hidden


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """One vector per row from ``hidden`` (rows, tokens, dim), ignoring padding."""
    check_choice(pooling, "pooling", POOLINGS)
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
