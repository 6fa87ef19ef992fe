"""Ulysses attention: around each attention call the ranks of the sequence group trade heads for tokens.

Every rank holds ``seq / n`` tokens of q, k and v for all heads. One all-to-all gives each rank all
``seq`` tokens of ``heads / n`` heads; the model's own attention function (transformers' sdpa, or the
family's eager one) runs on them with the mask of the *whole* sequence, and a second all-to-all gives
the output back as ``seq / n`` tokens of all heads. Attention is exact: it sees every key, and the mask
(causal, padding, the boundaries of packed rows) is the one a single process builds for the full rows.
Both exchanges are torch's differentiable ``all_to_all_single_autograd``; their backward is the reverse exchange.

It is registered as a transformers attention implementation (``AttentionInterface``): the model's
attention modules call it through ``config._attn_implementation`` like any other, and their
:data:`STATE_ATTRIBUTE` points back at the :class:`~twinkle_hf.distributed.sequence_parallel.SequenceParallel`
that knows the group and the current batch's layout.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

#: the name of the attention implementation in transformers' registry
ATTENTION_NAME = "twinkle_ulysses"
#: the attention module attribute holding a weak reference to its SequenceParallel
STATE_ATTRIBUTE = "_twinkle_sequence_parallel"
#: the attention implementations the exchange wraps (flash-attention takes cu_seqlens, not a mask: not built)
INNER_IMPLEMENTATIONS = ("sdpa", "eager")


def exchange(tensor: torch.Tensor, group: Any, size: int, heads_to_sequence: bool) -> torch.Tensor:
    """The all-to-all between the sequence and the head dimension.

    ``heads_to_sequence``: ``(batch, heads, seq/n, dim)`` -> ``(batch, heads/n, seq, dim)`` (rank r keeps heads
    ``r*heads/n ...``, the sequence in rank order); otherwise ``(batch, seq, heads/n, dim)`` -> ``(batch,
    seq/n, heads, dim)``, the layout transformers' attention functions return.
    """
    # torch's differentiable functional collective (the older torch.distributed.nn one is deprecated)
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    if heads_to_sequence:
        batch, heads, local, dim = tensor.shape
        # chunk r of dim 0 goes to rank r: its heads, all of this rank's tokens
        send = tensor.reshape(batch, size, heads // size, local, dim).permute(1, 0, 2, 3, 4).contiguous()
        # waited at once: a plain tensor for the attention kernels (not the lazily waited collective wrapper)
        received = wait_tensor(all_to_all_single_autograd(send, None, None, group))  # chunk r: rank r's tokens
        return received.permute(1, 2, 0, 3, 4).reshape(batch, heads // size, size * local, dim)
    batch, seq, heads, dim = tensor.shape
    local = seq // size
    send = tensor.reshape(batch, size, local, heads, dim).permute(1, 0, 2, 3, 4).contiguous()
    received = wait_tensor(all_to_all_single_autograd(send, None, None, group))  # chunk r: rank r's heads
    return received.permute(1, 2, 0, 3, 4).reshape(batch, local, size * heads, dim)


class _ModuleView:
    """An attention module as the inner function sees it, with key/value heads already repeated."""

    num_key_value_groups = 1

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def inner_function(module: torch.nn.Module, implementation: str) -> Any:
    """transformers' function for ``implementation``; ``eager`` is the family's own ``eager_attention_forward``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation == "eager":
        function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if function is None:
            raise NotImplementedError(f"{type(module).__name__} has no eager_attention_forward in its modeling file; "
                                      "sequence parallelism needs attn_implementation='sdpa' for it.")
        return function
    return ALL_ATTENTION_FUNCTIONS[implementation]


def ulysses_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention function (transformers' signature; the local mask is not used).

    Returns:
        ``(output of shape (batch, seq/n, heads, head_dim), None)``: no attention weights under the exchange.
    """
    from transformers.integrations.sdpa_attention import repeat_kv

    owner = getattr(module, STATE_ATTRIBUTE, None)
    sp = owner() if owner is not None else None
    if sp is None:
        raise RuntimeError(f"{type(module).__name__} runs attn_implementation={ATTENTION_NAME!r} but no sequence-"
                           "parallel model set it up; it is installed by TransformersModel on a mesh with cp_size > 1.")
    size, group = sp.size, sp.group
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % size:
        raise ValueError(f"cp_size={size} does not divide the {heads} attention heads of {type(module).__name__}: "
                         "each rank attends with whole heads. Pick a cp_size dividing it.")
    view: Any = module
    if kv_heads % size:  # fewer key/value heads than ranks: each rank gets the copies its query heads use
        groups = heads // kv_heads
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        view = _ModuleView(module)
    query, key, value = (exchange(t, group, size, heads_to_sequence=True) for t in (query, key, value))
    kwargs.pop("position_ids", None)  # this rank's positions; the full mask already holds the row boundaries
    mask = sp.full_mask(query)
    output, _ = inner_function(module, sp.inner)(view, query, key, value, mask, **kwargs)
    return exchange(output, group, size, heads_to_sequence=False), None


def register() -> None:
    """Add :func:`ulysses_attention` to transformers' attention registry (once per process; idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, ulysses_attention)
