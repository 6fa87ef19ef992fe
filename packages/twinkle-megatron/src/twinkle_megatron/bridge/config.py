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
    mla: dict[str, Any] = field(default_factory=dict)  # MLATransformerConfig fields (DeepSeek)

    @property
    def qk_layernorm(self) -> bool:
        return self.family.qk_norm

    @property
    def attention_output_gate(self) -> bool:
        return self.family.gated_attention

    @property
    def zero_centered_norm(self) -> bool:
        return self.family.zero_centered_norm

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
        if self.attention_output_gate:
            kwargs["attention_output_gate"] = True
        if self.zero_centered_norm:
            kwargs["layernorm_zero_centered_gamma"] = True
        kwargs.update(self.moe)
        kwargs.update(self.mla)
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


def _moe_args(hf_config: Any, num_layers: int, family: Family) -> dict[str, Any]:
    """Megatron's MoE fields, or {} when no layer has experts (then the model is dense)."""
    experts = (getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
               or getattr(hf_config, "n_routed_experts", None))
    if family.name == "deepseek_v3":
        first_dense = int(getattr(hf_config, "first_k_dense_replace", 0) or 0)
        layer_freq = [0 if i < first_dense else 1 for i in range(num_layers)]
    else:
        step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
        dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
        layer_freq = [0 if (i in dense or (i + 1) % step) else 1 for i in range(num_layers)]
    if 1 not in layer_freq:
        return {}
    topk = int(_require(hf_config, "num_experts_per_tok"))
    args: dict[str, Any] = dict(
        num_moe_experts=int(experts), moe_router_topk=topk,
        moe_ffn_hidden_size=int(_require(hf_config, "moe_intermediate_size")),
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
        moe_token_dispatcher_type="alltoall",
        moe_layer_freq=layer_freq if 0 in layer_freq else 1,
    )
    if family.name == "qwen3_moe":
        # softmax over all experts, top-k, renormalise only if norm_topk_prob
        args["moe_router_pre_softmax"] = not bool(getattr(hf_config, "norm_topk_prob", False))
    elif family.name == "qwen3_5_moe":
        # softmax, top-k, always renormalised (= softmax over the top-k logits); a sigmoid-gated shared expert
        args.update(moe_router_pre_softmax=False,
                    moe_shared_expert_intermediate_size=int(_require(hf_config, "shared_expert_intermediate_size")),
                    moe_shared_expert_gate=True)
    elif family.name == "deepseek_v3":
        args.update(_deepseek_router(hf_config, topk))
    return args


def _deepseek_router(hf_config: Any, topk: int) -> dict[str, Any]:
    """DeepSeek-V3 routing: sigmoid scores, a selection-only correction bias, group-limited top-k, renormalised
    weights scaled by routed_scaling_factor; shared experts beside the routed ones. No auxiliary loss, and the
    correction bias is a loaded constant as in transformers (megatron's bias update is switched off)."""
    if topk > 1 and not getattr(hf_config, "norm_topk_prob", True):
        raise MegatronConfigError("DeepSeek-V3 routing with norm_topk_prob=False cannot be expressed: megatron-core "
                                  "renormalises sigmoid top-k weights. Use TransformersModel for this checkpoint.")
    out: dict[str, Any] = dict(
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.0,
        moe_router_topk_scaling_factor=float(getattr(hf_config, "routed_scaling_factor", 1.0) or 1.0),
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
    )
    groups, group_topk = int(getattr(hf_config, "n_group", 1) or 1), int(getattr(hf_config, "topk_group", 1) or 1)
    if groups > 1:
        if topk % group_topk or topk // group_topk != 2:
            raise MegatronConfigError(
                f"DeepSeek-V3 group-limited routing scores a group by its top-2 experts; megatron-core scores it by "
                f"its top num_experts_per_tok/topk_group = {topk}/{group_topk}, which differs. Use TransformersModel "
                "for this checkpoint.")
        out.update(moe_router_num_groups=groups, moe_router_group_topk=group_topk)
    shared = int(getattr(hf_config, "n_shared_experts", 0) or 0)
    if shared:
        out["moe_shared_expert_intermediate_size"] = shared * int(_require(hf_config, "moe_intermediate_size"))
    return out


def _mla_args(hf_config: Any) -> dict[str, Any]:
    """MLATransformerConfig fields of a DeepSeek-V3 config (multi-latent attention, rope or YaRN rope)."""
    if getattr(hf_config, "rope_interleave", True) is False:
        raise MegatronConfigError("DeepSeek-V3 with rope_interleave=False is not mapped: megatron-core's MLA always "
                                  "reads the rotary part of q/k as interleaved pairs.")
    params = {**(getattr(hf_config, "rope_scaling", None) or {}), **(getattr(hf_config, "rope_parameters", None) or {})}
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    out: dict[str, Any] = dict(
        multi_latent_attention=True, q_lora_rank=getattr(hf_config, "q_lora_rank", None),
        kv_lora_rank=int(_require(hf_config, "kv_lora_rank")), qk_head_dim=int(_require(hf_config, "qk_nope_head_dim")),
        qk_pos_emb_head_dim=int(_require(hf_config, "qk_rope_head_dim")),
        v_head_dim=int(_require(hf_config, "v_head_dim")),
        rotary_base=float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))),
    )
    if rope_type == "default":
        return {**out, "rope_type": "rope", "rotary_scaling_factor": 1.0, "mscale_all_dim": 0.0}
    if rope_type == "yarn":
        return {**out, "rope_type": "yarn", "rotary_scaling_factor": float(params["factor"]),
                "original_max_position_embeddings": int(params.get("original_max_position_embeddings", 4096)),
                "beta_fast": float(params.get("beta_fast", 32)), "beta_slow": float(params.get("beta_slow", 1)),
                "mscale": float(params.get("mscale", 1.0) or 1.0),
                "mscale_all_dim": float(params.get("mscale_all_dim", 0.0) or 0.0)}
    raise MegatronConfigError(f"DeepSeek-V3 rope_type={rope_type!r} is not mapped (MLA takes 'default' or 'yarn').")


def _check_attention_layers(hf_config: Any, family: Family) -> None:
    """Qwen3.5 interleaves Gated DeltaNet (linear attention) layers with gated attention; only the latter map."""
    kinds = list(getattr(hf_config, "layer_types", None) or [])
    linear = [i for i, kind in enumerate(kinds) if kind != "full_attention"]
    if linear:
        raise MegatronConfigError(
            f"{family.architecture}: layers {linear} are {kinds[linear[0]]!r} (Gated DeltaNet). megatron-core 0.16 "
            "builds Gated DeltaNet only through its experimental Transformer Engine block spec with the FLA "
            "(flash-linear-attention) Triton kernels, i.e. on a GPU, and this bridge has no mapping for those "
            "layers' weights. MegatronModel takes Qwen3.5 configs whose layer_types are all 'full_attention'; train "
            "hybrid Qwen3.5 checkpoints with TransformersModel."
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
    if family.gated_attention:
        _check_attention_layers(hf_config, family)
    act = getattr(hf_config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise MegatronConfigError(f"hidden_act={act!r} is not mapped (the bridge maps SwiGLU: 'silu').")
    heads = int(_require(hf_config, "num_attention_heads"))
    hidden = int(_require(hf_config, "hidden_size"))
    layers = int(_require(hf_config, "num_hidden_layers"))
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    mla = _mla_args(hf_config) if family.mla else {}
    if mla:
        head_dim = mla["v_head_dim"]
        theta, scaling, factor, partial = mla["rotary_base"], False, 8.0, 1.0
    else:
        theta, scaling, factor, partial = _rope(hf_config)
    qkv_bias, linear_bias = _biases(hf_config, family)
    moe = _moe_args(hf_config, layers, family) if family.moe else {}
    ffn = getattr(hf_config, "intermediate_size", None)
    if ffn is None:  # every layer has experts (Qwen3.5-MoE): the dense size is unused
        ffn = int(moe.get("moe_ffn_hidden_size") or _require(hf_config, "intermediate_size"))
    return ModelArgs(
        family=family, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=int(getattr(hf_config, "num_key_value_heads", None) or heads), kv_channels=int(head_dim),
        ffn_hidden_size=int(ffn),
        vocab_size=int(_require(hf_config, "vocab_size")),
        max_sequence_length=int(getattr(hf_config, "max_position_embeddings", 4096) or 4096),
        layernorm_epsilon=float(getattr(hf_config, "rms_norm_eps", 1e-6)), add_qkv_bias=qkv_bias,
        add_bias_linear=linear_bias, tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        rotary_base=theta, rotary_percent=partial, rope_scaling=scaling, rope_scaling_factor=factor,
        sliding_window=_sliding_window(hf_config, family),
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        init_method_std=float(getattr(hf_config, "initializer_range", 0.02) or 0.02),
        moe=moe, mla=mla,
    )
