"""Tensor parallelism for TransformersModel: transformers' own plan, applied once every adapter exists.

The plan is the model's (``_tp_plan`` of its class plus ``config.base_model_tp_plan``: q/k/v and
gate/up column-parallel, o/down row-parallel, the input embedding vocabulary-parallel, the LM head
column-parallel with its logits gathered), resolved by transformers for this model and applied with
transformers' styles (``transformers.distributed.tensor_parallel``) on the ``tp`` dimension of a torch
DeviceMesh built from ours. Weights become DTensors sharded over the tp ranks; every rank reads the
same batch.

LoRA: adapters are added before the plan is applied (as under FSDP2), so peft initialises them at full
size -- the same values as one process. Then each LoRA layer's base layer takes the plan's style and
its factors are sharded the way peft shards them for a DTensor-parallel base model
(``peft.tuners.lora.model.add_lora_tp_hooks_dtensor``): a column-parallel layer's ``lora_B`` is
column-parallel (``lora_A`` replicated; its gradient is summed over the ranks by the DTensor input
layout), a row-parallel layer's ``lora_A`` is row-parallel (``lora_B`` replicated, fed by the reduced
low-rank activation). peft's own hook runs only when the base model is already sharded when the adapter
is added, and then draws ``lora_A`` at the local width (another init than one process's); this order
avoids that. The LM head (column-parallel with its logits gathered: replicated input, full output) keeps
its adapters replicated, which needs no reduction at all.

Under FSDP2 x TP (torchtitan's 2-D layout) the tensor-parallel weights are then ``fully_shard``-ed over
the ``fsdp`` dimension of the same torch mesh (``wrap.parallelize``): a weight is a DTensor on the 2-D
mesh, a replicated one a DTensor on the fsdp dimension.

The loss sees full logits (the head's output is gathered), so no vocabulary-parallel cross-entropy is
needed for correctness; it would save the gather (not built). The gradient norm mixes DTensor gradients
(sharded weights) and plain ones (replicated norms, whose gradients are already complete on every rank):
:func:`clip_grad_norm` adds them up, which torch's ``clip_grad_norm_`` refuses to do on mixed lists.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: the styles a LoRA-wrapped layer can take: peft shards adapters on the first two; on a column-parallel
#: layer whose output is gathered (the LM head) the input is replicated and the output full, so the adapters
#: stay replicated: x @ A.T @ B.T is complete on every rank, and so are their gradients
SHARDED_LORA_STYLES = ("colwise", "rowwise")
LORA_STYLES = (*SHARDED_LORA_STYLES, "colwise_gather_output")
#: a replicated parameter whose gradient each rank holds only part of (Qwen3's per-head q_norm/k_norm)
PARTIAL_GRAD = "replicated_with_grad_allreduce"


def resolve_plan(hf_model: torch.nn.Module, tp_size: int, override: dict[str, str] | None = None) -> dict[str, str]:
    """transformers' tensor-parallel plan of ``hf_model`` for ``tp_size`` ranks, one concrete name per entry.

    Args:
        hf_model: the transformers model, before any adapter is injected.
        tp_size: the number of tensor-parallel ranks.
        override: entries replacing the model's (transformers' ``DistributedConfig.tp_plan``).

    Returns:
        ``{module or parameter name: style}``. Raises ``ValueError`` naming the family and the fix when the
        model has no plan or its heads do not split over ``tp_size``.
    """
    from transformers.distributed import DistributedConfig

    family = getattr(getattr(hf_model, "config", None), "model_type", None) or type(hf_model).__name__
    if not callable(getattr(hf_model, "_resolve_parallel_plans", None)):
        raise ValueError(f"{type(hf_model).__name__} ({family}) is not a transformers PreTrainedModel with a "
                         "tensor-parallel plan; use fsdp_size instead of tp_size.")
    _check_heads(hf_model.config.get_text_config(), tp_size, family)
    config = DistributedConfig(tp_size=tp_size, tp_plan=override) if override else DistributedConfig(tp_size=tp_size)
    try:
        plan, _, _ = hf_model._resolve_parallel_plans(config)
    except ValueError as exc:
        raise ValueError(f"tp_size={tp_size}: the {family} model {type(hf_model).__name__} has no usable "
                         f"tensor-parallel plan ({exc}). Use fsdp_size={tp_size} instead of tp_size.") from exc
    return plan


def _check_heads(config: Any, tp_size: int, family: str) -> None:
    """Attention heads are split over the ranks: each rank must get whole heads (query and key/value)."""
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for name, value in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if isinstance(value, int) and value % tp_size:
            raise ValueError(f"tp_size={tp_size} does not divide {family}'s {name}={value}: every rank must hold "
                             f"whole heads. Pick a tp_size dividing {math.gcd(heads or value, kv_heads or value)}, "
                             "or use fsdp_size instead.")


def apply(module: torch.nn.Module, hf_model: torch.nn.Module, plan: dict[str, str],
          tp_mesh: Any) -> list[torch.nn.Module]:
    """Shard ``hf_model`` (in place) over ``tp_mesh`` with ``plan``; LoRA layers' base layers and factors too.

    ``module`` is what holds the adapters (a PeftModel, or ``hf_model`` itself); ``plan`` comes from
    :func:`resolve_plan`, made before the adapters were injected.

    Returns:
        The modules whose (replicated) parameters get only part of their gradient on each rank (Qwen3's
        per-head ``q_norm``/``k_norm``): :func:`sum_partial_grads` completes them once per optimizer step.
    """
    from peft.tuners.lora import LoraLayer
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    modules = dict(hf_model.named_modules())
    wrapped: dict[str, str] = {}
    placed: dict[str, str] = {}
    for name, style in plan.items():
        owner, _, leaf = name.rpartition(".")
        if isinstance(modules.get(name), LoraLayer):
            wrapped[name] = style
            placed[f"{name}.base_layer"] = style
        elif isinstance(modules.get(owner), LoraLayer) and name not in modules:  # a parameter of a wrapped layer
            placed[f"{owner}.base_layer.{leaf}"] = style
        else:
            placed[name] = style
    partial = [modules[n] for n, s in placed.items() if s == PARTIAL_GRAD and n in modules]
    placed = {n: s for n, s in placed.items() if s != PARTIAL_GRAD}
    aliases = _tied_aliases(hf_model)
    placed = {n: s for n, s in placed.items() if n in modules or n not in aliases}  # sharded once, by its name
    unsupported = sorted(f"{n} ({s})" for n, s in wrapped.items() if s not in LORA_STYLES)
    if unsupported:
        raise ValueError(f"LoRA on {unsupported[:3]} cannot be tensor-parallel: adapters run on "
                         f"{', '.join(LORA_STYLES)} layers only. Leave these modules out of target_modules.")
    apply_tensor_parallelism(hf_model, tp_mesh, placed)
    _retie(hf_model, aliases)
    for name, style in wrapped.items():
        if style in SHARDED_LORA_STYLES:
            _shard_adapters(modules[name], style, tp_mesh, name)
    check_sharded(hf_model, plan)
    return partial


def _tied_aliases(hf_model: torch.nn.Module) -> dict[str, str]:
    """{a tied parameter's other name: its first name} (a tied LM head: ``lm_head.weight`` -> the embedding's).

    transformers' ``apply_tensor_parallelism`` finds parameters by their first name only, and sharding one
    replaces the Parameter on its first owner; the other owners are pointed at the sharded one by
    :func:`_retie`. The embedding (vocabulary-parallel) and the head (column-parallel) shard the weight
    the same way, along the vocabulary.
    """
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in hf_model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def _retie(hf_model: torch.nn.Module, aliases: dict[str, str]) -> None:
    """Every other owner of a tied parameter holds the Parameter its first owner now holds (maybe sharded)."""
    for alias, name in aliases.items():
        owner, _, leaf = alias.rpartition(".")
        hf_model.get_submodule(owner)._parameters[leaf] = hf_model.get_parameter(name)


def sum_partial_grads(modules: list[torch.nn.Module], group: Any, params: set[int]) -> None:
    """Sum, over the tensor-parallel ``group``, the gradients of ``modules``' own parameters in ``params``.

    Called once per optimizer step, on the accumulated gradient (the sum of the micro-batches' partial
    sums: the reduction is linear). transformers' own style for these parameters all-reduces
    ``param.grad`` after every backward, which sums the earlier micro-batches again under gradient
    accumulation; a tensor hook on the parameter would not survive FSDP2, which replaces the parameters.
    Under FSDP2 x TP each gradient is this rank's FSDP shard, and the ranks of one tensor-parallel group
    hold the same shard: their local tensors are summed.
    """
    from torch.distributed.tensor import DTensor

    from twinkle import collective

    for module in modules:
        for param in module.parameters(recurse=False):
            if id(param) not in params or param.grad is None:
                continue
            grad = param.grad
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.copy_(collective.all_reduce(local, group=group))  # reduced on the communication device


def _shard_adapters(layer: Any, style: str, tp_mesh: Any, name: str) -> None:
    """peft's sharding of one LoRA layer's factors for a base layer of ``style`` (every adapter of it)."""
    from peft.tuners.lora.model import add_lora_tp_hooks_dtensor

    factors = layer.lora_B if style == "colwise" else layer.lora_A
    for adapter, factor in factors.items():
        add_lora_tp_hooks_dtensor(factor, style, tp_mesh, base_layer=layer.get_base_layer(),
                                  module_name=f"{name}.{'lora_B' if style == 'colwise' else 'lora_A'}.{adapter}")


def check_sharded(hf_model: torch.nn.Module, plan: dict[str, str]) -> None:
    """Fail loudly unless the plan's linear weights became DTensors (never a silent replication)."""
    from torch.distributed.tensor import DTensor

    sharded = sum(isinstance(p, DTensor) for p in hf_model.parameters())
    if not sharded:
        raise RuntimeError(f"tensor parallelism left every parameter replicated (plan of {len(plan)} entries, e.g. "
                           f"{sorted(plan)[:3]}); check the transformers version (>= 5.17).")


def grad_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The norm of all ``grads`` as one vector: DTensor shards reduced over their mesh, plain ones as they are.

    A plain gradient here belongs to a replicated parameter and is complete (and equal) on every rank, so
    it counts once; a DTensor's norm is its mesh-wide norm.
    """
    from torch.distributed.tensor import DTensor

    norms = []
    for grad in grads:
        norm = torch.linalg.vector_norm(grad.detach(), norm_type)
        norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).to(torch.float32))
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([n.cpu() for n in norms]), norm_type)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, norm_type: float) -> float:
    """torch's ``clip_grad_norm_`` for a mix of DTensor and plain gradients: the total norm, clipped in place."""
    grads = [p.grad for p in params if p.grad is not None]
    total = float(grad_norm(grads, norm_type))
    coefficient = max_norm / (total + 1e-6)  # torch's epsilon
    if coefficient < 1.0:
        with torch.no_grad():
            for grad in grads:
                grad.mul_(coefficient)
    return total
