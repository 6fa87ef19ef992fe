"""MegatronBackend: a megatron-core GPTModel as the core engine sees it (``twinkle.engine.ModelBackend``).

Batches take megatron's layout in :meth:`MegatronBackend.prepare`: 2-D ``input_ids``; on the
Transformer Engine path (causal by construction) no left padding or packing, checked on the host;
next-token labels shifted on the whole rows; under context parallelism rows padded and cut to this
rank's share (``parallel/context.py``); ``num_microbatches=`` (or the constructor's
``micro_batch_size``) splits the rows into the pieces one ``forward_backward`` runs in sequence.
Without Transformer Engine the attention mask carries padding, packing and the sliding window.

A forward returns this rank's vocabulary shard of the logits (``vocab_parallel.LogitsOutputs``); a
group with twinkle's ``CrossEntropyLoss`` gets the vocabulary-parallel cross-entropy. Backward runs on
loss *sums* (``sums_losses``) and the accumulation boundary divides by the window's tokens through the
group's driver (``drivers.py``: megatron-core's DistributedOptimizer on GPU, a torch stand-in on CPU).
On CUDA ``forward_backward`` runs megatron-core's forward-backward schedule (:meth:`run_schedule`),
which also covers pipeline stages; the engine's loss runs inside it.

The adapters part routes a forward: LoRA adapters (``adapters.py``) or multi-LoRA slots
(``lora/slots.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from twinkle import collective
from twinkle.engine import Route
from twinkle.model.inputs import to_device
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.model import vocab_parallel as vp
from twinkle_megatron.model.drivers import make_driver, training_module
from twinkle_megatron.optim import OptimizerParamScheduler, check_scheduler, resolve_optimizer
from twinkle_megatron.parallel import context

_NOT_ROUTED = contextlib.nullcontext()
_OPTIONS = ("num_microbatches",)


class MegatronBackend:
    """The engine's view of one rank's GPTModel (see the module docstring)."""

    sums_losses = True
    grad_multiplier = None
    needs_parallelize = False  # a forward runs before wrapping; adapters are refused after it (``adapters.add``)
    adapter_options = ()

    def __init__(self, gpt: torch.nn.Module, *, model_id: str | None, model_path: str | None, hf_config: Any,
                 args: Any, transformer_config: Any, layout: Any, sizes: Any, ranks: Any, device: torch.device,
                 precision: Any, mixed_precision: str, device_mesh: Any, use_te: bool, megatron_kwargs: Any) -> None:
        from twinkle_megatron.model.adapters import LoraAdapters

        self.gpt = gpt
        #: what a forward runs: the GPTModel, wrapped in Float16Module for bf16/fp16 on GPU once training starts
        self.module: torch.nn.Module = gpt
        self.model_id = model_id
        self.model_path = model_path
        self.hf_config = hf_config
        self.args = args
        self.transformer_config = transformer_config
        self.layout = layout
        self.sizes = sizes
        self.ranks = ranks
        self.device = device
        self.device_type = device.type
        self.precision = precision
        self.mixed_precision = mixed_precision
        self.device_mesh = device_mesh
        self.use_te = use_te
        self.megatron_kwargs = megatron_kwargs
        self.vocab_size: int = args.vocab_size
        self.adapters: Any = LoraAdapters(self)
        self.chunks: list[Any] | None = None  # Megatron DDP chunks once wrapped (GPU)
        self.group_chunks: dict[str, Any] = {}
        #: the group whose adapter the LoRA layers run (None: route again at the next forward)
        self.active_group: OptimizerGroup | None = None
        self._module: torch.nn.Module = gpt  # what the current route's forward runs
        self._autocast: Callable[[], Any] = (precision.autocast if precision.autocast_dtype is not None
                                             or precision.provider is not None else contextlib.nullcontext)
        self._several_ranks = sizes.world_size > 1
        self._default_losses = (vp.VocabParallelCrossEntropy(consume=False), vp.VocabParallelCrossEntropy(consume=True))

    # ============================================================== structure
    @property
    def schedules(self) -> bool:
        """On CUDA ``forward_backward`` runs megatron-core's schedule (pipeline stages included)."""
        return self.device_type == "cuda"

    def parallelize(self) -> None:
        """On GPU the module a forward runs becomes Float16Module (bf16/fp16) once, before the first optimizer;
        each group's Megatron-DDP chunk comes with its optimizer (``drivers.group_chunk``)."""
        if self.device_type == "cuda":
            training_module(self)

    def parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        return [p for _, p in self.adapters.named_parameters(group)]

    def freeze_base(self) -> None:
        """Only LoRA tensors train. On CPU under bf16/fp16 the frozen weights are held in that dtype (half the
        memory, as megatron holds them on GPU); the LoRA tensors stay fp32, the optimizer's master weights."""
        dtype = self.precision.autocast_dtype if self.device_type != "cuda" else None
        for name, param in self.gpt.named_parameters():
            param.requires_grad = ".lora_A." in name or ".lora_B." in name
            if dtype is not None and not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(dtype)

    # ========================================================= batches, tasks
    def pad_token_id(self, group: OptimizerGroup) -> int:
        if group.template is not None and isinstance(getattr(group.template, "pad_token_id", None), int):
            return group.template.pad_token_id
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(self.hf_config, name, None)
            if isinstance(value, int):
                return value
        return 0

    def check_task(self, task: str) -> str:
        if task != "causal_lm":
            raise MegatronConfigError(f"task={task!r}: MegatronModel runs 'causal_lm' only (GPTModel has no "
                                      "embedding-pooling head); use TransformersModel for task='embedding'.")
        return task

    def prepare(self, batch: Mapping[str, Any], group: OptimizerGroup, task: str,
                options: Mapping[str, Any]) -> list[dict[str, Any]]:
        """megatron's layout of a collated batch (see the module docstring), split into micro-batches."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"Unknown options {unknown}; MegatronModel's forward methods take inputs=, adapter_name=, "
                            "task=, gradient_accumulation_steps= and (forward_backward) num_microbatches=.")
        ids = batch.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError("MegatronModel needs 'input_ids' as a (batch, sequence) tensor.")
        if self.use_te:  # on the whole rows, still on the host: no wait for the device per micro-batch
            check_plain_causal(batch)
        batch = to_device(batch, self.device)
        labels = batch.get("labels")
        if isinstance(labels, torch.Tensor):
            batch[vp.NEXT_LABELS] = vp.next_token_labels(labels, vp.ignore_index_of(group.loss))
        sizes = self.sizes
        if sizes.cp > 1 or (sizes.sequence_parallel and sizes.tp > 1):
            batch = context.for_rank(batch, sizes.cp, self.ranks.cp, sizes.tp, sizes.sequence_parallel,
                                     self.pad_token_id(group))
        micro = options.get("num_microbatches")
        if micro is None and self.megatron_kwargs.micro_batch_size is not None:  # the constructor's setting
            micro = self.megatron_kwargs.num_microbatches(ids.shape[0])
        micro = int(micro or 1)
        return [batch] if micro == 1 else split_rows(batch, micro)

    # ============================================================== computing
    def group_module(self, group: OptimizerGroup) -> torch.nn.Module:
        """What a forward of this group runs: its Megatron-DDP chunk once it has one (GPU), else the model."""
        chunks = getattr(group.optimizer, "chunks", None)
        return chunks[0] if chunks else self.module

    def routed(self, routes: Sequence[Route]) -> contextlib.AbstractContextManager[None]:
        """The route's adapter runs (switched only when the group changes); several routes: row ranges."""
        if len(routes) == 1 and routes[0].rows is None:
            group = routes[0].group
            if group is not self.active_group:
                self.adapters.activate(group)
                self.active_group = group
            self._module = self.group_module(group)
            return _NOT_ROUTED
        return self._rows_routed(routes)

    @contextlib.contextmanager
    def _rows_routed(self, routes: Sequence[Route]) -> Iterator[None]:
        self.active_group = None
        self.adapters.route_rows(routes)
        self._module = self.module  # the shared module: every slot's DDP hooks see their own gradients
        try:
            yield
        finally:
            self.adapters.route_rows(None)

    def _logits(self, module: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        """GPTModel's forward: on the last stage this rank's vocabulary shard of the logits (never gathered)."""
        mask = None if self.use_te else attention_mask(batch, self.args.sliding_window)  # TE: causal by construction
        return module(batch["input_ids"], None, mask, runtime_gather_output=False)

    def logits_outputs(self, shard: torch.Tensor) -> vp.LogitsOutputs:
        return vp.LogitsOutputs(vp.mask_vocab_padding(shard, self.vocab_size), self.vocab_size, self.sizes.cp)

    def run(self, task: str, batch: Mapping[str, Any], training: bool, options: Mapping[str, Any]) -> Any:
        if self.sizes.pp > 1:
            raise MegatronConfigError("With pp_size > 1 the model is split over pipeline stages: use "
                                      "forward_backward (megatron's schedule) instead of forward/forward_only.")
        module = self._module
        if module.training != training:
            module.train(training)
        with self._autocast():
            return self.logits_outputs(self._logits(module, batch))

    def run_schedule(self, routes: Sequence[Route], pieces: list[dict], loss_step: Callable[..., Any]) -> tuple:
        """forward + backward of every piece through megatron-core's schedule (no pipelining or 1F1B).

        The loss runs on the last pipeline stage and returns ``(loss sum, token count, report)``: with
        ``calculate_per_token_loss`` megatron back-propagates the sum. Gradient synchronisation waits for the
        accumulation boundary (``finalize_model_grads``), so several calls accumulate.

        Returns ``(loss sum, token count)`` over every data- and context-parallel rank (the reported loss is
        the mean over all of them, as on one process) and this rank's own token count: the boundary's
        ``finalize_model_grads`` sums that over data x context ranks itself, so it must not be summed here.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        (route,) = routes
        with self.routed(routes):
            module = self._module
            module.train(True)
            self.transformer_config.grad_scale_func = getattr(route.group.optimizer, "scale_loss", None)

            def loss_func(batch: dict[str, Any], output: torch.Tensor) -> tuple:
                total, items = loss_step(batch, self.logits_outputs(output))
                items = torch.as_tensor(items, device=total.device).reshape(()).to(torch.int64)
                return total, items, {"loss": torch.stack([total.detach().float(), items.float()])}

            def forward_step(data_iterator: Iterator[dict], model: torch.nn.Module) -> tuple:
                batch = next(data_iterator)
                return self._logits(model, batch), lambda output: loss_func(batch, output)

            results = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(pieces), model=[module],
                num_microbatches=len(pieces), seq_length=pieces[0]["input_ids"].shape[1],
                micro_batch_size=pieces[0]["input_ids"].shape[0], forward_only=False,
            )
        sums = torch.zeros(2, device=self.device)
        for report in results:
            sums += report["loss"].to(sums.device)
        if self.sizes.pp > 1:  # the loss lives on the last stage
            from megatron.core import parallel_state as ps

            collective.broadcast_(sums, src=ps.get_pipeline_model_parallel_last_rank(),
                                  group=ps.get_pipeline_model_parallel_group())
        own_items = sums[1].to(torch.int64)
        total, items = self.data_sum(sums[0], sums[1])
        return total, items.to(torch.int64), own_items

    def reference_logprobs(self, routes: Sequence[Route], batch: Mapping[str, Any]) -> torch.Tensor:
        """``ref_logprobs`` of the base model without the routes' adapters (no grad, eval mode, gathered logits)."""
        from twinkle.loss.token_inputs import reference_logprobs

        if not all(r.group.is_adapter for r in routes):
            raise ValueError("The loss needs reference log-probabilities (a KL penalty or DPO) but the group trains "
                             "the full model, so the reference would be a second, frozen copy: put them in the batch "
                             "as 'ref_logprobs', or train a LoRA adapter (its reference is the base model).")
        module = self.gpt
        training = module.training
        try:
            module.train(False)
            with torch.no_grad(), self.adapters.reference(), self._autocast():
                logits = self.logits_outputs(self._logits(module, batch))["logits"]
            return reference_logprobs(batch, logits)
        finally:
            module.train(training)

    def loss_for(self, group: OptimizerGroup, task: str, consumable: bool) -> Any:
        """twinkle's CrossEntropyLoss (or none) runs vocabulary-parallel; another loss reads gathered logits."""
        loss = group.loss
        if loss is None or vp.is_default_cross_entropy(loss):
            ignore = vp.ignore_index_of(loss)
            if ignore == vp.IGNORE_INDEX:
                return self._default_losses[consumable]
            return vp.VocabParallelCrossEntropy(ignore, consume=consumable)
        if self.sizes.cp > 1:
            raise MegatronConfigError(
                f"With cp_size={self.sizes.cp} the loss is computed on each rank's part of the sequence; only the "
                f"default CrossEntropyLoss does that (got {type(loss).__name__}). Use set_loss('CrossEntropyLoss') "
                "or cp_size=1.")
        return loss

    def data_sum(self, total: torch.Tensor, items: Any) -> tuple[Any, Any]:
        """(loss sum, items) over the data- and context-parallel ranks (each CP rank holds part of every
        sequence): the loss a call returns is the mean over all of them. One all-reduce, no host sync."""
        total = total.detach()
        if self.sizes.cp * self.sizes.dp == 1:
            return total, items
        from megatron.core import parallel_state as ps

        group = ps.get_data_parallel_group(with_context_parallel=True)
        value, count = collective.sum_values([total, items], group=group).unbind()
        return value, count.to(torch.promote_types(total.dtype, torch.float32))

    def grad_sync(self, on: bool) -> None:
        """Nothing: gradients are synchronised once, on the boundary (``finish_grads``)."""

    def scale_loss(self, group: OptimizerGroup, loss: torch.Tensor) -> torch.Tensor:
        """fp16: the group's optimizer's loss scale (megatron's; the CPU stand-in has none)."""
        scale = getattr(group.optimizer, "loss_scale", None)
        return loss * scale() if scale is not None else loss

    # =============================================================== stepping
    def finish_grads(self, group: OptimizerGroup) -> None:
        """Synchronise the summed gradients and divide them by the window's tokens (every data/CP rank's)."""
        group.optimizer.finalize(group.window_items)

    def clip(self, group: OptimizerGroup, max_norm: float, norm_type: float) -> float | None:
        return group.optimizer.clip(max_norm, norm_type)

    def apply_step(self, group: OptimizerGroup) -> bool:
        """megatron-core's optimizer reports whether it updated (False: fp16 inf/NaN gradients found)."""
        return bool(group.optimizer.step())

    def skip_update(self, group: OptimizerGroup) -> None:
        """Nothing to undo: megatron's optimizer has not run."""

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        """Every rank of the model (all data, tensor and pipeline ranks) decides a skip together."""
        return collective.all_reduce(flags, op="max") if self._several_ranks else flags

    # ============================================================= components
    def add_adapter(self, name: str, config_or_dir: Any, options: dict[str, Any]) -> None:
        self.adapters.add(name, config_or_dir, options)

    def adapters_changed(self, groups: list[OptimizerGroup]) -> None:
        self.active_group = None

    def make_scaler(self) -> None:
        """megatron's optimizer scales fp16 losses itself."""
        return None

    def build_optimizer(self, group: OptimizerGroup, optimizer_cls: Any, kwargs: dict[str, Any],
                        others: Mapping[str, list[torch.nn.Parameter]]) -> Any:
        """megatron-core's distributed optimizer (``'default'`` / ``'MegatronDistributedOptimizer'``; its settings
        over the constructor's OptimizerConfig fields). On GPU the group gets its Megatron-DDP chunk here."""
        settings = resolve_optimizer(optimizer_cls, {**self.megatron_kwargs.optimizer, **kwargs})
        return make_driver(self, group, settings)

    def build_lr_scheduler(self, group: OptimizerGroup, scheduler_cls: Any, kwargs: dict[str, Any]) -> Any:
        """megatron-core's OptimizerParamScheduler (``'default'`` / ``'OptimizerParamScheduler'``)."""
        check_scheduler(scheduler_cls)
        return OptimizerParamScheduler(group.optimizer.optimizer, **kwargs)

    def patch_target(self) -> torch.nn.Module:
        """Patches apply to this rank's GPTModel."""
        return self.gpt

    def describe(self) -> list[str]:
        r = self.ranks
        return [
            f"MegatronModel: {self.args.family.architecture} ({self.model_id or 'built from config'})",
            f"  {self.device_mesh.describe()} | this rank: tp={r.tp} pp={r.pp} dp={r.dp} "
            f"| spec: {'transformer-engine' if self.use_te else 'local'} | device: {self.device} | "
            f"mixed_precision: {self.mixed_precision} | parameters on this rank: "
            f"{sum(p.numel() for p in self.gpt.parameters()):,}",
        ]

    def describe_group(self, group: OptimizerGroup) -> list[str]:
        lines = self.adapters.describe(group)
        if group.optimizer is not None:
            lines.append(f"    megatron optimizer: {group.optimizer.kind}")
        return lines


# ---------------------------------------------------------------------------- batch layout
def split_rows(batch: Mapping[str, Any], parts: int) -> list[dict[str, Any]]:
    """``parts`` micro-batches of consecutive rows (every tensor with the batch's row count is split)."""
    rows = batch["input_ids"].shape[0]
    if parts < 1 or rows % parts:
        raise MegatronConfigError(f"num_microbatches={parts} must divide the batch's {rows} rows.")
    size = rows // parts
    return [{k: v[i * size:(i + 1) * size] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == rows else v
             for k, v in batch.items()} for i in range(parts)]


def attention_mask(batch: Mapping[str, Any], sliding_window: int | None) -> torch.Tensor:
    """``[b, 1, s, s]`` bool, True where a query must not see a key.

    megatron-core applies rotary embeddings by position in the row, so padding and packing are
    expressed here: causality, the padding of ``attention_mask``, packed sequence boundaries
    (``position_ids`` restarting at 0) and a sliding window. Rotary embeddings only depend on
    distances, so within a row that is exact.
    """
    ids = batch["input_ids"]
    rows, length = ids.shape
    pos = torch.arange(length, device=ids.device)
    allowed = pos[None, :] <= pos[:, None]
    if sliding_window:
        allowed = allowed & ((pos[:, None] - pos[None, :]) < sliding_window)
    allowed = allowed.unsqueeze(0).expand(rows, length, length)
    position_ids = batch.get("position_ids")
    if isinstance(position_ids, torch.Tensor) and position_ids.shape == ids.shape:
        seg = torch.cumsum((position_ids.to(ids.device) == 0).long(), dim=1)  # a new sequence starts at position 0
        allowed = allowed & (seg[:, :, None] == seg[:, None, :])
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        allowed = allowed & mask.to(ids.device).bool()[:, None, :]
    # every query may at least see itself, so fully padded rows give finite (ignored) outputs
    allowed = allowed | torch.eye(length, dtype=torch.bool, device=ids.device)
    return ~allowed.unsqueeze(1)


def check_plain_causal(batch: Mapping[str, Any]) -> None:
    """Transformer Engine attention is causal only (it ignores explicit masks): refuse left padding and packed rows."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] > 1:
        m = mask.bool()
        if bool((~m[:, :-1] & m[:, 1:]).any()):
            raise MegatronConfigError("Left-padded rows reach Transformer Engine attention, which ignores padding "
                                      "masks; pad on the right (InputProcessor(padding_side='right')).")
    position_ids = batch.get("position_ids")
    if isinstance(position_ids, torch.Tensor) and position_ids.dim() == 2 and mask is None \
            and bool((position_ids[:, 1:] == 0).any()):
        raise MegatronConfigError("Packed rows (padding_free) need per-sequence attention, which this Transformer "
                                  "Engine path does not set up; use padded batches.")
