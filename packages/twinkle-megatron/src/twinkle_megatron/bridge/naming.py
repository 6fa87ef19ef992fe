"""Canonical megatron names (global indices, local-spec names) <-> one rank's state-dict keys.

A rank's module differs from the canonical names in three ways: layer and expert indices are
local to its pipeline stage / expert-parallel rank; the Transformer Engine spec fuses the norms
into the following linear layer (``linear_qkv.layer_norm_weight``) and groups experts
(``experts.linear_fc1.weight3``), and MLA's q/kv norms into its up projections; and a LoRA-wrapped
layer keeps its weight under ``base_layer``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

LAYER_PREFIX = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")
_LORA = re.compile(r"\.(lora_[AB])\.weight$")


@dataclass(frozen=True)
class Placement:
    """Where this rank sits: the offsets turning global layer / expert ids into local ones."""

    layer_offset: int = 0
    expert_offset: int = 0


def _localise(name: str, placement: Placement) -> str:
    found = LAYER_PREFIX.match(name)
    if found:
        name = f"decoder.layers.{int(found.group(1)) - placement.layer_offset}." + name[found.end():]
    found = _EXPERT.search(name)
    if found:
        local = int(found.group(1)) - placement.expert_offset
        name = name[: found.start()] + f".mlp.experts.local_experts.{local}." + name[found.end():]
    return name


def _candidates(local: str, adapter: str | None) -> list[str]:
    lora = _LORA.search(local)
    if lora:
        return [f"{local[: lora.start()]}.{lora.group(1)}.{adapter or 'default'}"]
    aliases = [local]
    if local.endswith(".input_layernorm.weight"):
        aliases.append(local.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"))
    if local.endswith(".pre_mlp_layernorm.weight"):
        aliases.append(local.replace(".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"))
    for norm, fused in ((".q_layernorm.weight", ".linear_q_up_proj.layer_norm_weight"),  # MLA under TE
                        (".kv_layernorm.weight", ".linear_kv_up_proj.layer_norm_weight")):
        if local.endswith(norm):
            aliases.append(local[: -len(norm)] + fused)
    grouped = re.sub(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$", r".mlp.experts.\2.weight\1",
                     local)
    if grouped != local:
        aliases.append(grouped)
    out = []
    for alias in aliases:  # a LoRA-wrapped layer keeps its own tensors under base_layer
        module, _, leaf = alias.rpartition(".")
        out += [alias, f"{module}.base_layer.{leaf}"]
    return out


def module_key(name: str, keys: Iterable[str] | set[str], placement: Placement, adapter: str | None = None) -> str:
    """The key of canonical tensor ``name`` in a rank's ``named_parameters``/state dict."""
    keys = keys if isinstance(keys, set) else set(keys)
    local = _localise(name, placement)
    for candidate in _candidates(local, adapter):
        if candidate in keys:
            return candidate
    raise KeyError(f"Megatron tensor {name!r} (local {local!r}) is not in this rank's model; "
                   f"tried {_candidates(local, adapter)}.")
