"""liger-kernel's RMSNorm, RoPE, SwiGLU and fused linear cross-entropy as cuda kernel choices.

Available only where liger can run: a CUDA device is present and ``liger_kernel`` imports
(``pip install twinkle-hf[liger]``). Each choice accepts only modules whose semantics it
reproduces (see ``twinkle.kernel.probes``).
"""

from __future__ import annotations

import importlib.util

from twinkle.kernel import KernelChoice

_OPS = "twinkle_hf.kernels.liger_ops"


def liger_available() -> bool:
    """cuda present and liger-kernel installed (triton with a GPU driver comes with both)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


_LIGER = dict(provider="liger", devices=("cuda",), available=f"{__name__}:liger_available", priority=200)

LIGER_RMS_NORM = KernelChoice(op="rms_norm", forward=f"{_OPS}:rms_norm_forward",
                              accepts="twinkle.kernel.probes:is_standard_rms_norm",
                              description="LigerRMSNormFunction (offset 0 llama / 1 gemma casting)", **_LIGER)
LIGER_SWIGLU = KernelChoice(op="swiglu", forward=f"{_OPS}:swiglu_forward",
                            description="LigerSiLUMulFunction between the projections", **_LIGER)
LIGER_ROTARY_EMBEDDING = KernelChoice(op="rotary_embedding", function=f"{_OPS}:apply_rotary_pos_emb",
                                      accepts="twinkle.kernel.probes:module_uses_standard_rotary",
                                      description="liger_rotary_pos_emb", **_LIGER)
LIGER_FUSED_LINEAR_CROSS_ENTROPY = KernelChoice(op="fused_linear_cross_entropy",
                                                function=f"{_OPS}:fused_linear_cross_entropy",
                                                description="LigerFusedLinearCrossEntropyFunction", **_LIGER)
