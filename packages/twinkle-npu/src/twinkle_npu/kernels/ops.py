"""Adapters from transformers modules / helpers to torch_npu's fused kernels.

Each imports torch_npu on call; the choices that point here are available only when it imports.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from twinkle.kernel import KernelNotApplicable
from twinkle.kernel.probes import rms_norm_spec

#: npu_fusion_attention's compressed causal mask for sparse_mode=2 is always 2048 x 2048
_CAUSAL_MASK_SIZE = 2048
_causal_masks: dict[torch.device, torch.Tensor] = {}


def _torch_npu() -> Any:
    return importlib.import_module("torch_npu")


def rms_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    spec = rms_norm_spec(self)
    gamma = self.weight if not spec.offset else self.weight + spec.offset
    return _torch_npu().npu_rms_norm(hidden_states, gamma, epsilon=spec.eps)[0]


def swiglu_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
    return self.down_proj(_torch_npu().npu_swiglu(gate_up, dim=-1))


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         *args: Any, unsqueeze_dim: int = 1, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for transformers' ``apply_rotary_pos_emb``; a partial rotary width passes the rest through."""
    unsqueeze_dim = next((a for a in args if isinstance(a, int)), unsqueeze_dim)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotary_mul = _torch_npu().npu_rotary_mul
    rot = cos.shape[-1]

    def apply(x: torch.Tensor) -> torch.Tensor:
        if rot == x.shape[-1]:
            return rotary_mul(x, cos, sin)
        return torch.cat((rotary_mul(x[..., :rot].contiguous(), cos, sin), x[..., rot:]), dim=-1)

    return apply(q), apply(k)


def _causal_mask(device: torch.device) -> torch.Tensor:
    if device not in _causal_masks:
        ones = torch.ones(_CAUSAL_MASK_SIZE, _CAUSAL_MASK_SIZE, dtype=torch.bool, device=device)
        _causal_masks[device] = torch.triu(ones, diagonal=1)
    return _causal_masks[device]


def _npu_mask(attention_mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor,
              module: Any) -> tuple[torch.Tensor | None, int]:
    """(atten_mask with True = masked out, sparse_mode) for npu_fusion_attention."""
    if attention_mask is None:
        causal = getattr(module, "is_causal", False) and query.shape[2] > 1
        if causal and query.shape[2] != key.shape[2]:
            raise KernelNotApplicable("causal attention with different query/key lengths")
        return (_causal_mask(query.device), 2) if causal else (None, 0)
    mask = attention_mask[..., : key.shape[2]]
    if mask.dtype == torch.bool:
        return ~mask, 0  # transformers: True = attend
    return mask < 0, 0  # additive mask: 0 = attend, a large negative value = masked


def fusion_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     sliding_window: int | None = None, softcap: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention-interface signature over ``npu_fusion_attention`` (BNSD layout, GQA native).

    Sliding windows, logit soft-capping and attention sinks are not handled: the model's own
    implementation runs for those calls (:class:`KernelNotApplicable`).
    """
    if sliding_window is not None or softcap is not None or kwargs.get("s_aux") is not None:
        raise KernelNotApplicable("sliding window / softcap / sinks")
    heads, head_dim = query.shape[1], query.shape[-1]
    atten_mask, sparse_mode = _npu_mask(attention_mask, query, key, module)
    out = _torch_npu().npu_fusion_attention(
        query, key, value, heads, input_layout="BNSD", atten_mask=atten_mask,
        scale=scaling if scaling is not None else head_dim ** -0.5, keep_prob=1.0 - dropout,
        sparse_mode=sparse_mode)[0]
    return out.transpose(1, 2).contiguous(), None
