"""How each megatron tensor is split across tensor-parallel ranks, and put back together.

* column-parallel (``dim0``): embeddings, output layer, ``linear_qkv`` (whole query groups per
  rank, thanks to the grouped layout), LoRA B of column layers (the output layer's: over the vocabulary),
  MLA's projections (whole heads per rank for the up projections; the down projections' rows are
  gathered again before use -- with Transformer Engine they are duplicated instead, see ``transfer.py``);
* ``gated``: ``linear_fc1`` = ``[gate; up]``: each rank holds ``[gate_i; up_i]``;
* row-parallel (``dim1``): ``linear_proj``, ``linear_fc2`` and their LoRA A;
* everything else (norms, router, row-layer biases, LoRA A of column layers) is replicated.

Pipeline stages own contiguous layer ranges and expert-parallel ranks contiguous expert ranges;
:func:`layer_range` / :func:`expert_range` say which.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from twinkle_megatron.errors import MegatronConfigError

_DIM0 = re.compile(r"(word_embeddings\.weight|output_layer\.(weight|lora_B\.weight)|"
                   r"linear_qkv\.(weight|bias|lora_B\.weight)|linear_(q|q_down|q_up|kv_down|kv_up)_proj\.weight)$")
#: MLA down projections: column-parallel in megatron's local spec, duplicated TELinear in Transformer Engine's
DOWN_PROJECTION = re.compile(r"linear_(q|kv)_down_proj\.weight$")
_GATED = re.compile(r"linear_fc1\.(weight|bias|lora_B\.weight)$")
_DIM1 = re.compile(r"(linear_proj|linear_fc2)\.(weight|lora_A\.weight)$")


def split_kind(name: str) -> str:
    """``dim0``, ``gated``, ``dim1`` or ``replicated`` for a canonical (or module) megatron name."""
    if _GATED.search(name):
        return "gated"
    if _DIM0.search(name):
        return "dim0"
    if _DIM1.search(name):
        return "dim1"
    return "replicated"


def shard(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This TP rank's piece of the full tensor ``name``."""
    if size == 1:
        return full
    kind = split_kind(name)
    if kind == "replicated":
        return full
    dim = 1 if kind == "dim1" else 0
    if full.shape[dim] % (2 * size if kind == "gated" else size):
        raise MegatronConfigError(f"{name}: size {full.shape[dim]} along dim {dim} does not divide by tp_size={size}.")
    if kind == "gated":
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([torch.chunk(gate, size)[rank], torch.chunk(up, size)[rank]], dim=0).contiguous()
    return torch.chunk(full, size, dim=dim)[rank].contiguous()


def unshard(name: str, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full tensor from every TP rank's piece (in rank order)."""
    if len(pieces) == 1:
        return pieces[0]
    kind = split_kind(name)
    if kind == "replicated":
        return pieces[0]
    if kind == "gated":
        halves = [torch.chunk(p, 2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(pieces), dim=1 if kind == "dim1" else 0)


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """Megatron's vocabulary-parallel layers need rows divisible by TP: pad up (the padding is never saved)."""
    return -(-vocab_size // tp_size) * tp_size


def layer_range(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """The global layer indices pipeline stage ``pp_rank`` holds (even split)."""
    if num_layers % pp_size:
        raise MegatronConfigError(
            f"num_hidden_layers={num_layers} does not divide into pp_size={pp_size} equal stages; choose a pp_size "
            f"dividing {num_layers}."
        )
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def expert_range(num_experts: int, ep_rank: int, ep_size: int) -> range:
    """The global expert ids expert-parallel rank ``ep_rank`` holds."""
    if num_experts % ep_size:
        raise MegatronConfigError(f"num_experts={num_experts} does not divide by ep_size={ep_size}.")
    per = num_experts // ep_size
    return range(ep_rank * per, (ep_rank + 1) * per)
