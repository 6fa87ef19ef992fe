"""TrainerConfig and its groups: a :mod:`twinkle.config` schema, validated eagerly.

A wrong field name, type or value raises :class:`ConfigError` naming the option (``optimizer.lr``)
when the config is built, before any model or dataset is loaded. Build one in Python, or from a
YAML/TOML file or dict with :meth:`TrainerConfig.from_dict` / :meth:`from_file`. The ``model`` and
``infra`` groups are :mod:`twinkle.launch`'s, shared with ``twinkle serve``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from twinkle.config import Config, ConfigError, build, from_mapping, load_file, opt, schema_of
from twinkle.constants import TRUNCATION_STRATEGIES
from twinkle.launch import TINY_MODEL, InfraConfig, ModelConfig

TINY_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
#: Intervals and keep-counts: a positive number, or -1 / none to turn them off.
OFF = (-1,)


@dataclass
class LoraConfig(Config):
    """LoRA adapter settings; ``enabled=False`` trains the full model instead."""

    enabled: bool = opt(True, "train a LoRA adapter (false: the full model)")
    adapter_name: str = opt("default", "adapter and optimizer-group name")
    r: int = opt(16, "LoRA rank", min=1)
    alpha: int = opt(32, "LoRA alpha (scaling = alpha / r)", min=1)
    dropout: float = opt(0.0, "dropout on the LoRA input", min=0.0, lt=1.0)
    target_modules: str | list[str] | None = opt(
        None, "layers to adapt: names (a,b,c), one regex or all-linear; none = all-linear (plus lm_head on the "
              "tiny default)")
    modules_to_save: list[str] | None = opt(None, "modules trained in full and saved with the adapter")
    merge_on_export: bool = opt(False, "HF exports hold the merged model instead of the adapter")


@dataclass
class OptimizerConfig(Config):
    """Optimizer by registered name (``AdamW``, ``Muon``...) and its constructor options."""

    name: str = opt("AdamW", "registered optimizer (AdamW, Muon, SGD, ...)")
    lr: float = opt(5e-3, "peak learning rate", gt=0.0)
    weight_decay: float = opt(0.0, "weight decay", min=0.0)
    max_grad_norm: float = opt(1.0, "gradient clipping norm (see do_clip)", gt=0.0)
    max_consecutive_skips: int = opt(50, "inf/NaN steps are skipped; this many in a row stop training", min=1)
    kwargs: dict[str, Any] = opt(help="extra optimizer arguments (a table)", factory=dict)


@dataclass
class LRConfig(Config):
    """lr scheduler by registered name; ``num_training_steps`` is filled in from total_step."""

    scheduler: str | None = opt("CosineWarmupScheduler", "registered lr scheduler; none = constant lr")
    warmup_steps: int = opt(0, "linear warm-up steps", min=0)
    kwargs: dict[str, Any] = opt(help="extra scheduler arguments (a table)", factory=dict)


@dataclass
class DatasetConfig(Config):
    """Training (and evaluation) data: a dataset id, its template and preprocessor."""

    dataset_id: str = opt("twinkle://self-cognition", "training data: hub id, local file or twinkle:// embedded data")
    template: str = opt("Template", "registered chat template (Template = the tokenizer's own)")
    max_length: int = opt(256, "tokens per row at most", min=1)
    truncation_strategy: str = opt("delete", "rows over max_length", choices=TRUNCATION_STRATEGIES)
    preprocessor: str | None = opt("SelfCognitionProcessor",
                                   "registered preprocessor turning rows into messages; none = rows are messages")
    preprocessor_kwargs: dict[str, Any] = opt(help="preprocessor arguments (a table)", factory=lambda: {
        "model_name": "twinkle大模型", "model_author": "ModelScope社区"})
    train_samples: int | None = opt(None, "training rows to use; none = all (minus the eval rows)", min=1)
    eval_samples: int = opt(0, "rows after the training rows held out for evaluation", min=0)
    eval_dataset_id: str | None = opt(None, "a separate evaluation dataset")


@dataclass
class DataloaderConfig(Config):
    """How global batches are split: ``global_batch_size / gradient_accumulation_steps`` rows a micro-batch."""

    gradient_accumulation_steps: int = opt(1, "micro-batches per optimizer step", min=1)
    shuffle: bool = opt(True, "shuffle the rows (seeded, resumable)")


@dataclass
class LossConfig(Config):
    """Loss by registered name (None: the model's default) and its options; ``task`` selects the forward."""

    name: str | None = opt(None, "registered loss; none = the model's default (cross-entropy)")
    task: str = opt("causal_lm", "forward flavour: causal_lm | fused_lm_ce | embedding")
    kwargs: dict[str, Any] = opt(help="loss arguments (a table)", factory=dict)


@dataclass
class TrainerConfig(Config):
    """Everything :class:`twinkle.trainer.Trainer` needs; see docs/trainer.md for each option."""

    model: ModelConfig = opt(factory=ModelConfig)
    lora: LoraConfig = opt(factory=LoraConfig)
    optimizer: OptimizerConfig = opt(factory=OptimizerConfig)
    lr: LRConfig = opt(factory=LRConfig)
    dataset: DatasetConfig = opt(factory=DatasetConfig)
    dataloader: DataloaderConfig = opt(factory=DataloaderConfig)
    loss: LossConfig = opt(factory=LossConfig)
    infra: InfraConfig = opt(factory=InfraConfig)
    load_from: str | Path | None = opt(
        None, "start from these weights: an HF model directory or a twinkle train checkpoint")
    global_batch_size: int = opt(8, "rows per optimizer step over all data-parallel ranks", min=1)
    total_step: int | None = opt(None, "optimizer steps to train (replaces total_epoch)", min=1)
    total_epoch: int | None = opt(None, "passes over the data (replaces total_step)", min=1)
    work_dir: str | Path = opt("work_dir", "where checkpoints, logs and exports go")
    checkpoint_interval: int | None = opt(-1, "resumable checkpoint every N steps (-1: only at the end)", min=1,
                                          also=OFF)
    checkpoint_maxkeep: int | None = opt(-1, "checkpoints kept (-1: all)", min=1, also=OFF)
    auto_resume: bool = opt(False, "continue from the newest complete checkpoint (or snapshot) in work_dir")
    hf_interval: int | None = opt(None, "HF-format export every N steps", min=1, also=OFF)
    hf_max_keep: int | None = opt(None, "HF exports kept", min=1, also=OFF)
    exp_tracker: Literal["jsonl", "tensorboard"] = opt("jsonl", "where metrics go")
    log_interval: int = opt(1, "write metrics every N steps", min=1)
    eval_interval: int | None = opt(None, "evaluate (and keep the best checkpoint) every N steps", min=1, also=OFF)
    profile_step: list[int] | int | None = opt(None, "steps to record a torch.profiler trace of", min=1)
    profile_time: bool = opt(True, "record each step's time")
    profile_memory: bool = opt(False, "record memory in the traces")
    seed: int = opt(42, "random seed", min=0)
    progress_bar: bool = opt(True, "show the training progress bar")
    tokenizer_path: str | Path | None = opt(
        None, "tokenizer to encode with and save in checkpoints; none = the model's")
    log_dir: str | Path | None = opt(None, "metrics and train.log; none = work_dir/logs")
    strict_load: bool = opt(True, "weights that do not fit the model are an error (false: a warning)")
    do_clip: bool = opt(True, "clip gradients to optimizer.max_grad_norm (false: only report the norm)")
    async_checkpoint: bool = opt(False, "write checkpoints in the background while training goes on")
    snapshot_interval: int | None = opt(
        None, "latest-only resumable snapshot every N steps, between full checkpoints", min=1, also=OFF)

    def check(self) -> None:
        if (self.total_step is None) == (self.total_epoch is None):
            raise ConfigError("total_step / total_epoch: set exactly one of them "
                              f"(got total_step={self.total_step!r}, total_epoch={self.total_epoch!r}).")
        gas = self.dataloader.gradient_accumulation_steps
        if self.global_batch_size % gas:
            raise ConfigError(f"global_batch_size: {self.global_batch_size} is not divisible by "
                              f"dataloader.gradient_accumulation_steps={gas}.")
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
        """Build from nested plain data (a parsed YAML/TOML file, keyword options); errors name the field."""
        if not isinstance(data, dict):
            raise ConfigError(f"A trainer config must be a table of fields, got {type(data).__name__}.")
        return build(cls, [from_mapping(schema_of(cls), data)])

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> TrainerConfig:
        """Read a ``.yaml``/``.yml``/``.toml`` file, apply ``overrides`` (``{'optimizer.lr': '1e-4'}``), validate."""
        schema = schema_of(cls)
        return build(cls, [from_mapping(schema, load_file(path), str(path)), from_mapping(schema, overrides or {})])

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
