"""Expert parallelism for TransformersModel: transformers' own ``ep_plan``, under FSDP2 for everything else.

The plan is the model's (``config.base_model_ep_plan``: each MoE layer's fused 3-D expert weights
``grouped_gemm``-sharded by expert, the experts module ``ep_dispatch_experts``), applied with transformers'
``apply_expert_parallelism`` on the ``ep`` dimension of a torch mesh: each of the ``ep_size`` ranks keeps
``num_experts / ep_size`` whole experts (a DTensor ``Shard(0)``), and its experts module exchanges the
(token, expert) pairs with transformers' ``AllToAllEP`` (two ``all_to_all_single`` per layer, differentiable;
gloo runs them on CPU). The router, attention, shared experts, embeddings and head are data-parallel:
``fully_shard`` over the data ranks, as without EP.

Gradients and FSDP2. Every rank's loss is scaled by the data size (FSDP2 averages the dense gradients over
the data ranks), and the backward all-to-all brings each expert the gradient of every rank's tokens routed
to it. Each experts module is its own FSDP2 unit over the ranks holding the same experts (the data ranks /
ep_size: ``fully_shard`` over the ``ep_replicate`` dimension of an ``(ep_replicate, ep)`` mesh, the expert
weights sharded across them), whose reduce-scatter averages over those replicas; :func:`finish_expert_grads`
divides by ``ep_size`` as well, once per optimizer step: the whole data size in all. (torchtitan sets FSDP2's
gradient divide factor to the data size instead: a PREMUL_SUM reduce-scatter, which gloo does not run.)
"""

from __future__ import annotations

from typing import Any

import torch

#: the experts module style that exchanges tokens: transformers' all-to-all implementation (training needs it)
EP_IMPLEMENTATION = "all_to_all"


def _family(hf_model: torch.nn.Module) -> str:
    return getattr(getattr(hf_model, "config", None), "model_type", None) or type(hf_model).__name__


def resolve_plan(hf_model: torch.nn.Module, ep_size: int) -> dict[str, str]:
    """transformers' expert-parallel plan of ``hf_model`` for ``ep_size`` ranks, one concrete name per entry.

    Args:
        hf_model: the transformers model, before any adapter is injected.
        ep_size: the number of expert-parallel ranks.

    Returns:
        ``{module or parameter name: style}``. Raises ``ValueError`` naming the family, ``ep_size`` and the fix
        when the model has no experts plan or its experts do not split over ``ep_size``.
    """
    from transformers.distributed import DistributedConfig

    family = _family(hf_model)
    if not callable(getattr(hf_model, "_resolve_parallel_plans", None)):
        raise ValueError(f"ep_size={ep_size}: {type(hf_model).__name__} ({family}) is not a transformers "
                         "PreTrainedModel with an expert-parallel plan; use fsdp_size instead of ep_size.")
    try:  # the sizes only select which plans are resolved (fsdp_size: DistributedConfig's divisibility check)
        _, plan, _ = hf_model._resolve_parallel_plans(DistributedConfig(ep_size=ep_size, fsdp_size=ep_size))
    except ValueError as exc:
        raise ValueError(f"ep_size={ep_size}: the {family} model {type(hf_model).__name__} has no usable "
                         f"expert-parallel plan ({exc}). It is not a mixture-of-experts model transformers can "
                         f"split by expert: use fsdp_size={ep_size} instead of ep_size.") from exc
    modules = dict(hf_model.named_modules())
    for name, style in plan.items():
        experts = getattr(modules.get(name), "num_experts", None)
        if style == "ep_dispatch_experts" and isinstance(experts, int) and experts % ep_size:
            raise ValueError(f"ep_size={ep_size} does not divide {family}'s {experts} experts ({name}): every rank "
                             f"must hold whole experts. Pick an ep_size dividing {experts}.")
    return plan


def check_adapters(hf_model: torch.nn.Module, plan: dict[str, str]) -> None:
    """LoRA on the expert weights is not sharded by expert: refused naming the modules and the fix."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    modules = dict(hf_model.named_modules())
    wrapped = sorted(n for n, m in modules.items() if isinstance(m, BaseTunerLayer)
                     and any(n == e or n.startswith(f"{e}.") for e in plan))
    if wrapped:
        raise ValueError(f"LoRA on the expert weights {wrapped[:3]} ({_family(hf_model)}) is not built with "
                         "ep_size > 1: leave the experts out of target_modules/target_parameters (adapters on "
                         "attention and the shared experts train), or use fsdp_size instead of ep_size.")


def apply(hf_model: torch.nn.Module, plan: dict[str, str], ep_mesh: Any, tp_mesh: Any) -> list[torch.nn.Module]:
    """Shard the experts of ``hf_model`` over ``ep_mesh`` (in place); the experts modules it split.

    ``tp_mesh`` is transformers' group of ranks sharing one batch: of size 1 here (no TP with EP).
    """
    from torch.distributed.tensor import DTensor
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    check_adapters(hf_model, plan)
    apply_expert_parallelism(hf_model, ep_mesh, tp_mesh, plan, ep_implementation=EP_IMPLEMENTATION)
    params = dict(hf_model.named_parameters())
    if not any(isinstance(params.get(n), DTensor) for n in plan):
        raise RuntimeError(f"expert parallelism left every expert weight replicated (plan of {len(plan)} entries, "
                           f"e.g. {sorted(plan)[:2]}); check the transformers version (>= 5.21).")
    modules = dict(hf_model.named_modules())
    return [modules[n] for n, style in plan.items() if style == "ep_dispatch_experts"]


def finish_expert_grads(modules: list[torch.nn.Module], ep_size: int, group: set[int]) -> None:
    """Divide the gradients of the experts modules' own weights in ``group`` by ``ep_size`` (see above)."""
    grads = [p.grad for m in modules for p in m.parameters(recurse=False) if id(p) in group and p.grad is not None]
    for grad in grads:
        grad.div_(ep_size)


def expert_bytes(model: torch.nn.Module, plan: dict[str, str]) -> int:
    """Bytes of the expert weights this rank holds (a DTensor's local shard only)."""
    params = dict(model.named_parameters())
    total = 0
    for name in plan:
        param = params.get(name)
        if param is not None:
            local = param.to_local() if hasattr(param, "to_local") else param
            total += local.numel() * local.element_size()
    return total
