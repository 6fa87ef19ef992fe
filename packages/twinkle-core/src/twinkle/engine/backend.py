"""The backend protocols: what a model backend implements so that the core engine (:class:`Backend`)
and a model facade (:class:`ModelBackend`) can train it.

The engine (:class:`twinkle.engine.Engine`) owns the training step: forward -> loss -> backward for
one or many routes, the accumulation window, the non-finite skip, clip, step, zero_grad and the lr
step. A backend (HF Transformers, Megatron-Core, a third party's) only *runs a task on a batch*
and *applies* what the engine decides; it never decides accumulation, skipping, clipping or
stepping. Every member is documented here once, as pytest's ``hookspec.py`` documents hooks; a
backend is any object with these members (no base class to inherit). A group's optimizer is the
backend's (``build_optimizer``): the engine calls its ``zero_grad(set_to_none=True)`` and reads its
``param_groups``; its lr scheduler's ``step()``.

A *route* (:class:`twinkle.engine.Route`) says which rows of a batch go through which group's
parameters: a single adapter is one route over every row; a batched multi-tenant step is several
routes over row ranges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from twinkle.engine.engine import Route
    from twinkle.model.optimizer_group import OptimizerGroup


class Backend(Protocol):
    """What the engine needs of a backend (see the module docstring)."""

    #: Loss convention. True: backward runs on loss *sums* and :meth:`finish_grads` divides by the
    #: window's items (Megatron's ``calculate_per_token_loss``). False: each micro-batch's loss is
    #: divided by the window's first micro-batch items before backward, and :meth:`finish_grads`
    #: rescales by ``group.grad_rescale()`` (fp16-friendly magnitudes).
    sums_losses: bool
    #: Multiplies each loss before backward (the data-parallel size when the wrapper averages
    #: gradients over ranks, as DDP and FSDP2 do); None for none.
    grad_multiplier: int | None
    #: True when :meth:`run_schedule` runs forward *and* backward itself (megatron's pipeline schedule) for a call
    #: with one route; several routes run the engine's own forward/backward through :meth:`run`.
    schedules: bool

    # ------------------------------------------------------------------ structure
    def parallelize(self) -> None:
        """Wrap the model for its parallel plan (DDP, FSDP2, Megatron DDP), once, after every adapter
        exists and before any optimizer is built. A no-op for a plan of one process."""

    def parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """The parameters ``group`` trains (its adapter's, its tenant slot's, or the whole model's)."""

    # ---------------------------------------------------------------- computing
    def prepare(self, batch: Mapping[str, Any], group: OptimizerGroup, task: str,
                options: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A collated host batch made ready to run: on the device, in the backend's layout, split into the
        pieces one call runs in sequence (one piece unless the backend splits rows, e.g. ``num_microbatches``).
        Unknown ``options`` (forward keywords beside inputs/adapter_name/task) are refused here."""

    def routed(self, routes: Sequence[Route]) -> AbstractContextManager[None]:
        """Inside the block, forwards (and gradient-checkpointing recomputes in backward) run each route's
        rows through its group's parameters only."""

    def run(self, task: str, batch: Mapping[str, Any], training: bool, options: Mapping[str, Any]) -> Any:
        """The forward of ``task`` on ``batch`` (train or eval mode), under the current routes."""

    def run_schedule(self, routes: Sequence[Route], pieces: list[dict], loss_step: Callable[..., Any]) -> tuple:
        """Only where :attr:`schedules`: run forward *and* backward of every piece with the backend's own
        schedule (megatron's pipeline); ``loss_step(batch, outputs)`` is the engine's loss for one piece.
        Returns ``(loss sum, item count, own items)``: the first two over all pieces and every data rank (the
        same on every rank: the call's reported loss), the third this rank's items, what the window's
        :meth:`finish_grads` divides by (after its own reduction over the data ranks)."""

    def reference_logprobs(self, routes: Sequence[Route], batch: Mapping[str, Any]) -> torch.Tensor:
        """``ref_logprobs`` of ``batch`` under the reference policy (the base model without the routes'
        adapters), from a no-grad eval forward."""

    def loss_for(self, group: OptimizerGroup, task: str, consumable: bool) -> Any:
        """The loss applied to ``group``'s outputs: its own loss, or the backend's default for ``task``.
        ``consumable``: the engine owns the outputs and drops them after the loss (a kernel may reuse their
        memory); False when the caller still holds them (``forward`` then ``calculate_loss``)."""

    def data_sum(self, total: torch.Tensor, items: Any) -> tuple[Any, Any]:
        """``(loss sum, item count)`` summed over the ranks that saw different data (identity on one)."""

    def grad_sync(self, on: bool) -> None:
        """Whether the next backward communicates gradients (off inside an accumulation window)."""

    def scale_loss(self, group: OptimizerGroup, loss: torch.Tensor) -> torch.Tensor:
        """The loss as back-propagated: fp16 loss scaling applied (the identity otherwise)."""

    # ----------------------------------------------------------------- stepping
    def finish_grads(self, group: OptimizerGroup) -> None:
        """Once per boundary: make the accumulated gradients the window's token-weighted mean (unscale fp16,
        synchronise, rescale or divide)."""

    def clip(self, group: OptimizerGroup, max_norm: float, norm_type: float) -> float | None:
        """Clip the finished gradients; return the total norm before clipping."""

    def apply_step(self, group: OptimizerGroup) -> bool:
        """Run the optimizer; False when it refused the update itself (fp16 overflow)."""

    def skip_update(self, group: OptimizerGroup) -> None:
        """The engine skips this step (inf/NaN): what must still happen (an fp16 scaler backs off)."""

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        """``flags`` maximised over every rank holding part of the model (identity on one process)."""


class ModelBackend(Backend, Protocol):
    """What a model facade (``twinkle.model.facade.ModelFacade``) needs beside the engine's :class:`Backend`:
    building groups, their components and adapters, and describing the model."""

    #: True when the plan spans several processes, so a forward needs :meth:`parallelize` first.
    needs_parallelize: bool
    #: The torch module a forward runs (``model.model``); this process's device.
    module: torch.nn.Module
    device: torch.device
    #: The token-id bound of collation (None: unchecked).
    vocab_size: int | None
    #: Extra keyword options ``add_adapter_to_model`` takes on this backend (beside gradient_accumulation_steps).
    adapter_options: tuple[str, ...]

    def pad_token_id(self, group: OptimizerGroup) -> int:
        """The id collation pads ``group``'s rows with."""

    def check_task(self, task: str) -> str:
        """``task`` if this backend runs it, else a ValueError naming the tasks it runs."""

    def add_adapter(self, name: str, config_or_dir: Any, options: dict[str, Any]) -> None:
        """Inject adapter ``name`` (a LoRA config or a saved adapter directory); everything checked first."""

    def adapters_changed(self, groups: list[OptimizerGroup]) -> None:
        """After an adapter joined (the last of ``groups``): activate it, freeze/cast what it does not train."""

    def make_scaler(self) -> Any:
        """A new group's fp16 loss scaler (None when the backend scales otherwise or not at all)."""

    def build_optimizer(self, group: OptimizerGroup, optimizer_cls: Any, kwargs: dict[str, Any],
                        others: Mapping[str, list[torch.nn.Parameter]]) -> Any:
        """The group's optimizer (``'default'``: the backend's own). Its ``param_groups`` hold ``lr`` and the
        other hyper-parameters; ``others`` are the other groups' parameters, which it must not hold."""

    def build_lr_scheduler(self, group: OptimizerGroup, scheduler_cls: Any, kwargs: dict[str, Any]) -> Any:
        """The group's lr scheduler; the engine calls its ``step()`` once per optimizer step."""

    def patch_target(self) -> torch.nn.Module:
        """The module ``apply_patch`` changes."""

    def describe(self) -> list[str]:
        """``get_train_configs``' header lines (architecture, precision, parallel plan)."""

    def describe_group(self, group: OptimizerGroup) -> list[str]:
        """``get_train_configs``' lines about a group's adapter."""
