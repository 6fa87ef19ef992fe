"""HF ``PretrainedConfig`` -> the architecture arguments of megatron-core's TransformerConfig and GPTModel.

Pure Python (no megatron import): everything the HF config implies is checked here, so an
unsupported architecture fails before any process group is created or any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle_megatron.bridge.families import Family, family_of
from twinkle_megatron.errors import MegatronConfigError


@dataclass(frozen=True)
class ModelArgs:
    """What megatron-core needs to build the HF model's twin (architecture only; no parallel sizes)."""

    family: Family
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    vocab_size: int
    max_sequence_length: int
    layernorm_epsilon: float
    add_qkv_bias: bool
    add_bias_linear: bool
    tie_word_embeddings: bool
    rotary_base: float
    rotary_percent: float = 1.0
    rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    sliding_window: int | None = None
    attention_dropout: float = 0.0
    init_method_std: float = 0.02
    moe: dict[str, Any] = field(default_factory=dict)

    @property
    def qk_layernorm(self) -> bool:
        return self.family.qk_norm

    @property
    def num_experts(self) -> int | None:
        return self.moe.get("num_moe_experts")

    def transformer_kwargs(self) -> dict[str, Any]:
        """The architecture fields of ``TransformerConfig``."""
        import torch.nn.functional as F

        kwargs = dict(
            num_layers=self.num_layers, hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups, kv_channels=self.kv_channels,
            ffn_hidden_size=self.ffn_hidden_size, normalization="RMSNorm", layernorm_epsilon=self.layernorm_epsilon,
            gated_linear_unit=True, activation_func=F.silu, add_qkv_bias=self.add_qkv_bias,
            add_bias_linear=self.add_bias_linear, qk_layernorm=self.qk_layernorm, hidden_dropout=0.0,
            attention_dropout=self.attention_dropout, init_method_std=self.init_method_std,
        )
        kwargs.update(self.moe)
        return kwargs

    def gpt_kwargs(self) -> dict[str, Any]:
        """GPTModel constructor arguments (vocabulary size excluded: it is padded for TP)."""
        return dict(
            max_sequence_length=self.max_sequence_length, position_embedding_type="rope",
            rotary_percent=self.rotary_percent, rotary_base=self.rotary_base, rope_scaling=self.rope_scaling,
            rope_scaling_factor=self.rope_scaling_factor,
            share_embeddings_and_output_weights=self.tie_word_embeddings,
        )


def _rope(hf_config: Any) -> tuple[float, bool, float, float]:
    """(rope_theta, llama3 scaling?, scaling factor, partial rotary factor) from transformers 4.x or 5.x configs."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    legacy = getattr(hf_config, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    scaling = {**legacy, **params}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    partial = float(params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0) or 1.0))
    if rope_type == "default":
        return float(theta), False, 8.0, partial
    if rope_type == "llama3":
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        differing = {k: scaling.get(k) for k, v in fixed.items() if float(scaling.get(k, v)) != float(v)}
        if differing:
            raise MegatronConfigError(
                f"llama3 rope scaling with {differing} cannot be expressed: megatron-core fixes "
                f"{fixed}. Use TransformersModel for this checkpoint."
            )
        return float(theta), True, float(scaling.get("factor", 8.0)), partial
    raise MegatronConfigError(
        f"rope_type={rope_type!r} has no megatron-core equivalent in this bridge (supported: 'default', "
        "'llama3'). Use TransformersModel for this checkpoint."
    )


def _require(hf_config: Any, name: str) -> Any:
    value = getattr(hf_config, name, None)
    if value is None:
        raise MegatronConfigError(f"The HF config ({type(hf_config).__name__}) has no {name!r}; it cannot be mapped.")
    return value


def _moe_args(hf_config: Any, num_layers: int) -> dict[str, Any]:
    experts = getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
    layer_freq = [0 if (i in dense or (i + 1) % step) else 1 for i in range(num_layers)]
    return dict(
        num_moe_experts=int(experts), moe_router_topk=int(_require(hf_config, "num_experts_per_tok")),
        moe_ffn_hidden_size=int(_require(hf_config, "moe_intermediate_size")),
        # Qwen3-MoE: softmax over all experts, top-k, renormalise only if norm_topk_prob
        moe_router_pre_softmax=not bool(getattr(hf_config, "norm_topk_prob", False)),
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
        moe_token_dispatcher_type="alltoall",
        moe_layer_freq=layer_freq if 0 in layer_freq else 1,
    )


def _biases(hf_config: Any, family: Family) -> tuple[bool, bool]:
    """(bias on q/k/v, bias on the other linear layers)."""
    if family.name == "qwen2":
        return True, False
    attention_bias = bool(getattr(hf_config, "attention_bias", False))
    mlp_bias = bool(getattr(hf_config, "mlp_bias", False))
    if attention_bias != mlp_bias:
        raise MegatronConfigError(
            f"attention_bias={attention_bias} with mlp_bias={mlp_bias} cannot be expressed: megatron-core's "
            "add_bias_linear switches the o_proj and MLP biases together (and with them the q/k/v bias). "
            "Use TransformersModel for this checkpoint."
        )
    return attention_bias, mlp_bias


def _sliding_window(hf_config: Any, family: Family) -> int | None:
    if family.name == "mistral":
        return getattr(hf_config, "sliding_window", None)
    if getattr(hf_config, "use_sliding_window", False):
        raise MegatronConfigError(
            f"{family.name} with use_sliding_window=True (window on some layers only) is not mapped; "
            "set use_sliding_window=False or use TransformersModel."
        )
    return None


def model_args(hf_config: Any) -> ModelArgs:
    """Map an HF config; raises MegatronConfigError for anything megatron-core would compute differently."""
    family = family_of(hf_config)
    act = getattr(hf_config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise MegatronConfigError(f"hidden_act={act!r} is not mapped (the bridge maps SwiGLU: 'silu').")
    heads = int(_require(hf_config, "num_attention_heads"))
    hidden = int(_require(hf_config, "hidden_size"))
    layers = int(_require(hf_config, "num_hidden_layers"))
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    theta, scaling, factor, partial = _rope(hf_config)
    qkv_bias, linear_bias = _biases(hf_config, family)
    return ModelArgs(
        family=family, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=int(getattr(hf_config, "num_key_value_heads", None) or heads), kv_channels=int(head_dim),
        ffn_hidden_size=int(_require(hf_config, "intermediate_size")),
        vocab_size=int(_require(hf_config, "vocab_size")),
        max_sequence_length=int(getattr(hf_config, "max_position_embeddings", 4096) or 4096),
        layernorm_epsilon=float(getattr(hf_config, "rms_norm_eps", 1e-6)), add_qkv_bias=qkv_bias,
        add_bias_linear=linear_bias, tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        rotary_base=theta, rotary_percent=partial, rope_scaling=scaling, rope_scaling_factor=factor,
        sliding_window=_sliding_window(hf_config, family),
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        init_method_std=float(getattr(hf_config, "initializer_range", 0.02) or 0.02),
        moe=_moe_args(hf_config, layers) if family.moe else {},
    )
