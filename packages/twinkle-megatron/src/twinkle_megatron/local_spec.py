"""What megatron-core's local (pure PyTorch) layer spec lacks for two families, so they also run on CPU.

**Zero-centred RMSNorm (Qwen3.5).** Qwen3.5 stores every RMSNorm weight as an offset from one:
``y = x / rms(x) * (1 + w)`` with ``w`` initialised to zero, computed in float32. Megatron's
``layernorm_zero_centered_gamma`` does this in Transformer Engine's norms, but the local spec's
torch norm refuses it, so the local spec gets this module in every norm slot (input, pre-MLP, q/k,
final). Keeping ``w`` as stored (instead of loading ``1 + w``) keeps the HF <-> megatron
conversion exact and ``w`` precise in low-precision weights.

**Core attention for MLA (DeepSeek).** megatron-core 0.16's ``MLASelfAttention`` builds its core
attention with ``k_channels``/``v_channels`` (q/k heads are ``qk_head_dim + qk_pos_emb_head_dim``
wide, v heads ``v_head_dim``), which only Transformer Engine's attention accepts: the local
``DotProductAttention`` raises ``TypeError: ... unexpected keyword argument 'k_channels'``. Its
computation handles the two widths already (q.k over the q/k width, probabilities times v, output
``heads * kv_channels`` wide with ``kv_channels = v_head_dim``), so :class:`MLADotProductAttention`
only takes those two arguments and checks them. And without TE installed, ``MLASelfAttention``
fails earlier: megatron's TE extension module imports with ``MagicMock`` stand-ins for TE's
classes, so ``multi_latent_attention.HAVE_TE`` is True and ``isinstance(self.linear_proj, TELinear)``
raises ``TypeError: isinstance() arg 2 must be a type``; :func:`local_layer_spec` sets that flag to
what it is (False) when TE does not import.
"""

from __future__ import annotations

from typing import Any

import torch


class ZeroCenteredRMSNorm(torch.nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * (1 + weight)`` in float32, cast back to the input dtype."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-6, **_: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(getattr(config, "sequence_parallel", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def zero_centered_block(layer_spec: Any, config: Any) -> Any:
    """A local-spec transformer block whose every norm (layers' and final) is :class:`ZeroCenteredRMSNorm`."""
    import copy

    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    spec = copy.deepcopy(layer_spec)
    layer = spec.submodules
    layer.input_layernorm = ZeroCenteredRMSNorm
    layer.pre_mlp_layernorm = ZeroCenteredRMSNorm
    attention = layer.self_attention.submodules
    for name in ("q_layernorm", "k_layernorm"):
        if getattr(attention, name, IdentityOp) is not IdentityOp:
            setattr(attention, name, ZeroCenteredRMSNorm)
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config),
                                      layer_norm=ZeroCenteredRMSNorm)


def _mla_core_attention() -> type:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        """megatron's local DotProductAttention, accepting MLA's ``k_channels`` / ``v_channels`` (module docstring)."""

        def __init__(self, config: Any, *args: Any, k_channels: int | None = None, v_channels: int | None = None,
                     **kwargs: Any) -> None:
            if v_channels is not None and v_channels != config.kv_channels:
                raise ValueError(f"MLA core attention: v_channels={v_channels} must equal kv_channels="
                                 f"{config.kv_channels} (the output is heads * kv_channels wide).")
            super().__init__(config, *args, **kwargs)

    return MLADotProductAttention


def local_layer_spec(layer_spec: Any, config: Any, mla: bool, zero_centered: bool) -> Any:
    """The local spec with MLA's core attention and/or zero-centred norms put in."""
    import copy

    if mla:
        from megatron.core.transformer import multi_latent_attention

        from twinkle_megatron.te import te_available

        if not te_available():
            multi_latent_attention.HAVE_TE = False  # its TE names are MagicMock stand-ins (module docstring)
        layer_spec = copy.deepcopy(layer_spec)
        layer_spec.submodules.self_attention.submodules.core_attention = _mla_core_attention()
    return zero_centered_block(layer_spec, config) if zero_centered else layer_spec
