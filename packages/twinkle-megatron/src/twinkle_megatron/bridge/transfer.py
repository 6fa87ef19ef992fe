"""HF tensors -> one rank's megatron module, and the module -> HF tensors (its pipeline stage, full across TP).

``RankLayout`` says what this rank holds (TP piece, layer range, expert range, first/last stage);
loading reads only those tensors, checks every name and shape, and copies only after all checks
pass, so a wrong checkpoint leaves the model untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from twinkle import collective
from twinkle.checkpoint import CheckpointError
from twinkle_megatron.bridge.config import ModelArgs
from twinkle_megatron.bridge.layout import hf_names, model_names, to_hf, to_mcore
from twinkle_megatron.bridge.naming import Placement, module_key
from twinkle_megatron.bridge.shard import DOWN_PROJECTION, shard, split_kind, unshard


@dataclass(frozen=True)
class RankLayout:
    """This rank's share of the model."""

    tp_rank: int = 0
    tp_size: int = 1
    layers: range | None = None
    experts: range | None = None
    pre_process: bool = True
    post_process: bool = True
    padded_vocab: int = 0
    tp_group: Any = None
    te_spec: bool = False  # built with Transformer Engine's layer spec (MLA down projections duplicated)

    @property
    def placement(self) -> Placement:
        return Placement(layer_offset=self.layers.start if self.layers else 0,
                         expert_offset=self.experts.start if self.experts else 0)

    def names(self, args: ModelArgs) -> list[str]:
        names = model_names(args, self.layers, self.experts, self.pre_process, self.post_process)
        if args.tie_word_embeddings and self.post_process and not self.pre_process:
            names.append("output_layer.weight")  # a separate copy of the embeddings on the last stage
        return names


def _source_names(name: str, args: ModelArgs) -> list[str]:
    if name == "output_layer.weight" and args.tie_word_embeddings:
        return ["model.embed_tokens.weight"]
    return hf_names(name, args)


def _kind(name: str, layout: RankLayout) -> str:
    if layout.te_spec and DOWN_PROJECTION.search(name):
        return "replicated"
    return split_kind(name)


def _build(name: str, hf: Mapping[str, torch.Tensor], args: ModelArgs, padded: int) -> torch.Tensor:
    if name == "output_layer.weight" and args.tie_word_embeddings:
        return to_mcore("embedding.word_embeddings.weight", hf, args, padded)
    return to_mcore(name, hf, args, padded)


def load_into(module: torch.nn.Module, hf: Mapping[str, torch.Tensor], args: ModelArgs, layout: RankLayout,
              available: set[str] | None = None) -> int:
    """Copy this rank's share of the HF tensors ``hf`` into ``module``; returns how many tensors were set."""
    state = module.state_dict(keep_vars=True)
    keys = set(state)
    names = layout.names(args)
    if available is not None:
        missing = sorted({s for n in names for s in _source_names(n, args)} - available)
        if missing:
            raise CheckpointError(f"The HF checkpoint lacks {len(missing)} tensors this model needs "
                                  f"(e.g. {missing[:4]}); is it a {args.family.architecture} checkpoint?")
    planned: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name in names:
        target = state[module_key(name, keys, layout.placement)]
        full = _build(name, hf, args, layout.padded_vocab)
        piece = full if _kind(name, layout) == "replicated" else shard(name, full, layout.tp_rank, layout.tp_size)
        if tuple(piece.shape) != tuple(target.shape):
            raise CheckpointError(f"{name}: the checkpoint gives shape {tuple(piece.shape)} on TP rank "
                                  f"{layout.tp_rank}, the model has {tuple(target.shape)}. Does the config match "
                                  "the weights?")
        planned.append((target, piece))
    with torch.no_grad():
        for target, piece in planned:
            target.data.copy_(piece.to(dtype=target.dtype, device=target.device))
    return len(planned)


def gather_tp(name: str, local: torch.Tensor, layout: RankLayout) -> torch.Tensor:
    """The full tensor from every TP rank's piece (a no-op at TP=1 or for replicated tensors)."""
    if layout.tp_size == 1 or _kind(name, layout) == "replicated":
        return local
    return unshard(name, collective.all_gather(local, group=layout.tp_group))


def export_from(module: torch.nn.Module, args: ModelArgs, layout: RankLayout) -> dict[str, torch.Tensor]:
    """This stage's tensors as HF tensors (full across TP; every TP rank gets them)."""
    state = module.state_dict(keep_vars=True)
    keys = set(state)
    out: dict[str, torch.Tensor] = {}
    for name in layout.names(args):
        if name == "output_layer.weight" and args.tie_word_embeddings:
            continue  # the first stage exports the shared embeddings
        local = state[module_key(name, keys, layout.placement)].detach()
        out.update(to_hf(name, gather_tp(name, local, layout), args))
    return out
