"""TrainerConfig and its groups: plain dataclasses that validate eagerly.

A wrong field name, type or value raises :class:`ConfigError` naming the dotted field
(``optimizer.lr``) when the config is built, before any model or dataset is loaded. Build one in
Python, or from a YAML/TOML file or dict with :meth:`TrainerConfig.from_dict` / :meth:`from_file`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from twinkle.model.optimizer_group import check_lr
from twinkle.trainer._validate import ConfigError, build

TINY_MODEL = "twinkle://tiny-qwen"
TINY_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def _positive(name: str, value: int | float | None, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ConfigError(f"{name}: must be > 0, got {value!r}.")


def _interval(name: str, value: int | None) -> None:
    """Intervals are None/-1 (off) or a positive step count."""
    if value is not None and value != -1 and value <= 0:
        raise ConfigError(f"{name}: must be a positive number of steps, or -1/null to disable; got {value!r}.")


@dataclass
class ModelConfig:
    """Which registered TwinkleModel to build, from what weights, with which constructor options."""

    type: str = "TransformersModel"
    model_id: str = TINY_MODEL
    mixed_precision: str = "no"
    strategy: str | None = None  # the backend's wrapping strategy (TransformersModel: accelerate | native_fsdp)
    gradient_checkpointing: bool = False  # recompute activations in backward (the GradientCheckpointing patch)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.type.strip():
            raise ConfigError("type: must name a registered model, e.g. 'TransformersModel'.")
        if self.mixed_precision not in ("no", "bf16", "fp16", "fp8"):
            raise ConfigError("mixed_precision: expected 'no' | 'bf16' | 'fp16' | 'fp8', "
                              f"got {self.mixed_precision!r}.")


@dataclass
class LoraConfig:
    """LoRA adapter settings; ``enabled=False`` trains the full model instead."""

    enabled: bool = True
    adapter_name: str = "default"
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | list[str] | None = None  # None: all-linear (plus lm_head for the tiny default); a,b,c
    modules_to_save: list[str] | None = None
    merge_on_export: bool = False  # HF exports hold the merged full model instead of the adapter

    def __post_init__(self) -> None:
        _positive("r", self.r, allow_none=False)
        _positive("alpha", self.alpha, allow_none=False)
        if isinstance(self.target_modules, str) and "," in self.target_modules:
            self.target_modules = [m.strip() for m in self.target_modules.split(",") if m.strip()]
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout: must be in [0, 1), got {self.dropout!r}.")


@dataclass
class OptimizerConfig:
    """Optimizer by registered name (``AdamW``, ``Muon``...) and its constructor options."""

    name: str = "AdamW"
    lr: float = 5e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    #: inf/NaN steps are skipped; this many in a row stop training with an error naming the step
    max_consecutive_skips: int = 50
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            check_lr(self.lr)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        _positive("lr", self.lr, allow_none=False)
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay: must be >= 0, got {self.weight_decay!r}.")
        _positive("max_grad_norm", self.max_grad_norm, allow_none=False)
        _positive("max_consecutive_skips", self.max_consecutive_skips, allow_none=False)


@dataclass
class LRConfig:
    """lr scheduler by registered name; ``num_training_steps`` is filled in from total_step."""

    scheduler: str | None = "CosineWarmupScheduler"
    warmup_steps: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps: must be >= 0, got {self.warmup_steps!r}.")


@dataclass
class DatasetConfig:
    """Training (and evaluation) data: a dataset id, its template and preprocessor."""

    dataset_id: str = "twinkle://self-cognition"
    template: str = "Template"
    max_length: int = 256
    truncation_strategy: Literal["delete", "left", "right", "raise"] = "delete"
    preprocessor: str | None = "SelfCognitionProcessor"
    preprocessor_kwargs: dict[str, Any] = field(default_factory=lambda: {"model_name": "twinkle大模型",
                                                                          "model_author": "ModelScope社区"})
    train_samples: int | None = None  # None: every row (minus the eval rows)
    eval_samples: int = 0  # rows after the training rows held out for evaluation
    eval_dataset_id: str | None = None

    def __post_init__(self) -> None:
        _positive("max_length", self.max_length, allow_none=False)
        _positive("train_samples", self.train_samples)
        if self.eval_samples < 0:
            raise ConfigError(f"eval_samples: must be >= 0, got {self.eval_samples!r}.")


@dataclass
class DataloaderConfig:
    """How global batches are split: ``global_batch_size / gradient_accumulation_steps`` rows a micro-batch."""

    gradient_accumulation_steps: int = 1
    shuffle: bool = True

    def __post_init__(self) -> None:
        _positive("gradient_accumulation_steps", self.gradient_accumulation_steps, allow_none=False)


@dataclass
class LossConfig:
    """Loss by registered name (None: the model's default) and its options; ``task`` selects the forward."""

    name: str | None = None
    task: str = "causal_lm"
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class InfraConfig:
    """Where the model runs: ``local`` (this process, or each torchrun process) or ``ray`` actors.

    The parallel sizes build the device mesh (``DeviceMesh.from_sizes``): under torchrun the
    data-parallel size is what the launched processes leave after fsdp * tp * pp * cp. With ``ray``
    this process drives ``dp_size`` times that many model actors on ``device_type`` devices in a
    Ray cluster it starts (``num_cpus``) or joins (``ray_address``).
    """

    mode: Literal["local", "ray"] = "local"
    dp_size: int = 1
    fsdp_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    cp_size: int = 1
    sp_size: int | None = None  # xtuner's name for sequence (context) parallelism: the same as cp_size
    ep_size: int = 1
    sequence_parallel: bool = False
    device_type: Literal["cpu", "gpu", "npu"] = "cpu"
    num_cpus: int | None = None
    ray_address: str | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("dp_size", "fsdp_size", "tp_size", "pp_size", "cp_size", "ep_size"):
            _positive(name, getattr(self, name), allow_none=False)
        if self.sp_size is not None:
            _positive("sp_size", self.sp_size, allow_none=False)
            if self.cp_size not in (1, self.sp_size):
                raise ConfigError(f"sp_size / cp_size: two sizes for one dimension ({self.sp_size} vs {self.cp_size}); "
                                  "set one of them.")
            self.cp_size, self.sp_size = self.sp_size, None
        _positive("num_cpus", self.num_cpus)
        _positive("timeout_s", self.timeout_s)
        if self.mode == "local" and (self.dp_size != 1 or self.num_cpus or self.ray_address):
            raise ConfigError("dp_size / num_cpus / ray_address: only used with infra.mode 'ray' (under torchrun the "
                              "data-parallel size is the number of launched processes).")


@dataclass
class TrainerConfig:
    """Everything :class:`twinkle.trainer.Trainer` needs; see docs/trainer.md for each option."""

    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr: LRConfig = field(default_factory=LRConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    dataloader: DataloaderConfig = field(default_factory=DataloaderConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    infra: InfraConfig = field(default_factory=InfraConfig)
    load_from: str | None = None
    global_batch_size: int = 8
    total_step: int | None = None
    total_epoch: int | None = None
    work_dir: str = "work_dir"
    checkpoint_interval: int | None = -1
    checkpoint_maxkeep: int | None = -1
    auto_resume: bool = False
    hf_interval: int | None = None
    hf_max_keep: int | None = None
    exp_tracker: Literal["jsonl", "tensorboard"] = "jsonl"
    log_interval: int = 1
    eval_interval: int | None = None
    profile_step: list[int] | int | None = None
    profile_time: bool = True
    profile_memory: bool = False
    seed: int = 42
    infra_mode: Literal["local", "ray"] | None = None  # older spelling of infra.mode
    progress_bar: bool = True
    tokenizer_path: str | None = None  # the tokenizer to encode with (default: the model's own)
    log_dir: str | None = None  # metrics and train.log (default: work_dir/logs, tensorboard: work_dir/tensorboard)
    strict_load: bool = True  # weights that do not fit the model (missing/unexpected tensors) are an error
    do_clip: bool = True  # clip gradients to optimizer.max_grad_norm (False: the norm is still reported)
    async_checkpoint: bool = False  # checkpoints written in the background while training goes on
    snapshot_interval: int | None = None  # a latest-only resumable snapshot every N steps

    def __post_init__(self) -> None:
        if (self.total_step is None) == (self.total_epoch is None):
            raise ConfigError("total_step / total_epoch: set exactly one of them "
                              f"(got total_step={self.total_step!r}, total_epoch={self.total_epoch!r}).")
        _positive("total_step", self.total_step)
        _positive("total_epoch", self.total_epoch)
        _positive("global_batch_size", self.global_batch_size, allow_none=False)
        gas = self.dataloader.gradient_accumulation_steps
        if self.global_batch_size % gas:
            raise ConfigError(f"global_batch_size: {self.global_batch_size} is not divisible by "
                              f"dataloader.gradient_accumulation_steps={gas}.")
        if self.seed < 0:
            raise ConfigError(f"seed: must be an integer >= 0, got {self.seed!r}.")
        for name in ("checkpoint_interval", "hf_interval", "eval_interval", "snapshot_interval"):
            _interval(name, getattr(self, name))
        for name in ("checkpoint_maxkeep", "hf_max_keep"):
            _interval(name, getattr(self, name))
        _positive("log_interval", self.log_interval, allow_none=False)
        steps = [self.profile_step] if isinstance(self.profile_step, int) else (self.profile_step or [])
        if any(s <= 0 for s in steps):
            raise ConfigError(f"profile_step: steps are counted from 1, got {self.profile_step!r}.")
        if self.infra_mode is not None:  # the older top-level spelling sets infra.mode
            self.infra = InfraConfig(**{**asdict(self.infra), "mode": self.infra_mode})
            self.infra_mode = None
        if self.infra.mode == "ray" and self.async_checkpoint:
            raise ConfigError("async_checkpoint: not available with infra.mode 'ray' (the model saves in its actors); "
                              "run under torchrun, or set async_checkpoint=false.")
        if self.infra.mode == "ray" and self.lora.enabled and self.lora.merge_on_export:
            raise ConfigError("lora.merge_on_export: not available with infra.mode 'ray' (the model lives in the "
                              "actors); export the adapter and merge it afterwards, or run under torchrun.")
        if not str(self.work_dir).strip():
            raise ConfigError("work_dir: must be a directory path.")
        if self.eval_interval not in (None, -1) and self.dataset.eval_samples == 0:
            raise ConfigError("eval_interval: evaluation needs dataset.eval_samples > 0.")

    # ------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerConfig:
        """Build from nested plain data (a parsed YAML/TOML file); errors name the dotted field."""
        if not isinstance(data, dict):
            raise ConfigError(f"A trainer config must be a table of fields, got {type(data).__name__}.")
        return build(cls, data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> TrainerConfig:
        """Read a ``.yaml``/``.yml``/``.toml`` file, apply dotted ``overrides``, then validate."""
        data = load_config_file(path)
        return cls.from_dict(apply_overrides(data, overrides or {}))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def micro_batch_size(self) -> int:
        return self.global_batch_size // self.dataloader.gradient_accumulation_steps

    @property
    def profile_steps(self) -> list[int]:
        return [self.profile_step] if isinstance(self.profile_step, int) else list(self.profile_step or [])

    def lora_targets(self) -> list[str] | str:
        """LoRA targets; the random-init tiny default also adapts lm_head so it visibly learns."""
        if self.lora.target_modules is None:
            return list(TINY_LORA_TARGETS) if self.model.model_id == TINY_MODEL else "all-linear"
        return self.lora.target_modules


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML or TOML file into nested dicts (PyYAML / tomllib imported only here)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist.")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {str(path)!r}: expected .yaml, .yml or .toml.")
    except ConfigError:
        raise
    except Exception as exc:  # a parser error: say where
        raise ConfigError(f"config file {str(path)!r} could not be parsed: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a table of fields, got {type(data).__name__}.")
    return data


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with ``{'optimizer.lr': '1e-3'}``-style dotted keys set (strings are coerced later)."""
    import copy

    result = copy.deepcopy(data)
    for dotted, value in overrides.items():
        parts = dotted.replace("-", "_").split(".")
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{dotted}: {part!r} is not a group of fields.")
            node = child
        node[parts[-1]] = value
    return result
