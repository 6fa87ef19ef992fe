"""torch_npu's fused rms_norm, rotary_mul, swiglu and fusion attention as kernel choices for device npu.

They head every chain (priority 300) and are available only when the NPU platform is (torch_npu
imports and sees a device), so on any other machine the chains fall through to liger / torch.
"""

from __future__ import annotations

from twinkle.kernel import KernelChoice

_OPS = "twinkle_npu.kernels.ops"


def npu_available() -> bool:
    """torch_npu installed, importable and seeing an NPU (never raises)."""
    from twinkle_npu.platform import NPUPlatform

    return NPUPlatform.is_available()


_NPU = dict(provider="npu", devices=("npu",), available=f"{__name__}:npu_available", priority=300)

NPU_RMS_NORM = KernelChoice(op="rms_norm", forward=f"{_OPS}:rms_norm_forward",
                            accepts="twinkle.kernel.probes:is_standard_rms_norm",
                            description="torch_npu.npu_rms_norm", **_NPU)
NPU_SWIGLU = KernelChoice(op="swiglu", forward=f"{_OPS}:swiglu_forward",
                          description="torch_npu.npu_swiglu on cat(gate, up)", **_NPU)
NPU_ROTARY_EMBEDDING = KernelChoice(op="rotary_embedding", function=f"{_OPS}:apply_rotary_pos_emb",
                                    accepts="twinkle.kernel.probes:module_uses_standard_rotary",
                                    description="torch_npu.npu_rotary_mul", **_NPU)
NPU_ATTENTION = KernelChoice(op="attention", function=f"{_OPS}:fusion_attention",
                             description="torch_npu.npu_fusion_attention (BNSD, GQA, causal/padding masks)", **_NPU)
