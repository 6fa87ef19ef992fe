"""Thin adapters from transformers modules / twinkle signatures to liger-kernel's autograd functions.

Imported only when a liger choice is applied; on a machine without a GPU driver every liger kernel
raises ``RuntimeError: 0 active drivers`` at call time.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.constants import IGNORE_INDEX
from twinkle.kernel.cross_entropy import FusedCEOutput, check_reduction
from twinkle.kernel.probes import rms_norm_spec


def rms_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops import LigerRMSNormFunction

    spec = rms_norm_spec(self)
    mode = "gemma" if spec.offset else "llama"
    return LigerRMSNormFunction.apply(hidden_states, self.weight, spec.eps, spec.offset, mode, False)


def swiglu_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops import LigerSiLUMulFunction

    return self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         *args: Any, unsqueeze_dim: int = 1, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for transformers' ``apply_rotary_pos_emb(q, k, cos, sin[, position_ids], unsqueeze_dim=1)``."""
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    unsqueeze_dim = next((a for a in args if isinstance(a, int)), unsqueeze_dim)
    return liger_rotary_pos_emb(q, k, cos, sin, None, unsqueeze_dim)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               bias: torch.Tensor | None = None, *, ignore_index: int = IGNORE_INDEX,
                               reduction: str = "mean", chunk_size: int | None = None) -> FusedCEOutput:
    """liger's fused linear CE with twinkle's signature and result (``chunk_size`` is liger's own choice).

    liger is always asked for the sum; the mean is taken here so that an all-ignored batch gives 0
    (liger would divide by zero).
    """
    from twinkle.extras import require

    require("liger_kernel", "liger's fused linear cross-entropy")
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    check_reduction(reduction)
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1).to(hidden.device)
    out = liger_fused_linear_cross_entropy(hidden, weight, labels, bias, ignore_index=ignore_index,
                                           reduction="sum", return_token_accuracy=True)
    tokens = (labels != ignore_index).sum()
    accuracy = torch.nan_to_num(out.token_accuracy.detach().float(), nan=0.0)
    correct = torch.round(accuracy * tokens).to(torch.int64)
    loss = out.loss.float()
    if reduction == "mean":
        loss = loss / tokens.clamp(min=1)
    return FusedCEOutput(loss, correct, tokens)
