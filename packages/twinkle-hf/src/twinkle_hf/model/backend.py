"""HFBackend: a transformers module as the core engine sees it (``twinkle.engine.Backend``).

It runs a task on a batch (``causal_lm`` logits, pooled ``embedding`` vectors, ``fused_lm_ce`` hidden
states, see ``tasks.py``) through the adapters part -- peft adapters (:mod:`twinkle_hf.model.adapters`)
or multi-LoRA slots (:mod:`twinkle_hf.multi_lora.slots`) -- and applies what the engine decides:
finishing gradients (fp16 unscale, rescale to the window's token-weighted mean), clipping (DTensor
gradients under FSDP2), stepping torch optimizers. ``parallelize`` wraps the module once for its
plan (DDP, native FSDP2, accelerate's FSDP2; see ``twinkle_hf.distributed``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from peft import PeftModel
from torch.optim import Optimizer

from twinkle import collective
from twinkle.engine import Route
from twinkle.loss import CrossEntropyLoss, InfoNCELoss, Loss
from twinkle.loss.token_inputs import reference_logprobs
from twinkle.model.components import build_component
from twinkle.model.inputs import note_default_inputs, to_device
from twinkle.model.optimizer_group import OptimizerGroup, check_optimizer_lrs, check_optimizer_params
from twinkle.registry import resolve
from twinkle.utils.checks import check_choice
from twinkle_hf.distributed.plan import DistributedPlan
from twinkle_hf.model.optim import build_optimizer
from twinkle_hf.model.tasks import TASKS, run_task


def _fused_ce_loss() -> Loss:
    from twinkle_hf.kernels.fused_ce_loss import LigerFusedLinearCrossEntropyLoss

    return LigerFusedLinearCrossEntropyLoss()


_DEFAULT_LOSS = {"causal_lm": CrossEntropyLoss, "embedding": InfoNCELoss, "fused_lm_ce": _fused_ce_loss}
_FORWARD_OPTIONS = ("pooling",)


class HFBackend:
    """The engine's view of one transformers module (see the module docstring)."""

    sums_losses = False
    schedules = False
    adapter_options = ("vision_tower", "projector")

    def __init__(self, module: torch.nn.Module, *, model_id: str | None, model_path: str | None,
                 device: torch.device, precision: Any,
                 plan: DistributedPlan, mesh: Any, mixed_precision: str, strategy: str,
                 ddp_config: dict[str, Any], fsdp_config: dict[str, Any], grad_scaler_config: dict[str, Any],
                 weights_dir: str | None = None, memory_efficient_pending: bool = False) -> None:
        from twinkle_hf.model.adapters import PeftAdapters

        self.module = module
        self.model_id = model_id
        self.model_path = model_path
        self.device = device
        self.precision = precision
        self.autocast = precision.autocast_factory()  # decided once: nothing of it on the hot path
        self._default_losses: dict[str, Loss] = {}
        self.dist_plan = plan
        self.device_mesh = mesh
        self.mixed_precision = mixed_precision
        self.strategy = strategy
        self.ddp_config = ddp_config
        self.fsdp_config = fsdp_config
        self.grad_scaler_config = grad_scaler_config
        #: FSDP2 built on meta: every rank reads its shards from here once the model is sharded
        self.weights_dir = weights_dir
        self.memory_efficient_pending = memory_efficient_pending
        self.adapters: Any = PeftAdapters(self)
        self.wrapped = False
        self.ddp: Any = None
        self.accelerator: Any = None
        self.layer_classes: list[str] | None = None
        #: the VL lockstep part, under FSDP2 with a vision-language model (set by ``parallelize``)
        self.vision: Any = None
        #: the model's optimizer groups (the facade's), for what reads their templates
        self.groups: dict[str, OptimizerGroup] = {}
        #: tensor parallelism: transformers' plan resolved for this model (applied by ``parallelize``)
        self.tp_plan: dict[str, str] | None = None
        #: sequence parallelism: each cp rank's part of every row (set by ``build_backend`` when cp_size > 1)
        self.sequence_parallel: Any = None
        #: modules whose replicated parameters get partial gradients under TP, and the group summing them
        self.tp_partial: list[torch.nn.Module] = []
        self.tp_group: Any = None
        #: expert parallelism: transformers' plan and the experts modules it split
        self.ep_plan: dict[str, str] | None = None
        self.ep_modules: list[torch.nn.Module] = []

    # ============================================================== structure
    @property
    def needs_parallelize(self) -> bool:
        return self.dist_plan.distributed

    @property
    def grad_multiplier(self) -> int | None:
        """DDP and FSDP2 average gradients over the data ranks; the loss is scaled back by that many.

        Tensor-parallel ranks share their batch and average nothing: only the data ranks count.
        """
        plan = self.dist_plan
        return plan.data_size if plan.distributed and plan.kind != "tp" else None

    def hf_model(self) -> torch.nn.Module:
        """The transformers model underneath any peft wrapper (LoRA layers stay injected in it)."""
        module = self.module
        return module.get_base_model() if isinstance(module, PeftModel) else module

    @property
    def config(self) -> Any:
        return self.hf_model().config

    def parallelize(self) -> None:
        """Wrap the module for its plan, once (see ``twinkle_hf.distributed.wrap.parallelize``)."""
        from twinkle_hf.distributed.wrap import parallelize

        parallelize(self)
        self.wrapped = True

    def parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        return self.adapters.parameters(group)

    def materialized(self) -> bool:
        """Whether every weight exists on this rank (a meta build gets its shards in ``parallelize``)."""
        return self.weights_dir is None and not self.memory_efficient_pending

    # ========================================================= batches, tasks
    def pad_token_id(self, group: OptimizerGroup) -> int:
        """Padding id for the default processor: the template's tokenizer, else the model config, else 0."""
        if group.template is not None and isinstance(getattr(group.template, "pad_token_id", None), int):
            return group.template.pad_token_id
        config = self.config
        for value in (getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)):
            if isinstance(value, int):
                return value
        return 0

    @property
    def vocab_size(self) -> int | None:
        """Rows of the input embedding: token ids must be below it (None when the model does not say)."""
        try:
            embeddings = self.hf_model().get_input_embeddings()
        except (AttributeError, NotImplementedError):
            return None
        embeddings = getattr(embeddings, "base_layer", embeddings)  # a LoRA-wrapped embedding
        return getattr(embeddings, "num_embeddings", None)

    def check_task(self, task: str) -> str:
        return task if task in TASKS else check_choice(task, "task", TASKS)

    def prepare(self, batch: Mapping[str, Any], group: OptimizerGroup, task: str,
                options: Mapping[str, Any]) -> list[dict[str, Any]]:
        unknown = sorted(set(options) - set(_FORWARD_OPTIONS))
        if unknown:
            raise TypeError(f"Unknown forward options {unknown}; forward takes inputs=, adapter_name=, task= and "
                            f"{', '.join(_FORWARD_OPTIONS)}.")
        if self.sequence_parallel is not None:  # this rank's part of each row, labels shifted over the whole row
            batch = self.sequence_parallel.split(batch, self.loss_for(group, task, False), task)
            # a part's mask and positions are always passed: only rank 0's part would look like the defaults,
            # and every rank must run the same attention path
            return [to_device(batch, self.device)]
        moved = to_device(batch, self.device)
        note_default_inputs(batch, moved)
        return [moved]

    # ============================================================== computing
    def routed(self, routes: Sequence[Route]) -> Any:
        return self.adapters.routed(routes)

    def run(self, task: str, batch: Mapping[str, Any], training: bool, options: Mapping[str, Any]) -> Any:
        module = self.module
        if module.training != training:
            module.train(training)
        pooling = options.get("pooling")
        with self.autocast():
            if self.ddp is not None:
                return self.ddp(task, batch, pooling)
            if self.vision is not None:
                with self.vision.passes(batch):
                    return self.run_unwrapped(task, batch, pooling)
            return self.run_unwrapped(task, batch, pooling)

    def run_unwrapped(self, task: str, batch: Mapping[str, Any], pooling: str | None) -> Any:
        """The forward of ``task`` outside any DDP wrapper (what DDP's runner and the samplers call)."""
        return run_task(self.module, self.hf_model(), task, batch, pooling, through_root=self.dist_plan.sharded)

    @contextmanager
    def reference_mode(self, routes: Sequence[Route]) -> Iterator[None]:
        """The reference policy of ``routes``: the base model without their adapters."""
        with self.adapters.reference(routes):
            yield

    def reference_logprobs(self, routes: Sequence[Route], batch: Mapping[str, Any]) -> torch.Tensor:
        """``ref_logprobs`` from a no-grad, eval-mode forward of the reference policy."""
        module = self.module
        training = module.training
        try:
            module.train(False)
            with torch.no_grad(), self.reference_mode(routes), self.autocast():
                outputs = self.run_unwrapped("causal_lm", batch, None)
            return reference_logprobs(batch, outputs.logits)
        finally:
            module.train(training)

    def loss_for(self, group: OptimizerGroup, task: str, consumable: bool) -> Any:
        if group.loss is not None:
            return group.loss
        if task not in self._default_losses:
            self._default_losses[task] = _DEFAULT_LOSS[task]()
        return self._default_losses[task]

    def data_sum(self, total: torch.Tensor, items: Any) -> tuple[Any, Any]:
        """(loss sum, items) over every data rank, as tensors on the loss's device; local values on one process.

        One all-reduce and no host sync. The count comes back in the loss's float type, so dividing by it
        is the same arithmetic as on one process.
        """
        if not self.dist_plan.distributed:
            return total.detach(), items
        value, count = collective.sum_values([total, items], collective.data_group()).unbind()
        return value, count.to(torch.promote_types(total.dtype, torch.float32))

    def grad_sync(self, on: bool) -> None:
        """Which gradient communication the next backward does (see docs/distributed.md, accumulation).

        DDP all-reduces only on the backward that closes the accumulation window. FSDP2 reduce-scatters
        every micro-batch by default, so gradients stay sharded (1/N of the model per rank); HSDP then
        defers only the all-reduce across replicas to the boundary. ``fsdp_config={'sync_each_microbatch':
        False}`` keeps unsharded gradients between boundaries instead (no communication, full-size memory).
        """
        if not self.dist_plan.distributed:
            return
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = on
        elif not self.fsdp_config.get("sync_each_microbatch", True):
            self.module.set_requires_gradient_sync(on)
        elif self.dist_plan.hsdp:
            self.module.set_requires_all_reduce(on)

    def scale_loss(self, group: OptimizerGroup, loss: torch.Tensor) -> torch.Tensor:
        return group.scaler.scale(loss) if group.scaler is not None else loss

    # =============================================================== stepping
    def _optimizer_params(self, group: OptimizerGroup) -> list[torch.Tensor]:
        return [p for g in group.optimizer.param_groups for p in g["params"]]

    def finish_grads(self, group: OptimizerGroup) -> None:
        """Unscale (fp16) and turn summed gradients into the token-weighted mean."""
        if self.ep_modules:  # each expert's gradient holds every EP rank's tokens, averaged over its replicas
            from twinkle_hf.distributed.expert_parallel import finish_expert_grads

            finish_expert_grads(self.ep_modules, self.dist_plan.ep_size, {id(p) for p in self._optimizer_params(group)})
        if self.tp_partial:  # per-head norms: each tensor-parallel rank holds part of the gradient
            from twinkle_hf.distributed.tensor_parallel import sum_partial_grads

            sum_partial_grads(self.tp_partial, self.tp_group, {id(p) for p in self._optimizer_params(group)})
        if group.scaler is not None:
            group.scaler.unscale_(group.optimizer)
            self._agree_found_inf(group)
        factor = group.grad_rescale()
        if factor is not None:
            grads = [p.grad for p in self._optimizer_params(group) if p.grad is not None]
            # tensor/expert parallelism mixes plain gradients and DTensors of several meshes (FSDP2 x TP: the
            # fsdp dimension and the 2-D mesh), which one foreach call refuses
            kinds: dict[Any, list[torch.Tensor]] = {}
            for grad in grads:
                kinds.setdefault((type(grad), getattr(grad, "device_mesh", None)), []).append(grad)
            for same in kinds.values():
                torch._foreach_mul_(same, factor)

    def _agree_found_inf(self, group: OptimizerGroup) -> None:
        """fp16: every rank's scaler sees an inf/NaN that any rank's gradient shard holds.

        Under FSDP2 each rank unscales only its own shards; without this one rank could skip a step
        that the others take (and the scales drift apart).
        """
        found = _found_inf(group)
        local = torch.stack([t.reshape(()).to(torch.float32) for t in found.values()]).max() if found \
            else torch.zeros(())
        agreed = self.agree(local)  # every rank takes part, even one without gradients
        for flag in found.values():
            flag.copy_(agreed.to(flag.device))

    def clip(self, group: OptimizerGroup, max_norm: float, norm_type: float) -> float:
        params = [p for p in self._optimizer_params(group) if p.grad is not None]
        # TP/EP: DTensor gradients of several meshes and plain ones in one norm (torch's refuses the mix)
        if self.dist_plan.tensor_parallel or self.dist_plan.expert_parallel:
            from twinkle_hf.distributed.tensor_parallel import clip_grad_norm

            return clip_grad_norm(params, max_norm, norm_type)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        # FSDP2: gradients are DTensor shards and the norm a DTensor over all of them (the same on every rank)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def apply_step(self, group: OptimizerGroup) -> bool:
        if group.scaler is None:
            group.optimizer.step()
            ok = True
        else:
            overflow = any(bool(t.item()) for t in _found_inf(group).values())
            group.scaler.step(group.optimizer)  # skips the update itself on overflow
            group.scaler.update()
            ok = not overflow
        self.adapters.after_step(group)
        return ok

    def skip_update(self, group: OptimizerGroup) -> None:
        if group.scaler is not None and _found_inf(group):  # back off the loss scale if the gradients overflowed
            group.scaler.update()

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        return collective.all_reduce(flags, op="max") if self.dist_plan.distributed else flags

    # ============================================================= components
    def make_scaler(self) -> Any:
        """A group's own GradScaler under fp16 (None otherwise)."""
        return self.precision.make_grad_scaler(self.grad_scaler_config)

    def build_optimizer(self, group: OptimizerGroup, optimizer_cls: Any, kwargs: dict[str, Any],
                        others: Mapping[str, list[torch.nn.Parameter]]) -> Optimizer:
        """A torch optimizer over the group's parameters (``'AdamW'``, ``'Muon'``, a class or instance;
        ``'default'``: AdamW). Muon takes the hidden 2-D matrices and an AdamW partner the rest."""
        resolved = resolve("optimizer", "AdamW" if optimizer_cls == "default" else optimizer_cls)
        if isinstance(resolved, Optimizer):
            if kwargs:
                raise TypeError(f"set_optimizer got an optimizer instance and arguments {sorted(kwargs)}; "
                                "pass the class or its name to construct it with arguments.")
            check_optimizer_lrs(resolved)
            check_optimizer_params(resolved, self.parameters(group), group.name, others)
            return resolved
        if isinstance(resolved, type) and issubclass(resolved, Optimizer):
            keep = set() if group.is_adapter else self._embedding_parameter_ids()
            return build_optimizer(resolved, self.parameters(group), kwargs, keep_on_adamw=keep)
        raise TypeError(f"set_optimizer needs a torch.optim.Optimizer class, instance or registered name; got "
                        f"{resolved!r}.")

    def _embedding_parameter_ids(self) -> set[int]:
        """ids of the input embedding and output head weights (kept off Muon)."""
        hf = self.hf_model()
        ids = set()
        for getter in ("get_input_embeddings", "get_output_embeddings"):
            module = getattr(hf, getter, lambda: None)()
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.nn.Parameter):
                ids.add(id(weight))
        return ids

    def build_lr_scheduler(self, group: OptimizerGroup, scheduler_cls: Any, kwargs: dict[str, Any]) -> Any:
        resolved = resolve("lr_scheduler", scheduler_cls)
        if isinstance(resolved, type):
            return build_component("lr_scheduler", resolved, kwargs, group.optimizer)
        if kwargs:
            raise TypeError("set_lr_scheduler got a scheduler instance and construction arguments "
                            f"{sorted(kwargs)}; pass the class or its name instead.")
        if getattr(resolved, "optimizer", None) is not group.optimizer:
            raise ValueError(f"The scheduler instance is bound to another optimizer than group {group.name!r}'s.")
        return resolved

    def add_adapter(self, name: str, config_or_dir: Any, options: dict[str, Any]) -> None:
        self.adapters.add(name, config_or_dir, options)

    def adapters_changed(self, groups: list[OptimizerGroup]) -> None:
        self.adapters.added(groups[-1].name, groups)

    def patch_target(self) -> torch.nn.Module:
        return self.module

    # ================================================================ summary
    def describe(self) -> list[str]:
        plan = self.dist_plan
        lines = [f"TransformersModel: {type(self.hf_model()).__name__} ({self.model_id or 'built from config'})",
                 f"  parameters: {sum(p.numel() for p in self.module.parameters()):,} | device: {self.device} | "
                 f"mixed_precision: {self.mixed_precision} | strategy: {self.strategy}"]
        if plan.distributed:
            lines.append(f"  distributed: {plan.kind} over {plan.world_size} ranks (dp={plan.dp_size}, "
                         f"fsdp={plan.fsdp_size}, tp={plan.tp_size}{', HSDP' if plan.hsdp else ''}"
                         f"{self._sequence_note()}); "
                         f"wrapped: {self.wrapped}")
        return lines

    def _sequence_note(self) -> str:
        """The sequence split, whose cp ranks the plan above counts among its data ranks."""
        sp = self.sequence_parallel
        return f"; rows split over cp={sp.size} ranks of them ({sp.inner} attention)" if sp is not None else ""

    def describe_group(self, group: OptimizerGroup) -> list[str]:
        return self.adapters.describe(group)


def _found_inf(group: OptimizerGroup) -> dict[Any, torch.Tensor]:
    """The scaler's inf/NaN flags per device, recorded by ``unscale_`` for the group's optimizer."""
    return group.scaler._found_inf_per_device(group.optimizer)
