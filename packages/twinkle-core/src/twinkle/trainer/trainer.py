"""Trainer: one config, ``fit()``; checkpoints that survive SIGKILL and resume exactly.

The loop drives the TwinkleModel API only (forward_backward, clip_grad_and_step, calculate_metric,
save, resume_from_checkpoint), so any registered model works. See docs/trainer.md.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle import collective, launch
from twinkle.config import ConfigError
from twinkle.log import get_logger
from twinkle.trainer import setup, store
from twinkle.trainer.config import TrainerConfig
from twinkle.trainer.export import export_hf
from twinkle.trainer.lock import WorkDirLock, lock_work_dir
from twinkle.trainer.profiling import StepProfiler
from twinkle.trainer.trackers import make_tracker

logger = get_logger()


@dataclass
class FitResult:
    """What ``fit()`` did: for the CLI's summary and for scripts."""

    step: int
    total_step: int
    final_loss: float | None
    checkpoint: str | None
    seconds: float
    interrupted: bool = False
    resumed_from: str | None = None
    best_eval_loss: float | None = None
    hf_exports: list[str] = field(default_factory=list)


class Trainer:
    """High-level training job over any registered TwinkleModel; build it with kwargs or a TrainerConfig.

    ``Trainer(total_step=10, work_dir='out', optimizer={'lr': 1e-3})`` validates everything
    eagerly (a :class:`ConfigError` names the field), then ``fit()`` loads and trains.
    """

    def __init__(self, config: TrainerConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("Trainer takes a TrainerConfig or keyword options, not both.")
        self.config = config if config is not None else TrainerConfig.from_dict(options)
        if self.config.exp_tracker == "tensorboard":
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("exp_tracker: 'tensorboard' needs the tensorboard package (pip install "
                                  "tensorboard), or use exp_tracker='jsonl'.")
        setup.check_names(self.config)  # every name resolves, before anything is loaded or created
        launch.device_mesh(self.config.infra)  # the parallel sizes fit the launched processes
        self._made_dir = setup.first_missing(Path(self.config.work_dir))  # removed again if the start fails
        self.work_dir = setup.check_work_dir(self.config.work_dir)
        self.ckpt_root = self.work_dir / "checkpoints"
        self._stop_requested = False
        self._pending: Any = None  # an async checkpoint still being written
        self._lock: WorkDirLock | None = None
        self.model: Any = None
        self.on_step: Any = None  # optional callback(step, record) for progress bars

    @classmethod
    def from_config(cls, config: TrainerConfig | dict[str, Any]) -> Trainer:
        return cls(config if isinstance(config, TrainerConfig) else TrainerConfig.from_dict(config))

    def request_stop(self) -> None:
        """Stop after the current optimizer step, saving a complete checkpoint first (Ctrl-C does this)."""
        self._stop_requested = True

    # ------------------------------------------------------------------ fit
    def fit(self) -> FitResult:
        """Train to total_step (or until a stop request); in ray mode the actors are stopped on return.

        A run that fails before it wrote anything leaves no work directory behind (if it made one).
        """
        try:
            with setup.log_file(self.log_dir / "train.log", enabled=os.environ.get("RANK", "0") == "0"):
                return self._fit()
        except BaseException:
            self._release_lock()  # first: the lock file is emptied, so an otherwise empty work dir goes
            if self._made_dir is not None:
                setup.prune_empty(self._made_dir)
            raise
        finally:
            self._release_lock()
            launch.stop(self.config.infra)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def log_dir(self) -> Path:
        """Where metrics and train.log go: ``log_dir``, else ``work_dir/logs``."""
        return Path(self.config.log_dir).expanduser() if self.config.log_dir else self.work_dir / "logs"

    def _fit(self) -> FitResult:
        from twinkle import registry
        from twinkle.dataloader import DataLoader

        cfg, started = self.config, time.perf_counter()
        runtime = launch.start(cfg.infra, cfg.seed)
        self.is_main = runtime.rank == 0
        self._lock = lock_work_dir(self.work_dir, self.is_main)  # before anything in work_dir is touched
        if self.is_main:
            store.clean_stale(self.ckpt_root)
        model_id, init_ckpt = setup.model_source(cfg)
        train_rows, eval_rows = setup.split_rows(cfg)
        train_set = setup.build_dataset(cfg, model_id, train_rows)
        eval_set = (setup.build_dataset(cfg, model_id, eval_rows, cfg.dataset.eval_dataset_id)
                    if eval_rows is not None else None)
        loader = DataLoader(train_set, batch_size=cfg.micro_batch_size, shuffle=cfg.dataloader.shuffle,
                            seed=cfg.seed)
        gas = cfg.dataloader.gradient_accumulation_steps
        if len(loader) == 0:
            raise ConfigError(f"global_batch_size: {cfg.global_batch_size} is larger than the {len(train_set)} "
                              "training rows; lower it or use more data.")
        total = cfg.total_step or max(len(loader) // gas, 1) * cfg.total_epoch
        self.model = model = setup.build_model(cfg, model_id, total)
        if cfg.async_checkpoint and not getattr(registry.resolve("model", cfg.model.type), "supports_async_save",
                                                False):
            raise ConfigError(f"async_checkpoint: {cfg.model.type}.save cannot write in the background; "
                              "set async_checkpoint=false.")
        self.adapter = cfg.lora.adapter_name if cfg.lora.enabled else None
        # the step, micro-step and skips are the model's own (in ray mode a live view of rank 0's group)
        group = model.optimizer_group[self.adapter or next(iter(model.optimizer_group))]
        if init_ckpt is not None:
            model.resume_from_checkpoint(str(init_ckpt), resume_only_model=True, adapter_name=self.adapter)
            logger.info("loaded weights from trainer checkpoint %s", init_ckpt)
        state, resumed_from = self._auto_resume(loader) if cfg.auto_resume else ({}, None)
        self.best = state.get("best_eval_loss")
        self.best = math.inf if self.best is None else self.best
        tracker = make_tracker(cfg.exp_tracker, self.work_dir, group.cur_step,
                               Path(cfg.log_dir).expanduser() if cfg.log_dir else None) if self.is_main else None
        profiler = StepProfiler(self.work_dir / "profile", cfg.profile_steps, cfg.profile_time, cfg.profile_memory)
        last_loss, last_ckpt = state.get("last_loss"), str(resumed_from) if resumed_from else None
        exports: list[str] = []
        max_norm = cfg.optimizer.max_grad_norm if cfg.do_clip else math.inf  # inf: the norm, no scaling
        previous = signal.signal(signal.SIGINT, self._on_sigint) if _main_thread() else None
        try:
            while group.cur_step < total and not self._stop_requested:
                step_started, step_before = time.perf_counter(), group.cur_step
                with profiler.step(group.cur_step + 1):
                    batches = 0
                    for batch in loader:
                        model.forward_backward(inputs=batch, adapter_name=self.adapter, task=cfg.loss.task)
                        model.clip_grad_and_step(max_grad_norm=max_norm, adapter_name=self.adapter,
                                                 gradient_accumulation_steps=gas,
                                                 max_consecutive_skips=cfg.optimizer.max_consecutive_skips)
                        batches += 1
                        if not group.micro_step:
                            break
                    if batches == 0:  # the epoch ended: the next loop starts the next one
                        continue
                if group.micro_step:  # the epoch ended inside an accumulation window; keep filling it
                    continue
                if self._pending is not None and not collective.active() and self._pending.done():
                    self._finish_pending()  # one process: complete it as soon as its files are written
                metric = model.calculate_metric(is_training=True, adapter_name=self.adapter)
                step = group.cur_step
                if step == step_before:  # inf/NaN loss or gradients: the model skipped this step (and warned)
                    continue
                last_loss = float(metric.get("loss", math.nan))
                record = {k: float(v) for k, v in metric.items() if k != "step" and _is_number(v)}
                record.update(profiler.last)
                record.setdefault("step_time_s", time.perf_counter() - step_started)
                if tracker is not None and step % cfg.log_interval == 0:
                    tracker.log(step, record)
                if self.on_step is not None:
                    self.on_step(step, total, record)
                if _due(cfg.eval_interval, step) and eval_set is not None:
                    self._evaluate(eval_set, step, tracker)
                if _due(cfg.hf_interval, step):
                    exports.append(export_hf(self, step))
                if collective.active():  # every rank stops at the same step (rank 0 decides)
                    self._stop_requested = bool(collective.broadcast_object(self._stop_requested))
                final = step >= total or self._stop_requested
                if _due(cfg.checkpoint_interval, step) or final:
                    last_ckpt = str(self._save(step, loader, last_loss))
                elif _due(cfg.snapshot_interval, step):
                    self._save(step, loader, last_loss, snapshot=True)
            self._finish_pending()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            if tracker is not None:
                tracker.close()
        if eval_set is not None and group.cur_step >= total and not _due(cfg.eval_interval, group.cur_step):
            self._evaluate(eval_set, group.cur_step, None)
        best = None if math.isinf(self.best) else self.best
        return FitResult(step=group.cur_step, total_step=total, final_loss=last_loss, checkpoint=last_ckpt,
                         seconds=time.perf_counter() - started, interrupted=self._stop_requested and
                         group.cur_step < total, resumed_from=str(resumed_from) if resumed_from else None,
                         best_eval_loss=best, hf_exports=exports)

    # ------------------------------------------------------------- helpers
    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._stop_requested:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        logger.warning("Ctrl-C: finishing this step and saving a checkpoint (Ctrl-C again to abort).")
        self._stop_requested = True

    def _save(self, step: int, loader: Any, last_loss: float | None, snapshot: bool = False) -> Path:
        """A full checkpoint ``checkpoints/step-N``, or (``snapshot``) the one latest-only ``checkpoints/snapshot``.

        A snapshot holds the same resumable state but replaces the previous one, is never rotated
        and gets no HF export: a cheap restart point between full checkpoints.
        """
        consumed = loader.get_state()["consumed_train_samples"]
        state = {"step": step, "consumed_train_samples": consumed, "last_loss": last_loss,
                 "best_eval_loss": None if math.isinf(self.best) else self.best}

        def save_model(tmp: Path) -> Any:
            background = {"async_save": True} if self.config.async_checkpoint else {}
            return self.model.save(store.MODEL_SUBDIR, output_dir=str(tmp), adapter_name=self.adapter,
                                   save_optimizer=True, consumed_train_samples=consumed, **background)

        if self.config.async_checkpoint:  # one save in flight: the previous one completes first
            self._finish_pending()
            self._pending = store.begin_checkpoint(self.ckpt_root, step, save_model, state,
                                                   name=store.SNAPSHOT if snapshot else None)
            return self._pending.final
        if snapshot:
            return store.write_checkpoint(self.ckpt_root, step, save_model, state, name=store.SNAPSHOT)
        path = store.write_checkpoint(self.ckpt_root, step, save_model, state)
        self._rotate()
        return path

    def _finish_pending(self) -> None:
        """Complete the async checkpoint in flight, if any (blocks until its files are written)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.finish()
            self._rotate()

    def _rotate(self) -> None:
        if self.is_main:
            for gone in store.rotate(self.ckpt_root, self.config.checkpoint_maxkeep):
                logger.info("rotated out %s", gone.name)

    def _auto_resume(self, loader: Any) -> tuple[dict[str, Any], Path | None]:
        """Continue from the newest checkpoint (or snapshot) that verifies and loads; damaged newer ones are
        reported and skipped.

        If a checkpoint verified but failed to load and no older one loads either, that is an error:
        training on from a model that may hold part of a checkpoint is never called "from scratch".
        """
        from twinkle.checkpoint import CheckpointError

        failed: list[str] = []
        for step, path in reversed(store.list_checkpoints(self.ckpt_root, with_snapshot=True)):
            try:
                state = store.verify(path)
            except CheckpointError as exc:
                logger.warning("auto_resume: checkpoint %s is damaged (%s); falling back to the previous one.",
                               path.name, exc)
                continue
            try:
                progress = self.model.resume_from_checkpoint(str(path / store.MODEL_SUBDIR),
                                                             adapter_name=self.adapter)
            except Exception as exc:  # any load failure is damage: a raw error must not end the run here
                failed.append(f"{path.name}: {type(exc).__name__}: {exc}")
                logger.warning("auto_resume: checkpoint %s is damaged (%s: %s); falling back to the previous one.",
                               path.name, type(exc).__name__, exc)
                continue
            loader.resume_from_checkpoint(progress["consumed_train_samples"])
            logger.info("auto_resume: resumed from %s (step %d, %d samples consumed)", path, step,
                        progress["consumed_train_samples"])
            return state, path
        if failed:
            raise CheckpointError(
                f"auto_resume: no checkpoint in {self.ckpt_root} could be loaded ({'; '.join(failed)}). Not "
                "starting from scratch over a model that may hold part of one: fix or move those checkpoints "
                "aside, or run with auto_resume=False."
            )
        logger.info("auto_resume: no complete checkpoint in %s; starting from scratch.", self.ckpt_root)
        return {}, None

    def _evaluate(self, eval_set: Any, step: int, tracker: Any) -> dict[str, float]:
        from twinkle.dataloader import DataLoader

        cfg = self.config
        for batch in DataLoader(eval_set, batch_size=cfg.micro_batch_size, shuffle=False, min_batch_size=1):
            self.model.forward_only(inputs=batch, adapter_name=self.adapter, task=cfg.loss.task)
            self.model.calculate_loss(adapter_name=self.adapter)
        metrics = self.model.calculate_metric(is_training=False, adapter_name=self.adapter)
        loss = float(collective.broadcast_object(float(metrics["loss"])))  # one decision for every rank
        logger.info("eval at step %d: %s", step, {k: round(float(v), 4) for k, v in metrics.items()})
        if tracker is not None:
            tracker.log(step, {f"eval_{k}": float(v) for k, v in metrics.items() if k != "step" and _is_number(v)})
        if loss < self.best:  # every rank saves: a sharded model's save needs them all
            self.best = loss
            self.model.save("best-checkpoint", output_dir=str(self.work_dir), adapter_name=self.adapter)
            if self.is_main:
                logger.info("new best eval loss %.4f at step %d: %s", loss, step, self.work_dir / "best-checkpoint")
        return metrics


def _due(interval: int | None, step: int) -> bool:
    return interval is not None and interval > 0 and step % interval == 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
