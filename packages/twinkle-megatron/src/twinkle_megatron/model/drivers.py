"""What a group's ``optimizer`` is: megatron-core's distributed optimizer (GPU) or the CPU stand-in.

Both drivers share one gradient contract: backward runs on the *sum* of per-token losses
(megatron's ``calculate_per_token_loss``), and on the accumulation boundary :meth:`finalize`
divides by the number of tokens of the whole window (all data- and context-parallel ranks
together, through ``finalize_model_grads`` on GPU), giving the token-weighted mean gradient
(docs/megatron.md). On GPU a step prepares the gradients exactly once (megatron's ``prepare_grads``:
copy to the main grads, unscale, check for inf/NaN, update the fp16 loss scale); ``clip`` computes the
norm once and clips, and ``step`` runs ``step_with_ready_grads`` (megatron's ``step()`` would prepare
again). Every group has its own driver, so several adapters (multi-LoRA tenants) train interleaved
with their own optimizer state. A driver is the group's ``optimizer`` as the core engine sees it:
``param_groups`` (lr and the other hyper-parameters) and ``zero_grad(set_to_none=True)``; the backend
calls the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from twinkle import collective
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.optim import MegatronDistributedOptimizer


class Driver:
    """What every driver shows of its optimizer: the hyper-parameters (``param_groups``) and the current lr."""

    optimizer: Any

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups


class TorchDriver(Driver):
    """CPU stand-in: torch AdamW over this rank's shards, with megatron's parameter groups and gradient rules.

    What megatron's DDP, ``finalize_model_grads`` and ``clip_grads`` do on GPU, done with
    twinkle's collectives: gradients of replicated parameters that only see part of the data on
    each TP rank (q/k layer norms, sequence-parallel norms) are summed over TP; all gradients are
    summed over data- and context-parallel ranks and divided by the tokens of the whole window
    there; the norm counts every shard once (TP duplicates on TP rank 0 only) and is reduced over
    the model-parallel group, so every rank clips by the same factor.
    """

    kind = "torch AdamW stand-in (CPU only)"

    def __init__(self, optimizer: torch.optim.Optimizer, named: list[tuple[str, torch.nn.Parameter]],
                 config: Any) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        self.optimizer = optimizer
        self.params = [p for _, p in named]
        self.tp_summed = [p for n, p in named if needs_tp_sum(n, p, config)]
        self.norm_params = [p for p in self.params if param_is_not_tensor_parallel_duplicate(p)]
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.data_group = ps.get_data_parallel_group(with_context_parallel=True)
        self.model_group = ps.get_model_parallel_group()
        # whether each group spans several processes (asked once, not per step)
        self.tp_parallel = collective.active(self.tp_group)
        self.data_parallel = collective.active(self.data_group)
        self.model_parallel = collective.active(self.model_group)

    def finalize(self, num_tokens: Any) -> None:
        if self.tp_parallel:
            _all_reduce_grads(self.tp_summed, self.tp_group)
        tokens = num_tokens
        if self.data_parallel:
            _all_reduce_grads(self.params, self.data_group)
            tokens = collective.sum_values([num_tokens], group=self.data_group)[0]
        tokens = float(tokens)
        grads = [p.grad for p in self.params if p.grad is not None]
        if tokens > 0 and grads:
            torch._foreach_mul_(grads, 1.0 / tokens)

    def clip(self, max_norm: float, norm_type: float) -> float:
        norm_type = float(norm_type)
        grads = [p.grad for p in self.norm_params if p.grad is not None]
        local = torch.nn.utils.get_total_norm(grads, norm_type) if grads else torch.zeros(())
        if self.model_parallel:
            if norm_type == math.inf:
                local = collective.all_reduce(local, op="max", group=self.model_group)
            else:
                local = collective.all_reduce(local.double() ** norm_type, group=self.model_group) ** (1 / norm_type)
        total = local.float()
        torch.nn.utils.clip_grads_with_norm_([p for p in self.params if p.grad is not None], max_norm, total)
        return float(total)

    def step(self) -> bool:
        self.optimizer.step()
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def needs_tp_sum(name: str, param: torch.nn.Parameter, config: Any) -> bool:
    """Replicated gradients that are partial per TP rank (megatron: _allreduce_non_tensor_model_parallel_grads)."""
    return bool((config.sequence_parallel and getattr(param, "sequence_parallel", False))
                or (config.qk_layernorm and ("q_layernorm" in name or "k_layernorm" in name)))


def _all_reduce_grads(params: list[torch.nn.Parameter], group: Any) -> None:
    """Sum the gradients of ``params`` over ``group`` in one flat all-reduce (missing gradients count as zero)."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    reduced = collective.all_reduce(_flatten_dense_tensors(grads), group=group)
    for grad, value in zip(grads, _unflatten_dense_tensors(reduced, grads)):
        grad.copy_(value)


class MegatronDriver(Driver):
    """megatron-core's DistributedOptimizer over the group's own Megatron-DDP chunk (GPU).

    ``params`` are the parameters of that chunk: while megatron collects "the trainable
    parameters" (finalize_model_grads' TP reductions) only they are trainable, so a group never
    touches another group's gradients.
    """

    kind = "megatron-core DistributedOptimizer"

    def __init__(self, optimizer: Any, chunks: list[Any], params: list[torch.nn.Parameter]) -> None:
        self.optimizer = optimizer
        self.chunks = chunks
        self.params = params
        self.scale_loss = optimizer.scale_loss  # the schedule scales this group's loss with it (fp16)
        self._found_inf: bool | None = None  # prepare_grads' answer for the step under way (None: not prepared)


    def finalize(self, num_tokens: Any) -> None:
        from megatron.core.distributed import finalize_model_grads

        self._found_inf = None  # a new window's gradients: not prepared yet
        tokens = torch.as_tensor(num_tokens, device=torch.cuda.current_device()).reshape(()).to(torch.int64)
        with only_trainable(self.chunks[0].module, self.params):
            finalize_model_grads(self.chunks, num_tokens=tokens)

    def _prepare(self) -> bool:
        """megatron's prepare_grads, once per step (it updates the fp16 loss scale); True: inf/NaN found."""
        if self._found_inf is None:
            self._found_inf = bool(self.optimizer.prepare_grads())
        return self._found_inf

    def clip(self, max_norm: float, norm_type: float) -> float | None:
        """The norm of the prepared gradients (one reduction), clipped to ``max_norm`` as megatron's step would."""
        from megatron.core.optimizer import clip_grads

        if norm_type != 2:
            raise MegatronConfigError(f"norm_type={norm_type}: megatron-core's optimizer clips by the L2 norm only.")
        if self._prepare():  # found inf/nan (fp16): the step will be skipped
            return None
        norm = self.optimizer.get_grad_norm()
        subs = getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]
        for sub in subs if max_norm > 0 else ():  # as ChainedOptimizer.step clips each by the total norm
            params = [] if getattr(sub, "is_stub_optimizer", False) else sub.get_parameters()
            if params:
                clip_grads.clip_grad_by_total_norm_fp32(
                    params, max_norm=max_norm, total_norm=norm,
                    use_decoupled_grad=sub.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)
        return float(norm)

    def step(self) -> bool:
        """Apply the prepared (and, when clip ran, clipped) gradients; False: fp16 overflow, nothing changed."""
        try:
            return False if self._prepare() else bool(self.optimizer.step_with_ready_grads())
        finally:
            self._found_inf = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._found_inf = None  # a skipped step (inf/NaN loss) prepared but never stepped
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def loss_scale(self) -> Any:
        return self.optimizer.get_loss_scale()


def ddp_settings(backend: Any) -> dict[str, Any]:
    """Megatron DDP's settings: twinkle's defaults under the DistributedDataParallelConfig kwargs of the model."""
    return {"grad_reduce_in_fp32": True, "overlap_grad_reduce": False, "use_distributed_optimizer": True,
            **backend.megatron_kwargs.ddp}


@contextmanager
def only_trainable(module: torch.nn.Module, params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Within the block only ``params`` require grad (megatron's DDP and optimizer take "every trainable one")."""
    keep = {id(p) for p in params}
    others = [p for p in module.parameters() if p.requires_grad and id(p) not in keep]
    for p in others:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in others:
            p.requires_grad_(True)


def training_module(backend: Any) -> torch.nn.Module:
    """What every group's forward runs through once training starts: Float16Module for bf16/fp16 (made once)."""
    from megatron.core.transformer.module import Float16Module

    if backend.chunks is None:
        config = backend.transformer_config
        backend.module = Float16Module(config, backend.gpt) if (config.bf16 or config.fp16) else backend.gpt
        backend.chunks, backend.group_chunks = [], {}
    return backend.module


def group_chunk(backend: Any, group: OptimizerGroup, params: list[torch.nn.Parameter]) -> Any:
    """The group's Megatron DDP around the shared module, with buffers for ``params`` only (kept per group name).

    Several groups (adapters, multi-LoRA slots) each get their own gradient buffers and so their own
    distributed optimizer; a slot's chunk outlives its tenant and serves the next one.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    module = training_module(backend)
    chunk = backend.group_chunks.get(group.name)
    if chunk is None:
        ddp_config = DistributedDataParallelConfig(**ddp_settings(backend))
        with only_trainable(module, params):
            chunk = DistributedDataParallel(backend.transformer_config, ddp_config, module)
        backend.group_chunks[group.name] = chunk
        backend.chunks.append(chunk)
    chunk.zero_grad_buffer()  # nothing left over from an earlier tenant of this slot
    return chunk


def make_driver(backend: Any, group: OptimizerGroup, settings: MegatronDistributedOptimizer) -> Any:
    """Build the group's optimizer; on GPU the group gets its Megatron-DDP chunk the first time."""
    named = backend.adapters.named_parameters(group)
    if not named:
        raise MegatronConfigError(f"Group {group.name!r} has no trainable parameters; nothing to optimize.")
    if backend.device_type != "cuda":
        return TorchDriver(settings.cpu_standin(named), named, backend.transformer_config)
    from megatron.core.optimizer import get_megatron_optimizer

    params = backend.adapters.ddp_parameters(group)
    chunk = group_chunk(backend, group, params)
    with only_trainable(chunk.module, params):
        optimizer = get_megatron_optimizer(settings.config(backend.mixed_precision), [chunk])
    return MegatronDriver(optimizer, [chunk], params)
