"""Starting from a checkpoint: ``auto_resume`` (the newest one of this work_dir that loads) and
``load_checkpoint`` (a chosen one, restoring the states its flags select)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from twinkle.log import get_logger
from twinkle.trainer import store

logger = get_logger()


def verify(trainer: Any, path: Path) -> dict[str, Any]:
    """The checkpoint's trainer state; ``skip_checkpoint_validation`` checks sizes only (with a warning)."""
    skip = trainer.config.skip_checkpoint_validation
    if skip:
        logger.warning("skip_checkpoint_validation: %s is loaded without re-reading its files against their "
                       "checksums (sizes are checked); a damaged file would go unnoticed.", path)
    return store.verify(path, checksums=not skip)


def auto_resume(trainer: Any, loader: Any, total: int) -> tuple[dict[str, Any], Path | None]:
    """Continue from the newest checkpoint (or snapshot) that verifies, fits this run and loads; damaged
    newer ones are reported and skipped.

    If a checkpoint verified but failed to load and no older one loads either, that is an error:
    training on from a model that may hold part of a checkpoint is never called "from scratch". A
    checkpoint this run's config cannot continue (its step past ``total``, another optimizer) is a
    ConfigError saying which option to change.
    """
    from twinkle.checkpoint import CheckpointError

    failed: list[str] = []
    for step, path in reversed(store.list_checkpoints(trainer.ckpt_root, with_snapshot=True)):
        try:
            state = verify(trainer, path)
        except CheckpointError as exc:
            logger.warning("auto_resume: checkpoint %s is damaged (%s); falling back to the previous one.",
                           path.name, exc)
            continue
        try:
            check_progress(trainer, path, state, total)
        except CheckpointError as exc:  # complete, but not a state this run can continue: never "from scratch"
            failed.append(f"{path.name}: {exc}")
            logger.warning("auto_resume: checkpoint %s is refused (%s); falling back to the previous one.",
                           path.name, exc)
            continue
        try:
            progress = trainer.model.resume_from_checkpoint(
                str(path / store.MODEL_SUBDIR), adapter_name=trainer.adapter,
                skip_checkpoint_validation=trainer.config.skip_checkpoint_validation)
        except Exception as exc:  # any load failure is damage: a raw error must not end the run here
            failed.append(f"{path.name}: {type(exc).__name__}: {exc}")
            logger.warning("auto_resume: checkpoint %s is damaged (%s: %s); falling back to the previous one.",
                           path.name, type(exc).__name__, exc)
            continue
        loader.resume_from_checkpoint(progress["consumed_train_samples"], **stream_position(loader, state))
        logger.info("auto_resume: resumed from %s (step %d, %d samples consumed)", path, step,
                    progress["consumed_train_samples"])
        return state, path
    if failed:
        raise CheckpointError(
            f"auto_resume: no checkpoint in {trainer.ckpt_root} could be loaded ({'; '.join(failed)}). Not "
            "starting from scratch over a model that may hold part of one: fix or move those checkpoints "
            "aside, or run with auto_resume=False."
        )
    logger.info("auto_resume: no complete checkpoint in %s; starting from scratch.", trainer.ckpt_root)
    return {}, None


def check_progress(trainer: Any, path: Path, state: Any, total: int) -> None:
    """The checkpoint's progress is one this run could have reached, checked before anything is loaded.

    ``trainer.json`` (``state``) and the model's ``trainer_state.json`` must agree with each other and with the
    step the checkpoint is named for; the model's accumulation must be this run's; the samples consumed at
    most what its steps (and skipped windows) took. A mismatch is a CheckpointError (auto_resume falls back
    to the previous checkpoint); a step past ``total`` or another optimizer is a ConfigError naming the option.
    """
    from twinkle.checkpoint import CheckpointError, read_trainer_state
    from twinkle.checkpoint.layout import TRAINER_STATE_FILE
    from twinkle.config import ConfigError

    where = str(path / store.TRAINER_FILE)
    if not isinstance(state, dict):
        raise CheckpointError(f"{where!r} holds {type(state).__name__}, not the Trainer's progress table.")
    rows_per_step = trainer.gas * trainer.rows_per_micro_batch  # this run's; the saving run's when recorded
    fields = {key: state.get(key, {"skipped_windows": 0, "rows_per_step": rows_per_step}.get(key))
              for key in ("step", "consumed_train_samples", "skipped_windows", "rows_per_step")}
    for key, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(f"{where!r}: field {key!r} must be a non-negative integer, got "
                                  f"{str(value)[:40]!r}; the file was edited or damaged.")
    named = store.named_step(path)
    model_file = path / store.MODEL_SUBDIR / TRAINER_STATE_FILE
    model = read_trainer_state(path / store.MODEL_SUBDIR)  # bounded and typed
    for what, value in (("its name" if path.name != store.SNAPSHOT else "its manifest", named),
                        (f"{where!r} (step)", fields["step"])):
        if value is not None and value != model["cur_step"]:
            raise CheckpointError(f"{str(model_file)!r}: field 'cur_step' is {model['cur_step']}, but the checkpoint "
                                  f"is step {value} by {what}; the files were edited or damaged.")
    if model["consumed_train_samples"] != fields["consumed_train_samples"]:
        raise CheckpointError(f"{str(model_file)!r}: field 'consumed_train_samples' is "
                              f"{model['consumed_train_samples']}, {where!r} says {fields['consumed_train_samples']}; "
                              "the files were edited or damaged.")
    window = trainer.gas * trainer.config.intra_layer_micro_batch
    if model["gradient_accumulation_steps"] != window:
        raise CheckpointError(
            f"{str(model_file)!r}: field 'gradient_accumulation_steps' is {model['gradient_accumulation_steps']}, this "
            f"run accumulates {window} micro-batches per step (global_batch_size, dataloader."
            "gradient_accumulation_steps, dataloader.micro_batch_size and intra_layer_micro_batch decide it): resume "
            "with the batching of the run that saved it, or start a new run.")
    most = (model["cur_step"] + fields["skipped_windows"]) * fields["rows_per_step"]
    if model["consumed_train_samples"] > most:
        raise CheckpointError(
            f"{str(model_file)!r}: field 'consumed_train_samples' is {model['consumed_train_samples']}, more than the "
            f"{most} rows {model['cur_step']} steps (and {fields['skipped_windows']} skipped windows) of "
            f"{fields['rows_per_step']} rows took; the files were edited or damaged.")
    if model["cur_step"] > total:
        raise ConfigError(
            f"total_step: this run trains {total} steps, but {str(path)!r} is at step {model['cur_step']}, past its "
            f"end; raise total_step (or total_epoch) above {model['cur_step']} to train on from it, or start over in "
            "another work_dir (or with overwrite=true).", option="total_step", value=total)
    position = state.get("stream_position")
    if position is not None and not (isinstance(position, list) and len(position) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in position)):
        raise CheckpointError(f"{where!r}: field 'stream_position' must be [epoch, chunk, offset], three non-negative "
                              f"integers, got {str(position)[:60]!r}; the file was edited or damaged.")
    saved = state.get("optimizer")
    if isinstance(saved, str) and saved != trainer.config.optimizer.name:
        raise ConfigError(
            f"optimizer.name: {trainer.config.optimizer.name!r}, but {str(path)!r} was trained with {saved!r}, whose "
            f"state does not fit another optimizer: resume with optimizer.name {saved!r}, or start from its weights "
            f"alone in a new work_dir with load_from={str(path)!r}.", option="optimizer.name",
            value=trainer.config.optimizer.name)


def load_checkpoint(trainer: Any, loader: Any, path: Path, total: int) -> tuple[dict[str, Any], Path]:
    """Start from the Trainer checkpoint ``path`` with the states ``load_checkpoint``'s flags choose.

    The weights and the step always come from it (xtuner's LoadCheckpointConfig). A state that is not loaded
    keeps what this run built: an empty optimizer (``load_optimizer_states``), this config's optimizer
    hyper-parameters (``load_optimizer_args``), a new lr schedule over the remaining steps
    (``load_scheduler``), the data from its first row (``load_dataset``), this run's seeded RNG (``load_rng``).
    """
    from twinkle.checkpoint import capture_rng_state, restore_rng_state
    from twinkle.config import ConfigError

    flags = trainer.config.load_checkpoint
    if not (path / store.TRAINER_FILE).is_file():
        raise ConfigError(f"load_checkpoint.checkpoint_path: {str(path)!r} is no Trainer checkpoint (no "
                          f"{store.TRAINER_FILE}); give a work_dir/checkpoints/step-N directory, or use load_from for "
                          "weights alone.", option="load_checkpoint.checkpoint_path")
    state = verify(trainer, path)
    check_progress(trainer, path, state, total)
    model = trainer.model
    group = model.optimizer_group[trainer._group_name()]
    fresh = None if flags.everything else copy.deepcopy(group.optimizer.state_dict())
    rng = None if flags.load_rng else capture_rng_state()
    progress = model.resume_from_checkpoint(str(path / store.MODEL_SUBDIR), adapter_name=trainer.adapter,
                                            skip_checkpoint_validation=trainer.config.skip_checkpoint_validation)
    optimizer = group.optimizer
    if not flags.load_optimizer_states or not flags.load_optimizer_args:
        loaded = optimizer.state_dict()
        if not flags.load_optimizer_states:
            loaded["state"] = {}
        if not flags.load_optimizer_args:
            for kept, built in zip(loaded["param_groups"], fresh["param_groups"]):
                kept.update({k: v for k, v in built.items() if k != "params"})
        optimizer.load_state_dict(loaded)
    if not flags.load_scheduler:
        model.set_lr_scheduler(trainer.build_lr_scheduler(trainer.config.lr, max(total - progress["cur_step"], 1)),
                               adapter_name=trainer.adapter)
    if rng is not None:
        restore_rng_state(rng)
    if flags.load_dataset:
        loader.resume_from_checkpoint(progress["consumed_train_samples"], **stream_position(loader, state))
    if flags.offload_optimizer_first_step:
        trainer.offloaded = offload(optimizer)
    skipped = [name for name in ("optimizer_states", "optimizer_args", "dataset", "scheduler", "rng")
               if not getattr(flags, f"load_{name}")]
    logger.info("load_checkpoint: started from %s (step %d%s)", path, progress["cur_step"],
                f"; not loaded: {', '.join(skipped)}" if skipped else "")
    return state, path


def offload(optimizer: Any) -> dict[int, Any]:
    """Move the optimizer's state tensors to host memory; returns where each came from (for :func:`reload`)."""
    devices = {}
    for state in optimizer.state.values():
        for key, value in state.items():
            if hasattr(value, "to") and hasattr(value, "device") and value.device.type != "cpu":
                devices[id(value)] = value.device
                state[key] = value.to("cpu")
    return {"devices": devices, "count": len(devices)}


def reload(optimizer: Any) -> None:
    """Put the optimizer's state tensors back on their parameters' devices (before the first step)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if hasattr(value, "to") and hasattr(value, "device") and value.device != param.device \
                        and value.dim() > 0:
                    state[key] = value.to(param.device)


def stream_position(loader: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``{'stream_position': ...}`` for a stream's loader when the checkpoint saved one (else nothing)."""
    position = state.get("stream_position")
    return {"stream_position": position} if loader.stream is not None and position is not None else {}
