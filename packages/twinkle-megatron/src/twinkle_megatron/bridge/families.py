"""The HF architectures the bridge maps, and what differs between them.

Every family here is a pre-norm decoder with RMSNorm, rotary embeddings, grouped-query attention
and a SwiGLU MLP, which megatron-core's GPTModel expresses directly. The differences are a handful
of flags: bias on q/k/v, per-head RMSNorm on q/k (Qwen3), a sliding window (Mistral), experts
(Qwen3-MoE).
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


FAMILIES: tuple[Family, ...] = (
    Family("qwen2", ("qwen2",), "Qwen2ForCausalLM"),
    Family("qwen3", ("qwen3",), "Qwen3ForCausalLM", qk_norm=True),
    Family("llama", ("llama",), "LlamaForCausalLM"),
    Family("mistral", ("mistral",), "MistralForCausalLM"),
    Family("qwen3_moe", ("qwen3_moe",), "Qwen3MoeForCausalLM", qk_norm=True, moe=True),
)

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
    if family is None:
        archs = getattr(hf_config, "architectures", None) or []
        raise MegatronConfigError(
            f"MegatronModel has no HF<->Megatron mapping for model_type={model_type!r} "
            f"(architectures={list(archs)}). Supported model types: {', '.join(supported_model_types())}. "
            "Use TransformersModel for other architectures, or add a Family to twinkle_megatron.bridge.families."
        )
    return family
