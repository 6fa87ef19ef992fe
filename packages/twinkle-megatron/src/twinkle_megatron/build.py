"""Build this rank's megatron-core GPTModel: TransformerConfig, layer spec (TE or local), pipeline stage.

The spec is Transformer Engine's when TE imports (required for fp8, context parallel and sequence
parallel) and megatron-core's local spec otherwise. ``megatron_kwargs`` may override any
TransformerConfig field (recompute, dropout...): the seed lets users pass megatron arguments as kwargs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from twinkle_megatron.bridge.config import ModelArgs
from twinkle_megatron.bridge.shard import expert_range, layer_range, padded_vocab_size
from twinkle_megatron.bridge.transfer import RankLayout
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.parallel.mesh import ParallelSizes
from twinkle_megatron.parallel.state import Ranks

#: Fields twinkle sets from the mesh or the precision; a kwarg may not contradict them.
_OWNED = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
          "expert_model_parallel_size", "sequence_parallel", "bf16", "fp16", "params_dtype", "fp8",
          "virtual_pipeline_model_parallel_size")


def _param_dtype(mixed_precision: str, device_type: str) -> torch.dtype:
    """Megatron keeps bf16/fp16 weights on GPU (fp32 master copies in the optimizer); CPU trains fp32 + autocast."""
    if device_type != "cuda" or mixed_precision == "no":
        return torch.float32
    return torch.float16 if mixed_precision == "fp16" else torch.bfloat16


def split_megatron_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the TransformerConfig fields out of ``kwargs``; anything left is an error for the caller."""
    from megatron.core.transformer import TransformerConfig

    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    picked = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
    owned = sorted(set(picked) & set(_OWNED))
    if owned:
        raise MegatronConfigError(f"{owned} are set by twinkle from device_mesh / mixed_precision; pass them there "
                                  "(DeviceMesh.from_sizes(tp_size=..., sequence_parallel=...), mixed_precision=...).")
    return picked


def fusions(device_type: str, use_te: bool) -> dict[str, bool]:
    """megatron-core's fused kernels, on where this device has them (kwargs of the model override each one).

    On CUDA the bias-dropout-add fusion (a TorchScript kernel, no extra package); with Transformer Engine also
    TE's fused RoPE, its fused weight-gradient accumulation into the main grads and the fused masked
    softmax. The CPU runs none (the CPU tests compare with HF's unfused numerics); apex's persistent layer
    norm is never assumed.
    """
    cuda = device_type == "cuda"
    return {"bias_dropout_fusion": cuda, "apply_rope_fusion": cuda and use_te,
            "gradient_accumulation_fusion": cuda and use_te, "masked_softmax_fusion": cuda and use_te,
            "persist_layer_norm": False}


def transformer_config(args: ModelArgs, sizes: ParallelSizes, mixed_precision: str, device_type: str,
                       use_te: bool, overrides: dict[str, Any], init_weights: bool) -> Any:
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    dtype = _param_dtype(mixed_precision, device_type)
    kwargs = args.transformer_kwargs()
    kwargs.update(
        tensor_model_parallel_size=sizes.tp, pipeline_model_parallel_size=sizes.pp,
        context_parallel_size=sizes.cp, expert_model_parallel_size=sizes.ep,
        sequence_parallel=sizes.sequence_parallel, params_dtype=dtype, bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16, pipeline_dtype=dtype if sizes.pp > 1 else None,
        variable_seq_lengths=sizes.pp > 1, calculate_per_token_loss=True, perform_initialization=init_weights,
        use_cpu_initialization=device_type != "cuda", **fusions(device_type, use_te),
    )
    if use_te and args.sliding_window:
        kwargs["window_size"] = (args.sliding_window - 1, 0)
    if mixed_precision == "fp8":
        kwargs.update(fp8="hybrid", fp8_recipe="delayed")
    kwargs.update(overrides)
    try:
        return (MLATransformerConfig if args.mla else TransformerConfig)(**kwargs)
    except (AssertionError, ValueError, TypeError) as exc:
        raise MegatronConfigError(f"megatron-core rejected the TransformerConfig: {exc}") from exc


def layer_spec(args: ModelArgs, config: Any, use_te: bool) -> Any:
    """Transformer Engine spec when TE imports, else the local (pure megatron-core) spec.

    MLA (DeepSeek) and the attention output gate (Qwen3.5) come from the config; zero-centred norms
    (Qwen3.5) are TE's ``layernorm_zero_centered_gamma``; the local spec gets them, and MLA a core attention it
    can build, from :mod:`twinkle_megatron.local_spec`.
    """
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if args.num_experts:
        return specs.get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization="RMSNorm")
    if use_te:
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=args.qk_layernorm,
                                                                multi_latent_attention=bool(args.mla))
    spec = specs.get_gpt_layer_local_spec(qk_layernorm=args.qk_layernorm, normalization="RMSNorm",
                                          multi_latent_attention=bool(args.mla))
    if args.zero_centered_norm or args.mla:
        from twinkle_megatron.local_spec import local_layer_spec

        return local_layer_spec(spec, config, mla=bool(args.mla), zero_centered=args.zero_centered_norm)
    return spec


def mark_tensor_parallel(gpt: torch.nn.Module) -> int:
    """Tag the split weights of megatron's parallel layers as split (``tensor_model_parallel``).

    megatron-core 0.16 sets these attributes only inside its weight initialisation, which is skipped
    when weights come from a checkpoint (``perform_initialization=False``). Without them its
    gradient norm -- and twinkle's CPU one -- counts a split weight on TP rank 0 only, so clipping
    under TP > 1 uses a norm that is too small. Returns how many weights were tagged.
    """
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    tagged = 0
    for module in gpt.modules():
        mode = getattr(module, "parallel_mode", None)  # Transformer Engine layers: 'column' / 'row'
        if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)) or mode == "column":
            dim = 0
        elif isinstance(module, RowParallelLinear) or mode == "row":
            dim = 1
        else:
            continue
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and not hasattr(weight, "tensor_model_parallel"):
            weight.tensor_model_parallel, weight.partition_dim, weight.partition_stride = True, dim, 1
            tagged += 1
    return tagged


def rank_layout(args: ModelArgs, sizes: ParallelSizes, ranks: Ranks, use_te: bool = False) -> RankLayout:
    experts = expert_range(args.num_experts, ranks.ep, sizes.ep) if args.num_experts else None
    return RankLayout(tp_rank=ranks.tp, tp_size=sizes.tp, layers=layer_range(args.num_layers, ranks.pp, sizes.pp),
                      experts=experts, pre_process=ranks.is_first_stage, post_process=ranks.is_last_stage,
                      padded_vocab=padded_vocab_size(args.vocab_size, sizes.tp), tp_group=ranks.tp_group,
                      te_spec=use_te)


@dataclass
class Built:
    """What :func:`build_gpt` made for this rank."""

    gpt: Any
    config: Any
    layout: RankLayout
    use_te: bool


def build_gpt(args: ModelArgs, sizes: ParallelSizes, ranks: Ranks, mixed_precision: str, device_type: str,
              use_te: bool, overrides: dict[str, Any], init_weights: bool) -> Built:
    """This rank's GPTModel (its pipeline stage, its TP shard), on the current device."""
    from megatron.core.models.gpt import GPTModel

    config = transformer_config(args, sizes, mixed_precision, device_type, use_te, overrides, init_weights)
    layout = rank_layout(args, sizes, ranks, use_te)
    gpt = GPTModel(config, layer_spec(args, config, use_te), vocab_size=layout.padded_vocab,
                   pre_process=layout.pre_process, post_process=layout.post_process, parallel_output=True,
                   **args.gpt_kwargs())
    if not init_weights:
        mark_tensor_parallel(gpt)
    if device_type == "cuda":
        gpt = gpt.cuda(torch.cuda.current_device())
    return Built(gpt=gpt, config=config, layout=layout, use_te=use_te)
