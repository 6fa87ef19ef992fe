"""Building the Trainer's parts from a TrainerConfig: runtime, datasets, model with its components."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twinkle.config import ConfigError
from twinkle.trainer.config import TrainerConfig


def check_work_dir(work_dir: str) -> Path:
    """Create ``work_dir`` and prove it is writable before anything is loaded."""
    path = Path(work_dir).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"work_dir: {str(path)!r} is not a writable directory ({exc.strerror or exc}).") from exc
    return path


def check_names(cfg: TrainerConfig) -> None:
    """Every component the config names is registered (nothing is imported): a ConfigError naming the field."""
    from twinkle.errors import ComponentNotFoundError
    from twinkle.registry import get_registry

    registry = get_registry()
    named = [("model.type", "model", cfg.model.type), ("dataset.template", "template", cfg.dataset.template),
             ("dataset.preprocessor", "preprocessor", cfg.dataset.preprocessor),
             ("optimizer.name", "optimizer", cfg.optimizer.name), ("lr.scheduler", "lr_scheduler", cfg.lr.scheduler),
             ("loss.name", "loss", cfg.loss.name)]
    for where, kind, name in named:
        if name is None or name == "default":  # 'default': the model's own (MegatronModel's optimizer, scheduler)
            continue
        try:
            registry.get(kind, name)
        except ComponentNotFoundError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` that does not exist yet (what creating it would make), or None."""
    path = path.expanduser().resolve()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def prune_empty(root: Path) -> None:
    """Remove ``root`` if it holds nothing but empty files and directories (what a failed start leaves)."""
    if not root.is_dir():
        return
    paths = sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    if any(p.is_file() and p.stat().st_size for p in paths):
        return
    for path in paths:
        path.unlink() if path.is_file() else path.rmdir()
    root.rmdir()


@contextlib.contextmanager
def log_file(path: Path, enabled: bool = True) -> Iterator[None]:
    """Copy twinkle's log records to ``path`` (appending) while the block runs."""
    if not enabled:
        yield
        return
    from twinkle.log import get_logger

    logger = get_logger()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def build_dataset(cfg: TrainerConfig, model_id: str, rows: range | None, dataset_id: str | None = None) -> Any:
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.registry import resolve

    data = cfg.dataset
    dataset = Dataset(dataset_meta=DatasetMeta(dataset_id or data.dataset_id, data_slice=rows))
    dataset.set_template(data.template, model_id=cfg.tokenizer_path or model_id, max_length=data.max_length,
                         truncation_strategy=data.truncation_strategy)
    if data.preprocessor:
        preprocessor = resolve("preprocessor", data.preprocessor)
        dataset.map(preprocessor(**data.preprocessor_kwargs) if isinstance(preprocessor, type) else preprocessor)
    dataset.encode()
    return dataset


def split_rows(cfg: TrainerConfig) -> tuple[range | None, range | None]:
    """Training and evaluation row ranges: eval rows follow the training rows in the same dataset."""
    data = cfg.dataset
    if data.eval_dataset_id:
        return (range(data.train_samples) if data.train_samples else None,
                range(data.eval_samples) if data.eval_samples else None)
    if data.train_samples is None:
        if data.eval_samples:
            raise ConfigError("dataset.train_samples: set it when dataset.eval_samples holds rows out of the "
                              "same dataset.")
        return None, None
    train = range(data.train_samples)
    evals = range(data.train_samples, data.train_samples + data.eval_samples) if data.eval_samples else None
    return train, evals


def model_source(cfg: TrainerConfig) -> tuple[str, Path | None]:
    """``(model_id, trainer_checkpoint)``: load_from is a HF model (replaces model_id) or a Trainer checkpoint."""
    from twinkle.trainer.store import MODEL_SUBDIR, TRAINER_FILE

    if not cfg.load_from:
        return cfg.model.model_id, None
    path = Path(cfg.load_from).expanduser()
    if (path / TRAINER_FILE).is_file():
        return cfg.model.model_id, path / MODEL_SUBDIR
    return cfg.load_from, None


def build_model(cfg: TrainerConfig, model_id: str, total_step: int) -> Any:
    """The configured model (:func:`twinkle.launch.build_model`), then template, adapter, optimizer, scheduler, loss."""
    from twinkle.launch import build_model as build

    model = build(cfg.model, cfg.infra, model_id=model_id, strict_load=cfg.strict_load)
    # the data's template on the model too: its tokenizer and chat template go into every checkpoint
    model.set_template(cfg.dataset.template, model_id=cfg.tokenizer_path or model_id,
                       max_length=cfg.dataset.max_length, truncation_strategy=cfg.dataset.truncation_strategy)
    adapter = cfg.lora.adapter_name if cfg.lora.enabled else None
    gas = cfg.dataloader.gradient_accumulation_steps
    if cfg.lora.enabled:
        from peft import LoraConfig

        lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=cfg.lora_targets(), modules_to_save=cfg.lora.modules_to_save)
        model.add_adapter_to_model(adapter, lora, gradient_accumulation_steps=gas)
    opt = cfg.optimizer
    model.set_optimizer(opt.name, lr=opt.lr, weight_decay=opt.weight_decay, adapter_name=adapter, **opt.kwargs)
    if cfg.lr.scheduler:
        steps = {}
        if cfg.lr.scheduler.endswith("WarmupScheduler"):  # twinkle's own: told the schedule's length
            steps = {"num_warmup_steps": min(cfg.lr.warmup_steps, total_step), "num_training_steps": total_step}
        model.set_lr_scheduler(cfg.lr.scheduler, adapter_name=adapter, **steps, **cfg.lr.kwargs)
    if cfg.loss.name:
        model.set_loss(cfg.loss.name, adapter_name=adapter, **cfg.loss.kwargs)
    return model
