"""twinkle-hf's registrations (entry point ``twinkle = hf``). Specs are lazy: nothing heavy imports here."""

from __future__ import annotations

from importlib.util import find_spec

from twinkle.hookspecs import hookimpl


def torchao_installed() -> bool:
    """Whether torchao (the fp8 layers of ``twinkle_hf.fp8``) is installed; nothing is imported."""
    return find_spec("torchao") is not None


@hookimpl
def register_models():
    return {"TransformersModel": "twinkle_hf.model:TransformersModel",
            "MultiLoraTransformersModel": "twinkle_hf.multi_lora:MultiLoraTransformersModel"}


@hookimpl
def register_kernels():
    # liger-kernel choices (cuda only); see twinkle_hf/kernels/liger_choices.py
    names = ("rms_norm", "swiglu", "rotary_embedding", "fused_linear_cross_entropy")
    return {f"liger.{op}": f"twinkle_hf.kernels.liger_choices:LIGER_{op.upper()}" for op in names}


@hookimpl
def register_patches():
    return {"TransformersFusedCEPatch": "twinkle_hf.patches:TransformersFusedCEPatch"}


@hookimpl
def register_losses():
    return {"LigerFusedLinearCrossEntropyLoss": "twinkle_hf.kernels.fused_ce_loss:LigerFusedLinearCrossEntropyLoss"}


@hookimpl
def register_samplers():
    return {"TorchSampler": "twinkle_hf.sampler:TorchSampler", "VLLMSampler": "twinkle_hf.sampler:VLLMSampler"}


@hookimpl
def register_precisions():
    # mixed_precision='fp8' of TransformersModel: torchao's float8 layers (CUDA, compute capability 8.9+)
    return {"torchao.fp8": "twinkle_hf.fp8:TorchaoFP8"} if torchao_installed() else {}
