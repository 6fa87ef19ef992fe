"""The HF architectures the bridge maps, and what differs between them.

Every family here is a pre-norm decoder with RMSNorm, rotary embeddings and a SwiGLU MLP, which
megatron-core's GPTModel expresses directly. The differences are a handful of flags: bias on q/k/v,
per-head RMSNorm on q/k (Qwen3, Qwen3.5), a sliding window (Mistral), experts (Qwen3-MoE,
Qwen3.5-MoE, DeepSeek-V3/R1), a sigmoid output gate on attention and zero-centred norm weights
(Qwen3.5: ``x_norm * (1 + w)``), multi-latent attention (DeepSeek-V3/R1). Yi-1.5 checkpoints are
``llama``.

:data:`UNMAPPED` names the supported families the bridge knows it cannot build, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle_megatron.errors import MegatronConfigError


@dataclass(frozen=True)
class Family:
    """One HF architecture family the bridge maps."""

    name: str
    model_types: tuple[str, ...]
    architecture: str  # the HF class written to config.json on save
    qk_norm: bool = False
    moe: bool = False
    gated_attention: bool = False  # q_proj also yields a per-head gate: out = attn * sigmoid(gate)
    zero_centered_norm: bool = False  # every RMSNorm scales by (1 + weight)
    mla: bool = False  # multi-latent attention (DeepSeek)
    shared_expert: str | None = None  # HF module of the shared expert(s): 'shared_expert' | 'shared_experts'


FAMILIES: tuple[Family, ...] = (
    Family("qwen2", ("qwen2",), "Qwen2ForCausalLM"),
    Family("qwen3", ("qwen3",), "Qwen3ForCausalLM", qk_norm=True),
    Family("llama", ("llama",), "LlamaForCausalLM"),
    Family("mistral", ("mistral",), "MistralForCausalLM"),
    Family("qwen3_moe", ("qwen3_moe",), "Qwen3MoeForCausalLM", qk_norm=True, moe=True),
    Family("qwen3_5", ("qwen3_5_text",), "Qwen3_5ForCausalLM", qk_norm=True, gated_attention=True,
           zero_centered_norm=True),
    Family("qwen3_5_moe", ("qwen3_5_moe_text",), "Qwen3_5MoeForCausalLM", qk_norm=True, moe=True,
           gated_attention=True, zero_centered_norm=True, shared_expert="shared_expert"),
    Family("deepseek_v3", ("deepseek_v3",), "DeepseekV3ForCausalLM", qk_norm=True, moe=True, mla=True,
           shared_expert="shared_experts"),
)

#: model types of supported families megatron-core 0.16 cannot build through this bridge, with the reason
UNMAPPED: dict[str, str] = {
    "deepseek_v4": (
        "DeepSeek V4 (DeepseekV4ForCausalLM) has no megatron-core 0.16 counterpart: its manifold-constrained "
        "hyper-connections (hc_mult residual streams mixed by Sinkhorn iterations), compressed sparse / heavily "
        "compressed attention with a lightning indexer, grouped low-rank output projection, attention sinks and "
        "hash-routed MoE layers are modules megatron-core does not have"),
    "glm": ("GLM-4 (GlmForCausalLM) is not mapped by the bridge: its interleaved partial rotary embedding and "
            "fused gate_up projection have no HF<->megatron mapping written"),
    "glm4": ("GLM-4-0414 (Glm4ForCausalLM) is not mapped by the bridge: its post-attention and post-MLP norms "
             "have no megatron-core GPT layer counterpart"),
    "internlm2": ("InternLM2 / InternLM2.5 (remote code, InternLM2ForCausalLM) is not mapped by the bridge: "
                  "transformers has no class for it and the bridge reads only transformers architectures"),
}


_BY_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def supported_model_types() -> list[str]:
    return sorted(_BY_TYPE)


def family_of(hf_config: Any) -> Family:
    """The family of an HF config, or a MegatronConfigError naming the supported model types."""
    model_type = getattr(hf_config, "model_type", None)
    if getattr(hf_config, "vision_config", None) is not None:
        raise MegatronConfigError(
            f"MegatronModel does not train vision-language models: model_type={model_type!r} has a vision tower, "
            f"which the bridge has no mapping for. MegatronModel supports the text families "
            f"{', '.join(f.name for f in FAMILIES)} (model types {', '.join(supported_model_types())}). Train "
            "Qwen2.5-VL/Qwen3-VL/Qwen3.5 and other VL models with TransformersModel (docs/multimodal.md)."
        )
    family = _BY_TYPE.get(model_type)
    if family is None and model_type in UNMAPPED:
        raise MegatronConfigError(
            f"MegatronModel cannot build model_type={model_type!r}: {UNMAPPED[model_type]}. Train it with "
            f"TransformersModel. MegatronModel supports {', '.join(supported_model_types())}."
        )
    if family is None:
        archs = getattr(hf_config, "architectures", None) or []
        raise MegatronConfigError(
            f"MegatronModel has no HF<->Megatron mapping for model_type={model_type!r} "
            f"(architectures={list(archs)}). Supported model types: {', '.join(supported_model_types())}. "
            "Use TransformersModel for other architectures, or add a Family to twinkle_megatron.bridge.families."
        )
    return family
