"""Trainer: one config, ``fit()``; checkpoints that survive SIGKILL and resume exactly.

The loop drives the TwinkleModel API (forward_backward, clip_grad_and_step, calculate_metric, save,
resume_from_checkpoint), so any registered model works. ``build_engine`` and ``build_lr_scheduler`` are
xtuner v1's public builders. See docs/trainer.md.
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
from twinkle.trainer import data_options, setup, store, workdir
from twinkle.trainer.config import TrainerConfig
from twinkle.trainer.export import HFExports
from twinkle.trainer.lock import WorkDirLock, lock_work_dir
from twinkle.trainer.profiling import StepProfiler
from twinkle.trainer.stepping import StepTools
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
    run_id: str | None = None


class Trainer:
    """High-level training job over any registered TwinkleModel.

    Build it from a :class:`TrainerConfig`, from keywords (ours: ``Trainer(total_step=10, optimizer={'lr':
    1e-3})``, or xtuner v1's: ``Trainer(model_cfg=..., optim_cfg=AdamWConfig(lr=1e-5), lr_cfg=...,
    dataset_cfg=[...], global_batch_size=8, total_step=10)``), or both (``trainer_cfg=`` / the positional
    config, with keywords replacing its fields). Everything is validated eagerly (a :class:`ConfigError`
    names the field), then ``fit()`` loads and trains.
    """

    def __init__(self, config: TrainerConfig | None = None, /, *, trainer_cfg: TrainerConfig | None = None,
                 **options: Any) -> None:
        if config is not None and trainer_cfg is not None and config is not trainer_cfg:
            raise TypeError("Trainer takes one TrainerConfig: positionally or as trainer_cfg=, not both.")
        self.config = TrainerConfig.layered(config if config is not None else trainer_cfg, options)
        cfg = self.config
        if cfg.exp_tracker == "tensorboard":
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("exp_tracker: 'tensorboard' needs the tensorboard package (pip install "
                                  "tensorboard), or use exp_tracker='jsonl'.")
        setup.check_names(self.config)  # every name resolves, before anything is loaded or created
        self.mesh = launch.device_mesh(cfg.infra)  # the parallel sizes fit the launched processes
        self.gas, self.rows_per_micro_batch = setup.batching(cfg, self.mesh.data_world_size)
        self._made_dir = setup.first_missing(Path(cfg.work_dir))  # removed again if the start fails
        self.work_dir = setup.check_work_dir(cfg.work_dir)
        self.ckpt_root = self.work_dir / "checkpoints"
        self._stop_requested = False
        self._pending: Any = None  # an async checkpoint still being written
        self.skipped_windows = 0  # windows that took data but made no optimizer step (their rows count as consumed)
        self._lock: WorkDirLock | None = None
        self.model: Any = None
        self.run: workdir.Run | None = None
        self.is_main = os.environ.get("RANK", "0") == "0"
        self.on_step: Any = None  # optional callback(step, record) for progress bars
        self.adapter = cfg.lora.adapter_name if cfg.lora.enabled else None
        self._epoch: int | None = None  # the epoch of the step being run (hooks get it)
        self._connected: set[int] = set()  # hooks given the Trainer (connect_trainer) already

    @classmethod
    def from_config(cls, config: TrainerConfig | dict[str, Any]) -> Trainer:
        """xtuner's ``Trainer.from_config(TrainerConfig)``; a mapping (either spelling) is validated first."""
        return cls(config if isinstance(config, TrainerConfig) else TrainerConfig.from_dict(config))

    @property
    def engine(self) -> Any:
        """The model + optimizer object the Trainer drives (:meth:`build_engine`; its ``.engine`` is the core
        :class:`twinkle.engine.Engine`); None before ``fit()`` builds it."""
        return self.model

    def request_stop(self) -> None:
        """Stop after the current optimizer step, saving a complete checkpoint first (Ctrl-C does this)."""
        self._stop_requested = True

    # ------------------------------------------------------------- builders
    def build_engine(self, model_path: str | Path | None, model_config: Any, optim_config: Any, fsdp_config: Any = None,
                     load_checkpoint_path: str | Path | None = None, intra_layer_micro_batch: int = 1,
                     strict: bool = True) -> Any:
        """Build the model with its adapter, template, loss and optimizer (xtuner's ``build_engine``).

        ``model_path``: a HF model directory to load (None: ``model_config.model_id``); ``model_config``: a
        :class:`ModelConfig`; ``optim_config``: an :class:`OptimizerConfig`; ``fsdp_config``: an
        :class:`FSDPConfig` (its settings must already agree with the Trainer's, which forwards them);
        ``load_checkpoint_path``: a Trainer checkpoint whose weights are loaded (its other states are the
        Trainer's business, see ``load_checkpoint``); ``intra_layer_micro_batch``: sub-batches per micro-batch
        (the accumulation the engine counts); ``strict``: weights that do not fit are an error.
        """
        cfg = self.config
        if fsdp_config is not None and fsdp_config != cfg.fsdp:
            TrainerConfig.layered(cfg, {"fsdp": fsdp_config})  # refuses settings that disagree with infra/model
        model_id = str(model_path) if model_path is not None else model_config.model_id
        model = setup.build_model(cfg, model_config, optim_config, model_id, strict,
                                  self.gas * intra_layer_micro_batch)
        if load_checkpoint_path is not None:
            model.resume_from_checkpoint(str(load_checkpoint_path), resume_only_model=True, adapter_name=self.adapter)
            if cfg.infra.mode != "ray":  # its weights only: the step count starts at 0 (load_checkpoint continues it)
                name = self.adapter or next(iter(model.optimizer_group))
                model.optimizer_group[name].restore_progress(
                    {"cur_step": 0, "consumed_train_samples": 0,
                     "gradient_accumulation_steps": self.gas * intra_layer_micro_batch})
            logger.info("loaded weights from trainer checkpoint %s", load_checkpoint_path)
        return model

    def build_lr_scheduler(self, lr_cfg: Any, scheduler_step: int) -> Any:
        """A torch ``LRScheduler`` on the engine's optimizer for ``scheduler_step`` steps (xtuner's
        ``build_lr_scheduler``): ``lr_cfg``'s registered scheduler, or its lr_type/warmup_ratio/lr_min."""
        from twinkle.trainer.lr import build_scheduler

        if self.model is None:
            raise RuntimeError("build_lr_scheduler needs the engine: call build_engine(...) first (fit() does).")
        optimizer = self.model.optimizer_group[self._group_name()].optimizer
        return build_scheduler(lr_cfg, optimizer, self.config.optimizer.lr, scheduler_step)

    def _group_name(self) -> str:
        return self.adapter or next(iter(self.model.optimizer_group))

    # ------------------------------------------------------------------ fit
    def fit(self) -> FitResult:
        """Train to total_step (or until a stop request); in ray mode the actors are stopped on return.

        A run that fails before it wrote anything leaves no work directory behind (if it made one).
        """
        from twinkle.trainer.dcp_finish import dcp_finish_patch

        result = None
        try:
            with setup.log_file(self.log_dir / "train.log", enabled=self.is_main), setup.debugging(self.config.debug), \
                    dcp_finish_patch(self.config.patch_for_dcp_finish):
                result = self._fit()
            return result
        except BaseException:
            self._release_lock()  # first: the lock file is emptied, so an otherwise empty work dir goes
            if self._made_dir is not None:
                (self.work_dir / workdir.RUN_FILE).unlink(missing_ok=True)
                setup.prune_empty(self._made_dir)
            raise
        finally:
            self._release_lock()
            launch.stop(self.config.infra)
            if result is not None:
                self._call("after_fit", result.step, result=result)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def log_dir(self) -> Path:
        """Where metrics, train.log and profiles go: ``log_dir``, else ``work_dir/logs``."""
        return Path(self.config.log_dir).expanduser() if self.config.log_dir else self.work_dir / "logs"

    def _fit(self) -> FitResult:
        from twinkle import registry

        cfg, started = self.config, time.perf_counter()
        runtime = launch.start(cfg.infra, cfg.seed, backend=cfg.backend)
        self.is_main = runtime.rank == 0
        self._lock = lock_work_dir(self.work_dir, self.is_main)  # before anything in work_dir is touched
        self.run = self._begin_run()
        if self.is_main:
            store.clean_stale(self.ckpt_root)
        model_id, init_ckpt = setup.model_source(cfg)
        train_set, eval_set = data_options.build_datasets(cfg, model_id)
        loader = data_options.make_loader(cfg, train_set, self.rows_per_micro_batch)
        if loader.stream is None and len(loader) == 0:  # a stream's length is unknown (total_step is required)
            raise ConfigError(f"global_batch_size: a micro-batch of {self.rows_per_micro_batch} rows is larger than "
                              f"the {len(train_set)} training rows; lower it or use more data.")
        # over a stream total_epoch counts the batches of one pass first (by its length, or by reading it once)
        total = cfg.total_step or max(loader.batches_per_epoch() // self.gas, 1) * cfg.total_epoch
        window = self.gas * cfg.intra_layer_micro_batch  # micro-batches (sub-batches) the engine accumulates
        self.model = model = self.build_engine(model_id if model_id != cfg.model.model_id else None, cfg.model,
                                               cfg.optimizer, cfg.fsdp, init_ckpt, cfg.intra_layer_micro_batch,
                                               cfg.strict_load)
        self._set_scheduler(total)
        if cfg.async_checkpoint and not getattr(registry.resolve("model", cfg.model.type), "supports_async_save",
                                                False):
            raise ConfigError(f"async_checkpoint: {cfg.model.type}.save cannot write in the background; "
                              "set async_checkpoint=false.")
        # the step, micro-step and skips are the model's own (in ray mode a live view of rank 0's group)
        group = model.optimizer_group[self._group_name()]
        state, resumed_from = self._restore(loader, total)
        self.skipped_windows = int(state.get("skipped_windows", 0))  # windows that took data but made no step
        self.best = min(x for x in (state.get("best_eval_loss"), workdir.best_loss(self.work_dir, self.run.run_id),
                                    math.inf) if x is not None)
        tracker = make_tracker(cfg.exp_tracker, self.work_dir, group.cur_step, self.log_dir if cfg.log_dir else None,
                               self.run.run_id) if self.is_main else None
        tools = StepTools(self, model, group, total)
        profiler = StepProfiler(self.log_dir / "profile", cfg.profile_steps, cfg.profile_time, cfg.profile_memory)
        self.exports = HFExports(self)
        last_loss, last_ckpt = state.get("last_loss"), str(resumed_from) if resumed_from else None
        previous = signal.signal(signal.SIGINT, self._on_sigint) if _main_thread() else None
        announced = 0  # the step whose before_train_step hooks ran
        try:
            while group.cur_step < total and not self._stop_requested:
                step_started, step_before, step = time.perf_counter(), group.cur_step, group.cur_step + 1
                if group.micro_step == 0 and announced != step:  # once: a stream's epoch end is found on reading
                    announced = step
                    self._epoch = data_options.epoch_of(loader, train_set, cfg.hooks)
                    self._call("before_train_step", step, total_step=total)
                with profiler.step(step), tools.probing(step):
                    batches = tools.run_window(loader, window)
                    if batches == 0 or group.micro_step < window:  # the epoch ended (inside a window): go on
                        continue
                    norm = tools.apply_step(window)
                if self._pending is not None and not collective.active() and self._pending.done():
                    self._finish_pending()  # one process: complete it as soon as its files are written
                metric = model.calculate_metric(is_training=True, adapter_name=self.adapter)
                if group.cur_step == step_before:  # inf/NaN (or over skip_grad_norm_threshold): skipped, warned
                    self.skipped_windows += 1
                    continue
                last_loss = float(metric.get("loss", math.nan))
                record = {k: float(v) for k, v in metric.items() if k != "step" and _is_number(v)}
                if norm is not None:
                    record["grad_norm"] = norm
                record.update(profiler.last)
                record.update(tools.after_step(step))
                record.setdefault("step_time_s", time.perf_counter() - step_started)
                if tracker is not None and step % cfg.log_interval == 0:
                    tracker.log(step, record)
                if self.on_step is not None:
                    self.on_step(step, total, record)
                self._call("after_train_step", step, total_step=total, train_step_info=record)
                if _due(cfg.eval_interval, step) and eval_set is not None:
                    self._evaluate(eval_set, step, tracker, total)
                if self._saving and _due(cfg.hf_interval, step):
                    self.exports.export(step, total)
                if collective.active():  # every rank stops at the same step (rank 0 decides)
                    self._stop_requested = bool(collective.broadcast_object(self._stop_requested))
                final = step >= total or self._stop_requested
                if self._saving and (_due(cfg.checkpoint_interval, step) or final):
                    last_ckpt = str(self._save(step, loader, last_loss, total))
                elif self._saving and _due(cfg.snapshot_interval, step):
                    self._save(step, loader, last_loss, total, snapshot=True)
            self._finish_pending()
            self.exports.close()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            if tracker is not None:
                tracker.close()
            tools.close()
        if eval_set is not None and group.cur_step >= total and not _due(cfg.eval_interval, group.cur_step):
            self._evaluate(eval_set, group.cur_step, None, total)
        if last_ckpt is not None and not Path(last_ckpt).is_dir():  # never print a path that is gone
            raise RuntimeError(f"the final checkpoint {last_ckpt} is missing; please report this.")
        best = None if math.isinf(self.best) else self.best
        return FitResult(step=group.cur_step, total_step=total, final_loss=last_loss, checkpoint=last_ckpt,
                         seconds=time.perf_counter() - started, interrupted=self._stop_requested and
                         group.cur_step < total, resumed_from=str(resumed_from) if resumed_from else None,
                         best_eval_loss=best, hf_exports=self.exports.paths, run_id=self.run.run_id)

    # ------------------------------------------------------------- helpers
    @property
    def _saving(self) -> bool:
        return not self.config.debug_skip_save

    def _begin_run(self) -> workdir.Run:
        """This run's identity in work_dir (rank 0 decides under the lock; every rank learns it or the refusal)."""
        cfg = self.config
        path = cfg.load_checkpoint.checkpoint_path
        inside = path is not None and self.ckpt_root in Path(path).expanduser().resolve().parents
        outcome: Any = None
        if self.is_main:
            try:
                outcome = workdir.begin(self.work_dir, cfg, self.log_dir, continuing=cfg.auto_resume or inside)
            except workdir.WorkDirInUseError as exc:
                outcome = str(exc)
        outcome = collective.broadcast_object(outcome)
        if isinstance(outcome, str):
            self._made_dir = None  # the work_dir holds an earlier run's results: never prune it
            raise workdir.WorkDirInUseError(outcome, option="work_dir")
        return outcome

    def _set_scheduler(self, total: int) -> None:
        cfg = self.config
        name, kwargs = cfg.lr.schedule(cfg.optimizer.lr, total)
        if cfg.infra.mode == "ray" or name == "default":  # the optimizer lives elsewhere: by name
            if name is not None:
                self.model.set_lr_scheduler(name, adapter_name=self.adapter, **kwargs)
            return
        if name is None and not kwargs:
            return  # constant lr, no warm-up
        self.model.set_lr_scheduler(self.build_lr_scheduler(cfg.lr, total), adapter_name=self.adapter)

    def _restore(self, loader: Any, total: int) -> tuple[dict[str, Any], Path | None]:
        """auto_resume (the newest checkpoint that loads), else load_checkpoint.checkpoint_path, else nothing."""
        from twinkle.trainer.resume import auto_resume, load_checkpoint

        cfg = self.config
        if cfg.auto_resume:
            state, path = auto_resume(self, loader, total)
            if path is not None:
                return state, path
        if cfg.load_checkpoint.checkpoint_path is not None:
            return load_checkpoint(self, loader, Path(cfg.load_checkpoint.checkpoint_path).expanduser(), total)
        return {}, None

    def _call(self, event: str, step: int, total_step: int | None = None, **info: Any) -> None:
        """Run the hooks of ``event`` (every rank) with xtuner's keywords plus the event's own."""
        hooks = self.config.hooks.get_hooks(event)
        if not hooks:
            return
        total = total_step if total_step is not None else getattr(info.get("result"), "total_step", None)
        for hook in hooks:
            connect = getattr(hook, "connect_trainer", None)
            if connect is not None and id(hook) not in self._connected:
                self._connected.add(id(hook))
                connect(self)
            hook(step=step, epoch=self._epoch, total_step=total, total_epoch=self.config.total_epoch, **info)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._stop_requested:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        logger.warning("Ctrl-C: finishing this step and saving a checkpoint (Ctrl-C again to abort).")
        self._stop_requested = True

    def _save(self, step: int, loader: Any, last_loss: float | None, total: int, snapshot: bool = False) -> Path:
        """A full checkpoint ``checkpoints/step-N``, or (``snapshot``) the one latest-only ``checkpoints/snapshot``.

        A snapshot holds the same resumable state but replaces the previous one, is never rotated
        and gets no HF export: a cheap restart point between full checkpoints.
        """
        progress = loader.get_state()
        consumed = progress["consumed_train_samples"]
        state = {"step": step, "consumed_train_samples": consumed, "last_loss": last_loss,
                 "stream_position": progress.get("stream_position"),
                 "best_eval_loss": None if math.isinf(self.best) else self.best, "run_id": self.run.run_id,
                 "skipped_windows": self.skipped_windows, "optimizer": self.config.optimizer.name,
                 "rows_per_step": self.gas * self.rows_per_micro_batch}
        event = "after_save_snapshot" if snapshot else "after_save_dcp"

        def save_model(tmp: Path) -> Any:
            background = {"async_save": True} if self.config.async_checkpoint else {}
            return self.model.save(store.MODEL_SUBDIR, output_dir=str(tmp), adapter_name=self.adapter,
                                   save_optimizer=True, consumed_train_samples=consumed, **background)

        name = store.SNAPSHOT if snapshot else None
        if self.config.async_checkpoint:  # one save in flight: the previous one completes first
            self._finish_pending()
            self._pending = store.begin_checkpoint(self.ckpt_root, step, save_model, state, name=name)
            self._pending.event, self._pending.total, self._pending.step = event, total, step
            return self._pending.final
        path = store.write_checkpoint(self.ckpt_root, step, save_model, state, name=name)
        if not snapshot:
            self._rotate(path)
        self._call(event, step, total_step=total, checkpoint=path)
        return path

    def _finish_pending(self) -> None:
        """Complete the async checkpoint in flight, if any (blocks until its files are written)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            path = pending.finish()
            if path.name != store.SNAPSHOT:
                self._rotate(path)
            self._call(pending.event, pending.step, total_step=pending.total, checkpoint=path)

    def _rotate(self, written: Path) -> None:
        if self.is_main:
            for gone in store.rotate(self.ckpt_root, self.config.checkpoint_maxkeep, written=written):
                logger.info("rotated out %s", gone.name)

    def _evaluate(self, eval_set: Any, step: int, tracker: Any, total: int) -> dict[str, float]:
        from twinkle.dataloader import DataLoader

        for batch in DataLoader(eval_set, batch_size=self.rows_per_micro_batch, shuffle=False, min_batch_size=1):
            self.model.forward_only(inputs=batch, adapter_name=self.adapter, task=self.task)
            self.model.calculate_loss(adapter_name=self.adapter)
        metrics = self.model.calculate_metric(is_training=False, adapter_name=self.adapter)
        loss = float(collective.broadcast_object(float(metrics["loss"])))  # one decision for every rank
        logger.info("eval at step %d: %s", step, {k: round(float(v), 4) for k, v in metrics.items()})
        if tracker is not None:
            tracker.log(step, {f"eval_{k}": float(v) for k, v in metrics.items() if k != "step" and _is_number(v)})
        if loss < self.best:
            self.best = loss
        if loss == self.best and self._saving:  # every rank saves: a sharded model's save needs them all
            self.model.save(workdir.BEST_DIR, output_dir=str(self.work_dir), adapter_name=self.adapter)
            if self.is_main:
                workdir.record_best(self.work_dir, self.run.run_id, step, loss)
                logger.info("new best eval loss %.4f at step %d: %s", loss, step, self.work_dir / workdir.BEST_DIR)
        self._call("after_evaluate", step, total_step=total, metrics=metrics)
        return metrics

    @property
    def task(self) -> str:
        return self.config.loss.resolved()[2]


def _due(interval: int | None, step: int) -> bool:
    return interval is not None and interval > 0 and step % interval == 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
