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


def check_work_dir(work_dir: Any) -> Path:
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
    named = [("model.type", "model", cfg.model.type), ("dataset.template", "template", cfg.dataset.encoding()[0]),
             ("optimizer.name", "optimizer", cfg.optimizer.name),
             ("lr.scheduler", "lr_scheduler", cfg.lr.schedule(cfg.optimizer.lr, 1)[0]),
             ("loss.name", "loss", cfg.loss.resolved()[0])]
    named += [(f"dataset.preprocessor ({s.name or s.dataset_id})", "preprocessor", s.preprocessor)
              for s in cfg.dataset.sources()]
    named += [(f"prober_list ({name})", "prober", name) for name in cfg.prober_list]
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


@contextlib.contextmanager
def debugging(on: bool) -> Iterator[None]:
    """``debug``: autograd anomaly detection (a NaN in backward raises, naming the operation) and debug logs."""
    if not on:
        yield
        return
    import torch

    from twinkle.log import get_logger

    logger = get_logger()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with torch.autograd.detect_anomaly(check_nan=True):
            yield
    finally:
        logger.setLevel(level)


def batching(cfg: TrainerConfig, data_parallel: int) -> tuple[int, int]:
    """``(gradient accumulation steps, rows of one micro-batch over all data-parallel ranks)`` on a mesh whose
    data-parallel size is ``data_parallel``.

    With ``dataloader.micro_batch_size`` (rows per rank) the accumulation is derived: global_batch_size /
    (micro_batch_size x data_parallel). global_batch_size none: one row per rank and intra-layer micro-batch
    (x micro_batch_size), xtuner's default.
    """
    micro = cfg.dataloader.micro_batch_size
    intra = cfg.intra_layer_micro_batch
    global_rows = cfg.global_batch_size or data_parallel * intra * (micro or 1)
    if micro is not None:
        per_step = micro * data_parallel
        if global_rows % per_step:
            raise ConfigError(f"global_batch_size: {global_rows} is not a multiple of dataloader.micro_batch_size "
                              f"({micro}) x the data-parallel size ({data_parallel}); change one of them.")
        gas, rows = global_rows // per_step, per_step
    else:
        gas = cfg.dataloader.gradient_accumulation_steps
        rows = global_rows // gas
    if rows // data_parallel < intra:
        raise ConfigError(f"intra_layer_micro_batch: {intra} sub-batches of a micro-batch of {rows // data_parallel} "
                          "row(s) per data-parallel rank; raise global_batch_size or lower intra_layer_micro_batch.")
    return gas, rows


def build_datasets(cfg: TrainerConfig, model_id: str, train_type: Any = None) -> tuple[Any, Any]:
    """The training set (one source, or ``dataset_cfg``'s sources each taken ``sample_ratio`` times) and the
    evaluation set (or None); ``train_type`` builds the training set (default: Dataset)."""
    data = cfg.dataset
    sources = data.sources()
    if len(sources) == 1 and sources[0] is data and data.sample_ratio == 1.0:
        train_rows, eval_rows = split_rows(cfg)
        train = build_dataset(cfg, model_id, [(data, train_rows)], dataset_type=train_type)
        evals = build_dataset(cfg, model_id, [(data, eval_rows)], data.eval_dataset_id) if eval_rows is not None \
            else None
        return train, evals
    picked = [(source, sampled_rows(source, cfg.seed + index)) for index, source in enumerate(sources)]
    evals = None
    if data.eval_dataset_id and data.eval_samples:
        evals = build_dataset(cfg, model_id, [(data, range(data.eval_samples))], data.eval_dataset_id)
    return build_dataset(cfg, model_id, picked, dataset_type=train_type), evals


def sampled_rows(source: Any, seed: int) -> list[int]:
    """xtuner's sample_ratio: ``int(rows * ratio)`` rows: the rows repeated ``int(ratio)`` times, then a seeded
    sample (or the first rows, ``enable_sequential_sampler``) of the rest."""
    import random

    from twinkle.dataset import Dataset, DatasetMeta

    rows = list(range(source.train_samples)) if source.train_samples else list(range(len(Dataset(DatasetMeta(
        str(source.dataset_id))))))
    target = int(len(rows) * source.sample_ratio)
    picked = rows * int(source.sample_ratio)
    rest = target - len(picked)
    if rest > 0:
        picked += rows[:rest] if source.enable_sequential_sampler else random.Random(seed).sample(rows, rest)
    if not picked:
        raise ConfigError(f"dataset.sample_ratio: {source.sample_ratio} of {len(rows)} rows of "
                          f"{source.name or source.dataset_id} is no row; raise it.")
    return picked[:target]


def build_dataset(cfg: TrainerConfig, model_id: str, sources: list[tuple[Any, Any]], dataset_id: str | None = None,
                  dataset_type: Any = None) -> Any:
    """One Dataset of ``sources`` (``(DatasetConfig, rows or None)``, concatenated), preprocessed and encoded;
    ``dataset_type`` (default Dataset) makes the empty dataset: a PackingDataset, an IterableDataset..."""
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.registry import resolve

    template, max_length, truncation = cfg.dataset.encoding()
    dataset = (dataset_type or Dataset)()
    metas = []
    for source, rows in sources:
        meta = DatasetMeta(str(dataset_id or source.dataset_id), data_slice=rows)
        dataset.add_dataset(meta)
        metas.append((source, meta))
    dataset.set_template(template, model_id=cfg.tokenizer_path or model_id, max_length=max_length,
                         truncation_strategy=truncation)
    for source, meta in metas:
        if source.preprocessor:
            preprocessor = resolve("preprocessor", source.preprocessor)
            dataset.map(preprocessor(**source.preprocessor_kwargs) if isinstance(preprocessor, type) else preprocessor,
                        dataset_meta=meta if len(metas) > 1 else None)
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
    if path.is_file():  # the weights are a directory; a file here is most likely a config given to the wrong option
        hint = f" (a config file: twinkle train {cfg.load_from}, or --config)" if path.suffix.lower() in (
            ".yaml", ".yml", ".toml") else ""
        raise ConfigError(f"load_from: {str(path)!r} is a file{hint}; load_from takes a directory: an HF model "
                          "(config.json and weights) or a twinkle train checkpoint (work_dir/checkpoints/step-N).",
                          option="load_from", value=cfg.load_from)
    if (path / TRAINER_FILE).is_file():
        return cfg.model.model_id, path / MODEL_SUBDIR
    return cfg.load_from, None


def build_model(cfg: TrainerConfig, model_config: Any, optim_config: Any, model_id: str, strict: bool,
                accumulation: int) -> Any:
    """The configured model (:func:`twinkle.launch.build_model`), then template, adapter, processor, optimizer
    and loss; ``accumulation``: the micro-batches (sub-batches) one optimizer step takes."""
    from twinkle.launch import build_model as build
    from twinkle.trainer.data_checks import pack_budget

    extra: dict[str, Any] = {}
    if cfg.fsdp.reshard_after_forward is not None:  # FSDPConfig's, for native FSDP2 (fsdp_config of the model)
        extra["fsdp_config"] = {**(model_config.kwargs.get("fsdp_config") or {}),
                                "reshard_after_forward": cfg.fsdp.reshard_after_forward}
    model = build(model_config, cfg.infra, model_id=model_id, strict_load=strict, **extra)
    template, max_length, truncation = cfg.dataset.encoding()
    # the data's template on the model too: its tokenizer and chat template go into every checkpoint
    model.set_template(template, model_id=cfg.tokenizer_path or model_id, max_length=max_length,
                       truncation_strategy=truncation)
    adapter = cfg.lora.adapter_name if cfg.lora.enabled else None
    if cfg.lora.enabled:
        from peft import LoraConfig

        lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=cfg.lora_targets(), modules_to_save=cfg.lora.modules_to_save)
        model.add_adapter_to_model(adapter, lora, gradient_accumulation_steps=accumulation)
    if cfg.dataloader.pack_to_max_length or pack_budget(cfg) is not None:  # packs: each row keeps its positions
        model.set_processor("InputProcessor", padding_free=True, adapter_name=adapter)
    model.set_optimizer(optim_config.name, adapter_name=adapter, **optim_config.optimizer_kwargs())
    name, kwargs, _ = cfg.loss.resolved()
    if name:
        model.set_loss(name, adapter_name=adapter, **kwargs)
    return model
