"""Tensor names and layouts: one megatron-core tensor <-> the HF tensors it is made of.

Names on the megatron side are *canonical*: megatron-core's local-spec names with global layer and
expert indices (``decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight``). ``naming.py``
turns them into a rank's module names (local indices, Transformer Engine aliases).

Two fusions differ from HF:

* ``linear_qkv``: rows grouped per key/value head: ``[q heads of group g, k_g, v_g]`` for each
  group g, so a contiguous TP slice holds whole groups. With an attention output gate (Qwen3.5,
  whose ``q_proj`` yields ``[q_h; gate_h]`` per head) a group is ``[q heads, gate heads, k_g, v_g]``;
* ``linear_fc1``: ``[gate; up]`` stacked (TP slices each half separately, see ``shard.py``).

Family-specific names come first (:func:`rules`): DeepSeek's multi-latent attention
(``linear_q_down_proj`` = ``q_a_proj``, ``q_layernorm`` = ``q_a_layernorm``, ...), the router's
correction bias, and shared experts (``shared_expert`` in Qwen3.5-MoE with its sigmoid gate,
``shared_experts`` in DeepSeek).

LoRA tensors follow their layer: ``<module>.lora_A.weight`` / ``<module>.lora_B.weight``. A LoRA
on the fused ``linear_qkv`` has one A shared by q, k and v (so the HF adapter repeats it) and a
B whose rows split like the weight's; the output layer's B has the padded vocabulary's rows, like its weight.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from twinkle_megatron.bridge.config import ModelArgs
from twinkle_megatron.errors import MegatronConfigError

_L = r"(?P<layer>\d+)"
_E = r"(?P<expert>\d+)"


@dataclass(frozen=True)
class Rule:
    """A megatron name pattern, the HF name templates it maps to, and how they combine."""

    mcore: str
    hf: tuple[str, ...]
    kind: str = "copy"  # copy | qkv | gate_up | vocab

    def match(self, name: str) -> re.Match[str] | None:
        return re.fullmatch(self.mcore, name)


_ATTN = r"decoder\.layers\." + _L + r"\.self_attention\."
_MLP = r"decoder\.layers\." + _L + r"\.mlp\."
_EXPERT = _MLP + r"experts\.local_experts\." + _E + r"\."
_HF_ATTN = "model.layers.{layer}.self_attn."
_HF_MLP = "model.layers.{layer}.mlp."
_HF_EXPERT = "model.layers.{layer}.mlp.experts.{expert}."

RULES: tuple[Rule, ...] = (
    Rule(r"embedding\.word_embeddings\.weight", ("model.embed_tokens.weight",), "vocab"),
    Rule(r"output_layer\.weight", ("lm_head.weight",), "vocab"),
    Rule(r"output_layer\.lora_A\.weight", ("lm_head.lora_A.weight",)),
    Rule(r"output_layer\.lora_B\.weight", ("lm_head.lora_B.weight",), "vocab"),
    Rule(r"decoder\.final_layernorm\.weight", ("model.norm.weight",)),
    Rule(r"decoder\.layers\." + _L + r"\.input_layernorm\.weight", ("model.layers.{layer}.input_layernorm.weight",)),
    Rule(r"decoder\.layers\." + _L + r"\.pre_mlp_layernorm\.weight",
         ("model.layers.{layer}.post_attention_layernorm.weight",)),
    Rule(_ATTN + r"linear_qkv\.(?P<p>weight|bias)", tuple(_HF_ATTN + f"{x}_proj.{{p}}" for x in "qkv"), "qkv"),
    Rule(_ATTN + r"linear_qkv\.lora_A\.weight", tuple(_HF_ATTN + f"{x}_proj.lora_A.weight" for x in "qkv"), "shared"),
    Rule(_ATTN + r"linear_qkv\.lora_B\.weight", tuple(_HF_ATTN + f"{x}_proj.lora_B.weight" for x in "qkv"), "qkv"),
    Rule(_ATTN + r"linear_proj\.(?P<p>weight|bias|lora_A\.weight|lora_B\.weight)", (_HF_ATTN + "o_proj.{p}",)),
    Rule(_ATTN + r"q_layernorm\.weight", (_HF_ATTN + "q_norm.weight",)),
    Rule(_ATTN + r"k_layernorm\.weight", (_HF_ATTN + "k_norm.weight",)),
    Rule(_MLP + r"router\.weight", (_HF_MLP + "gate.weight",)),
    Rule(_EXPERT + r"linear_fc1\.weight", (_HF_EXPERT + "gate_proj.weight", _HF_EXPERT + "up_proj.weight"), "gate_up"),
    Rule(_EXPERT + r"linear_fc2\.weight", (_HF_EXPERT + "down_proj.weight",)),
    Rule(_MLP + r"linear_fc1\.(?P<p>weight|bias|lora_B\.weight)",
         (_HF_MLP + "gate_proj.{p}", _HF_MLP + "up_proj.{p}"), "gate_up"),
    Rule(_MLP + r"linear_fc1\.lora_A\.weight", (_HF_MLP + "gate_proj.lora_A.weight", _HF_MLP + "up_proj.lora_A.weight"),
         "shared"),
    Rule(_MLP + r"linear_fc2\.(?P<p>weight|bias|lora_A\.weight|lora_B\.weight)", (_HF_MLP + "down_proj.{p}",)),
)


_MLA_RULES: tuple[Rule, ...] = (
    Rule(_ATTN + r"linear_q_proj\.weight", (_HF_ATTN + "q_proj.weight",)),
    Rule(_ATTN + r"linear_q_down_proj\.weight", (_HF_ATTN + "q_a_proj.weight",)),
    Rule(_ATTN + r"q_layernorm\.weight", (_HF_ATTN + "q_a_layernorm.weight",)),
    Rule(_ATTN + r"linear_q_up_proj\.weight", (_HF_ATTN + "q_b_proj.weight",)),
    Rule(_ATTN + r"linear_kv_down_proj\.weight", (_HF_ATTN + "kv_a_proj_with_mqa.weight",)),
    Rule(_ATTN + r"kv_layernorm\.weight", (_HF_ATTN + "kv_a_layernorm.weight",)),
    Rule(_ATTN + r"linear_kv_up_proj\.weight", (_HF_ATTN + "kv_b_proj.weight",)),
    Rule(_MLP + r"router\.expert_bias", (_HF_MLP + "gate.e_score_correction_bias",)),
)


def _shared_expert_rules(module: str) -> tuple[Rule, ...]:
    hf = _HF_MLP + module + "."
    return (
        Rule(_MLP + r"shared_experts\.linear_fc1\.weight", (hf + "gate_proj.weight", hf + "up_proj.weight"), "gate_up"),
        Rule(_MLP + r"shared_experts\.linear_fc2\.weight", (hf + "down_proj.weight",)),
        Rule(_MLP + r"shared_experts\.gate_weight", (_HF_MLP + "shared_expert_gate.weight",)),
    )


def rules(args: ModelArgs | None = None) -> tuple[Rule, ...]:
    """The rules of ``args``' family, its own names first."""
    if args is None:
        return RULES
    family = args.family
    extra = _MLA_RULES if family.mla else ()
    if family.shared_expert:
        extra += _shared_expert_rules(family.shared_expert)
    return extra + RULES


def rule_for(name: str, args: ModelArgs | None = None) -> tuple[Rule, dict[str, str]]:
    for rule in rules(args):
        found = rule.match(name)
        if found:
            return rule, found.groupdict()
    raise KeyError(f"No HF mapping for megatron tensor {name!r}.")


def hf_names(name: str, args: ModelArgs | None = None) -> list[str]:
    """The HF tensor names that make up megatron tensor ``name``."""
    rule, groups = rule_for(name, args)
    return [template.format(**groups) for template in rule.hf]


# ---------------------------------------------------------------- fusions
def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    groups = args.num_query_groups
    tail = q.shape[1:]
    if args.attention_output_gate:  # HF q_proj rows: [q_h; gate_h] per head -> [q heads; gate heads] per group
        halves = q.reshape(args.num_attention_heads, 2, args.kv_channels, *tail)
        q = torch.cat([halves[:, 0].reshape(groups, -1, *tail), halves[:, 1].reshape(groups, -1, *tail)], dim=1)
    parts = [t.reshape(groups, -1, *tail) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def split_qkv(fused: torch.Tensor, args: ModelArgs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, dim = args.num_query_groups, args.kv_channels
    per_group = args.num_attention_heads // groups * dim
    gate = per_group if args.attention_output_gate else 0
    tail = fused.shape[1:]
    grouped = fused.reshape(groups, per_group + gate + 2 * dim, *tail)
    q, g, k, v = torch.split(grouped, [per_group, gate, dim, dim], dim=1)
    if gate:
        heads = args.num_attention_heads
        q = torch.stack([q.reshape(heads, dim, *tail), g.reshape(heads, dim, *tail)], dim=1)
    return tuple(t.reshape(-1, *tail).contiguous() for t in (q, k, v))  # type: ignore[return-value]


def _pad_vocab(tensor: torch.Tensor, padded: int) -> torch.Tensor:
    if tensor.shape[0] == padded:
        return tensor
    pad = tensor.new_zeros(padded - tensor.shape[0], *tensor.shape[1:])
    return torch.cat([tensor, pad], dim=0)


def to_mcore(name: str, hf: Mapping[str, torch.Tensor], args: ModelArgs, padded_vocab: int) -> torch.Tensor:
    """Build megatron tensor ``name`` from the HF tensors listed by :func:`hf_names` (looked up in ``hf``)."""
    rule, _ = rule_for(name, args)
    tensors = [hf[n] for n in hf_names(name, args)]
    if rule.kind == "qkv":
        return fuse_qkv(*tensors, args)
    if rule.kind == "gate_up":
        return torch.cat(tensors, dim=0)
    if rule.kind == "shared":
        first = tensors[0]
        if any(not torch.equal(first, t) for t in tensors[1:]):
            raise MegatronConfigError(
                f"{hf_names(name, args)} have different LoRA A matrices; megatron fuses these projections into one "
                "layer with one A. Only adapters whose A is shared (as saved by MegatronModel) can be loaded."
            )
        return first
    if rule.kind == "vocab":
        return _pad_vocab(tensors[0], padded_vocab)
    return tensors[0]


def to_hf(name: str, tensor: torch.Tensor, args: ModelArgs) -> dict[str, torch.Tensor]:
    """Split megatron tensor ``name`` into its HF tensors (vocabulary padding removed)."""
    rule, _ = rule_for(name, args)
    names = hf_names(name, args)
    if rule.kind == "qkv":
        return dict(zip(names, split_qkv(tensor, args)))
    if rule.kind == "gate_up":
        return dict(zip(names, (t.contiguous() for t in torch.chunk(tensor, 2, dim=0))))
    if rule.kind == "shared":
        return {n: tensor.clone() for n in names}
    if rule.kind == "vocab":
        return {names[0]: tensor[: args.vocab_size].contiguous()}
    return {names[0]: tensor}


# ----------------------------------------------------------------- inventory
def is_moe_layer(args: ModelArgs, layer: int) -> bool:
    if not args.moe:
        return False
    freq = args.moe.get("moe_layer_freq", 1)
    return bool(freq[layer]) if isinstance(freq, list) else layer % int(freq) == 0


def layer_names(args: ModelArgs, layer: int, experts: range | None = None) -> list[str]:
    """Canonical megatron names of one decoder layer (``experts``: the expert ids this rank holds)."""
    p = f"decoder.layers.{layer}."
    attn = p + "self_attention."
    if args.mla:
        names = [p + "input_layernorm.weight", attn + "linear_proj.weight", p + "pre_mlp_layernorm.weight"]
        if args.mla.get("q_lora_rank"):
            names += [attn + "linear_q_down_proj.weight", attn + "q_layernorm.weight", attn + "linear_q_up_proj.weight"]
        else:
            names.append(attn + "linear_q_proj.weight")
        names += [attn + "linear_kv_down_proj.weight", attn + "kv_layernorm.weight", attn + "linear_kv_up_proj.weight"]
    else:
        names = [p + "input_layernorm.weight", attn + "linear_qkv.weight", attn + "linear_proj.weight",
                 p + "pre_mlp_layernorm.weight"]
        if args.add_qkv_bias:
            names.append(attn + "linear_qkv.bias")
    if args.add_bias_linear:
        names.append(attn + "linear_proj.bias")
    if args.qk_layernorm and not args.mla:
        names += [attn + "q_layernorm.weight", attn + "k_layernorm.weight"]
    if is_moe_layer(args, layer):
        names.append(p + "mlp.router.weight")
        if args.moe.get("moe_router_enable_expert_bias"):
            names.append(p + "mlp.router.expert_bias")
        for expert in experts if experts is not None else range(args.num_experts or 0):
            names += [f"{p}mlp.experts.local_experts.{expert}.linear_fc1.weight",
                      f"{p}mlp.experts.local_experts.{expert}.linear_fc2.weight"]
        if args.moe.get("moe_shared_expert_intermediate_size"):
            names += [p + "mlp.shared_experts.linear_fc1.weight", p + "mlp.shared_experts.linear_fc2.weight"]
            if args.moe.get("moe_shared_expert_gate"):
                names.append(p + "mlp.shared_experts.gate_weight")
    else:
        names += [p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
        if args.add_bias_linear:
            names += [p + "mlp.linear_fc1.bias", p + "mlp.linear_fc2.bias"]
    return names


def model_names(args: ModelArgs, layers: range | None = None, experts: range | None = None,
                pre_process: bool = True, post_process: bool = True) -> list[str]:
    """Canonical megatron names held by one pipeline stage (all of them by default)."""
    names = ["embedding.word_embeddings.weight"] if pre_process else []
    for layer in layers if layers is not None else range(args.num_layers):
        names += layer_names(args, layer, experts)
    if post_process:
        names.append("decoder.final_layernorm.weight")
        if not args.tie_word_embeddings:
            names.append("output_layer.weight")
    return names


def convert_hf_to_mcore(hf: Mapping[str, torch.Tensor], args: ModelArgs, padded_vocab: int | None = None,
                        names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """A whole HF state dict -> canonical megatron tensors (unsharded)."""
    padded = padded_vocab or args.vocab_size
    return {n: to_mcore(n, hf, args, padded) for n in (names or model_names(args))}


def convert_mcore_to_hf(mcore: Mapping[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Canonical megatron tensors (unsharded) -> an HF state dict."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in mcore.items():
        out.update(to_hf(name, tensor, args))
    return out
