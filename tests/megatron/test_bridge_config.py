"""HF config -> megatron-core TransformerConfig arguments, and the architectures the bridge refuses."""

from __future__ import annotations

import pytest
import torch
import transformers
from megatron_testing import tiny_config

from twinkle_megatron.bridge.config import model_args
from twinkle_megatron.errors import MegatronConfigError


@pytest.mark.parametrize(
    ("family", "qkv_bias", "linear_bias", "qk_norm", "window"),
    [("qwen2", True, False, False, None), ("qwen3", False, False, True, None), ("llama", True, True, False, None),
     ("mistral", False, False, False, 5)],
)
def test_dense_families_map_their_differences(family, qkv_bias, linear_bias, qk_norm, window):
    config = tiny_config(family)
    args = model_args(config)
    kwargs = args.transformer_kwargs()
    assert (kwargs["num_layers"], kwargs["hidden_size"], kwargs["num_attention_heads"]) == (2, 64, 4)
    assert (kwargs["num_query_groups"], kwargs["kv_channels"], kwargs["ffn_hidden_size"]) == (2, 16, 128)
    assert (kwargs["add_qkv_bias"], kwargs["add_bias_linear"], kwargs["qk_layernorm"]) == (qkv_bias, linear_bias,
                                                                                          qk_norm)
    assert kwargs["normalization"] == "RMSNorm" and kwargs["gated_linear_unit"] is True
    assert kwargs["activation_func"] is torch.nn.functional.silu
    assert kwargs["layernorm_epsilon"] == config.rms_norm_eps
    assert args.sliding_window == window
    gpt = args.gpt_kwargs()
    assert gpt["position_embedding_type"] == "rope" and gpt["rotary_base"] == 10000.0
    assert gpt["share_embeddings_and_output_weights"] is False and gpt["max_sequence_length"] == 256


def test_tied_embeddings_and_llama3_rope_scaling():
    config = tiny_config("llama", tie_word_embeddings=True, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    gpt = model_args(config).gpt_kwargs()
    assert gpt["share_embeddings_and_output_weights"] is True
    assert (gpt["rotary_base"], gpt["rope_scaling"], gpt["rope_scaling_factor"]) == (500000.0, True, 32.0)


def test_qwen3_moe_maps_experts_router_and_dense_layers():
    config = tiny_config("qwen3_moe", num_hidden_layers=4, mlp_only_layers=[0], norm_topk_prob=False,
                         router_aux_loss_coef=0.01)
    args = model_args(config)
    moe = args.transformer_kwargs()
    assert (moe["num_moe_experts"], moe["moe_router_topk"], moe["moe_ffn_hidden_size"]) == (4, 2, 32)
    assert moe["moe_layer_freq"] == [0, 1, 1, 1]  # layer 0 is a dense MLP (mlp_only_layers)
    assert moe["moe_router_pre_softmax"] is True  # softmax over all experts, no renormalisation
    assert moe["moe_aux_loss_coeff"] == 0.01 and args.qk_layernorm is True


def test_moe_arguments_build_a_megatron_config_for_expert_parallelism():
    from megatron.core.transformer import TransformerConfig

    args = model_args(tiny_config("qwen3_moe"))
    config = TransformerConfig(**args.transformer_kwargs(), expert_model_parallel_size=2, tensor_model_parallel_size=2)
    assert config.num_moe_experts == 4 and config.expert_model_parallel_size == 2
    assert config.moe_router_pre_softmax is False  # norm_topk_prob=True: top-k, then softmax over the k


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4),
         r"model_type='gpt2'.*Supported model types: deepseek_v3, llama, mistral, qwen2, qwen3, qwen3_5_moe_text, "
         r"qwen3_5_text, qwen3_moe"),
        (tiny_config("qwen2", hidden_act="gelu"), r"hidden_act='gelu' is not mapped"),
        (tiny_config("llama", attention_bias=True, mlp_bias=False), r"attention_bias=True with mlp_bias=False"),
        (tiny_config("qwen2", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
         r"rope_type='yarn' has no megatron-core equivalent"),
        (tiny_config("llama", rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                                "low_freq_factor": 2.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 8192}),
         r"llama3 rope scaling with \{'low_freq_factor': 2.0\}"),
        (tiny_config("qwen2", use_sliding_window=True, sliding_window=8), r"use_sliding_window=True"),
    ],
)
def test_unmappable_configs_are_refused_with_the_reason(config, message):
    with pytest.raises(MegatronConfigError, match=message):
        model_args(config)
