"""The Backend protocol: what a model backend implements so that the core engine can train it.

The engine (:class:`twinkle.engine.Engine`) owns the training step: forward -> loss -> backward for
one or many routes, the accumulation window, the non-finite skip, clip, step, zero_grad and the lr
step. A backend (HF Transformers, Megatron-Core, a third party's) only *runs a task on a batch*
and *applies* what the engine decides; it never decides accumulation, skipping, clipping or
stepping. Every method is documented here once, as pytest's ``hookspec.py`` documents hooks; a
backend is any object with these members (no base class to inherit).

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
    #: True when :meth:`run_schedule` runs forward *and* backward itself (megatron's pipeline schedule).
    schedules: bool

    # ------------------------------------------------------------------ structure
    def parallelize(self) -> None:
        """Wrap the model for its parallel plan (DDP, FSDP2, Megatron DDP), once, after every adapter
        exists and before any optimizer is built. A no-op for a plan of one process."""

    def parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """The parameters ``group`` trains (its adapter's, its tenant slot's, or the whole model's)."""

    # ---------------------------------------------------------------- computing
    def prepare(self, batch: Mapping[str, Any], group: OptimizerGroup, options: dict[str, Any]) -> list[dict]:
        """A collated host batch made ready to run: on the device, in the backend's layout, split into the
        pieces one call runs in sequence (one piece unless the backend splits rows, e.g. ``num_microbatches``)."""

    def routed(self, routes: Sequence[Route]) -> AbstractContextManager[None]:
        """Inside the block, forwards (and gradient-checkpointing recomputes in backward) run each route's
        rows through its group's parameters only."""

    def run(self, task: str, batch: Mapping[str, Any], training: bool, options: Mapping[str, Any]) -> Any:
        """The forward of ``task`` on ``batch`` (train or eval mode), under the current routes."""

    def run_schedule(self, routes: Sequence[Route], pieces: list[dict], loss_step: Callable[..., Any]) -> tuple:
        """Only where :attr:`schedules`: run forward *and* backward of every piece with the backend's own
        schedule (megatron's pipeline); ``loss_step(batch, outputs)`` is the engine's loss for one piece.
        Returns ``(loss sum, item count)`` over all pieces, the same on every rank."""

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

    def zero_grad(self, group: OptimizerGroup) -> None:
        """Drop the group's gradients."""

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        """``flags`` maximised over every rank holding part of the model (identity on one process)."""

