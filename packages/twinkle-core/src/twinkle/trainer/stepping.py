"""One optimizer step of the Trainer: the window of micro-batches (split into intra-layer sub-batches), then
what happens between the last backward and the update: health check, internal metrics, probers, clipping
(in ``grad_norm_dtype``), ``skip_grad_norm_threshold``, the step.

Without any of those options a step is ``forward_backward`` per micro-batch and one ``clip_grad_and_step``,
exactly as a hand-written loop does; the options take the same calls apart (``clip_grad_norm``, ``step``,
``zero_grad``, ``lr_step``), which the engine composes identically.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from twinkle.log import get_logger

logger = get_logger()


def split_rows(batch: Any, parts: int) -> list[Any]:
    """``batch`` (a list of rows) as ``parts`` consecutive sub-batches of near-equal size."""
    if parts == 1:
        return [batch]
    rows = list(batch)
    size, extra = divmod(len(rows), parts)
    out, start = [], 0
    for index in range(parts):
        stop = start + size + (1 if index < extra else 0)
        out.append(rows[start:stop])
        start = stop
    return [piece for piece in out if piece]


class StepTools:
    """The Trainer's step, with the options that act between backward and update (see module docstring)."""

    def __init__(self, trainer: Any, model: Any, group: Any, total: int) -> None:
        cfg = trainer.config
        self.trainer, self.model, self.group, self.total, self.cfg = trainer, model, group, total, cfg
        self.adapter = trainer.adapter
        self.max_norm = cfg.optimizer.max_grad_norm if cfg.do_clip else math.inf  # inf: the norm, no scaling
        self.last_piece: Any = None
        self.consecutive_skips = 0
        self.probers = None
        if cfg.prober_list:
            from twinkle.trainer.probes import ProberSet

            self.probers = ProberSet(cfg.prober_list, model.model, trainer.log_dir / "probes", cfg.profile_steps,
                                     trainer.is_main)
        self.internal = None
        if cfg.internal_metrics.internal_metrics_interval:
            from twinkle.trainer.internal_metrics import Recorder

            self.internal = Recorder(cfg.internal_metrics, model, total)
        self.debug_hooks = None
        if cfg.debug:
            from twinkle.trainer.health import NonFiniteOutputs

            self.debug_hooks = NonFiniteOutputs(model.model)

    # ------------------------------------------------------------------ window
    @contextlib.contextmanager
    def probing(self, step: int) -> Iterator[None]:
        if self.probers is None:
            yield
            return
        with self.probers.step(step):
            yield

    def run_window(self, loader: Any, window: int) -> int:
        """forward_backward every (sub-)batch until the window holds ``window`` of them; the loader batches used."""
        cfg, model, group = self.cfg, self.model, self.group
        batches = 0
        if self.debug_hooks is not None:
            self.debug_hooks.first = None
        for batch in loader:
            for piece in split_rows(batch, cfg.intra_layer_micro_batch):
                try:
                    model.forward_backward(inputs=piece, adapter_name=self.adapter, task=self.trainer.task,
                                           gradient_accumulation_steps=window)
                except RuntimeError as exc:
                    if self.debug_hooks is None:
                        raise
                    from twinkle.errors import TwinkleError

                    where = self.debug_hooks.first or "no module (the forward outputs were finite)"
                    raise TwinkleError(f"debug: anomaly detection stopped step {group.cur_step + 1}: {exc} The first "
                                       f"non-finite forward output came from {where}.") from exc
                self.last_piece = piece
            batches += 1
            if group.micro_step >= window:
                break
        return batches

    # -------------------------------------------------------------- boundary
    def _split_path(self, step: int) -> bool:
        cfg = self.cfg
        return (cfg.grad_norm_dtype != "float32" or cfg.optimizer.skip_grad_norm_threshold is not None or
                (self.probers is not None and self.probers.active(step)) or
                (self.internal is not None and self.internal.due(step)))

    def apply_step(self, window: int) -> float | None:
        """Clip and step the full window; the gradient norm when it was computed here (else the model's)."""
        from twinkle.trainer.resume import reload

        cfg, model, group = self.cfg, self.model, self.group
        step = group.cur_step + 1
        if self._health_due(step):
            from twinkle.trainer.health import check_health

            check_health(model, self.adapter, step)
        offloaded = getattr(self.trainer, "offloaded", None)
        if offloaded is not None:  # load_checkpoint.offload_optimizer_first_step: back for the first update
            reload(group.optimizer)
            self.trainer.offloaded = None
        options = {"adapter_name": self.adapter, "gradient_accumulation_steps": window,
                   "max_consecutive_skips": cfg.optimizer.max_consecutive_skips}
        if not self._split_path(step):
            model.clip_grad_and_step(max_grad_norm=self.max_norm, **options)
            return None
        model.clip_grad_norm(math.inf, adapter_name=self.adapter)  # finishes the gradients; scales them by exactly 1
        if self.internal is not None:
            self.internal.before_clip(step)
        if self.probers is not None:
            self.probers.before_clip(step)
        norm = self._clip()
        if self.probers is not None:
            self.probers.after_clip(step, norm)
        threshold = cfg.optimizer.skip_grad_norm_threshold
        if threshold is not None and math.isfinite(norm) and norm > threshold:
            model.zero_grad(**options)  # the window is dropped: no update, no step counted
            self.consecutive_skips += 1
            logger.warning("Skipped step %d: gradient norm %.4g > optimizer.skip_grad_norm_threshold %.4g (%d in a "
                           "row).", step, norm, threshold, self.consecutive_skips)
            if self.consecutive_skips >= cfg.optimizer.max_consecutive_skips:
                from twinkle.errors import TwinkleError

                raise TwinkleError(f"Training stopped at step {step}: {self.consecutive_skips} windows in a row had a "
                                   f"gradient norm over optimizer.skip_grad_norm_threshold={threshold}; raise it or "
                                   "lower the learning rate.")
            return norm
        self.consecutive_skips = 0
        model.step(**options)
        model.zero_grad(**options)
        model.lr_step(**options)
        return norm

    def _clip(self) -> float:
        """The window's (finished) gradient norm in grad_norm_dtype, and the clipping it decides.

        float32: the model's own clip (as clip_grad_and_step). float64: the norm of the float64-cast gradients,
        and the gradients scaled by ``max_norm / (norm + 1e-6)`` when that is below 1 (torch's clipping rule).
        """
        model, cfg = self.model, self.cfg
        if cfg.grad_norm_dtype == "float32":
            return float(model.clip_grad_norm(self.max_norm, adapter_name=self.adapter))
        import torch

        grads = [p.grad for p in model.backend.parameters(self.group) if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([g.to(getattr(torch, cfg.grad_norm_dtype)) for g in grads], 2.0)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        coefficient = self.max_norm / (norm + 1e-6)
        if coefficient < 1.0:
            for grad in grads:
                grad.mul_(coefficient)
        return norm

    def _health_due(self, step: int) -> bool:
        """check_health_interval: every N steps, and before each checkpoint or snapshot (as xtuner)."""
        cfg = self.cfg
        interval = cfg.check_health_interval
        if interval is None or interval <= 0:
            return False
        saves = [cfg.checkpoint_interval, cfg.snapshot_interval]
        return step % interval == 0 or step >= self.total or any(s and s > 0 and step % s == 0 for s in saves)

    # ----------------------------------------------------------------- after
    def after_step(self, step: int) -> dict[str, float]:
        """Tracker entries of this step: internal metrics and prober summaries (when due)."""
        record: dict[str, float] = {}
        if self.internal is not None:
            record.update(self.internal.after_step(step, self.last_piece))
        if self.probers is not None:
            record.update(self.probers.records(step))
        return record

    def close(self) -> None:
        for part in (self.probers, self.internal, self.debug_hooks):
            if part is not None:
                part.close()
