"""The Trainer's option groups that xtuner v1 names: FSDPConfig, ResumeConfig, LoadCheckpointConfig, HooksConfig,
InternalMetricsConfig.

``FSDPConfig`` and ``ResumeConfig`` are other spellings of options that live elsewhere (``infra.tp_size``,
``model.mixed_precision``, ``load_checkpoint.checkpoint_path``...): each of their fields names its target in
``FORWARD``, and :func:`forward_groups` copies what was set there (an error when both places were set to
different values). Their fields default to ``None`` ("not set here"), so ``FSDPConfig()`` changes nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.config import Config, ConfigError, opt

#: FSDPConfig's dtypes -> twinkle's mixed_precision
PARAM_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}
_DTYPES = tuple(PARAM_DTYPES)


@dataclass
class FSDPConfig(Config):
    """xtuner's FSDPConfig: parallel sizes and precision, spelt into infra.* and model.* (unset: those decide)."""

    FORWARD = {"tp_size": "infra.tp_size", "ep_size": "infra.ep_size", "hsdp_sharding_size": "infra.fsdp_size",
               "param_dtype": "model.mixed_precision", "recompute_ratio": "model.gradient_checkpointing"}

    tp_size: int | None = opt(None, "= infra.tp_size", min=1)
    ep_size: int | None = opt(None, "= infra.ep_size", min=1)
    hsdp_sharding_size: int | None = opt(None, "= infra.fsdp_size (the shard group of HSDP)", min=1)
    param_dtype: str | None = opt(None, "compute dtype = model.mixed_precision (bfloat16: bf16, float16: fp16, "
                                        "float32: no)", choices=_DTYPES)
    reduce_dtype: str | None = opt(None, "gradient reduction dtype; twinkle keeps fp32 master weights and reduces "
                                         "in float32", choices=_DTYPES)
    recompute_ratio: float | None = opt(None, "activation recompute: 1 = every decoder layer "
                                              "(model.gradient_checkpointing), 0 = none", min=0.0, max=1.0)
    reshard_after_forward: bool | None = opt(None, "FSDP2: free the gathered parameters after forward (native_fsdp)")
    cpu_offload: bool | None = opt(None, "FSDP2 CPU offload: not available in twinkle")
    torch_compile: bool | None = opt(None, "torch.compile the model: not available in the Trainer")
    fp32_lm_head: bool | None = opt(None, "an fp32 lm_head under bf16: not available in twinkle")

    def check(self) -> None:
        if self.recompute_ratio not in (None, 0.0, 1.0):
            raise ConfigError(f"recompute_ratio: {self.recompute_ratio} recomputes part of the layers; twinkle "
                              "recomputes every decoder layer or none: use 1 or 0.")
        if self.reduce_dtype not in (None, "float32"):
            raise ConfigError(f"reduce_dtype: {self.reduce_dtype!r}; twinkle keeps fp32 master weights and reduces "
                              "gradients in float32: leave it unset or float32.")
        for name, why in (("cpu_offload", "FSDP2 CPU offload is not wired into TransformersModel"),
                          ("torch_compile", "the Trainer does not compile the model"),
                          ("fp32_lm_head", "twinkle keeps every master weight in fp32 already")):
            if getattr(self, name):
                raise ConfigError(f"{name}: not available ({why}); leave it unset or false.")

    def forwarded(self, name: str, value: Any) -> Any:
        if name == "param_dtype":
            return PARAM_DTYPES[value]
        if name == "recompute_ratio":
            return value == 1.0
        return value


@dataclass
class LoadCheckpointConfig(Config):
    """Continue from a Trainer checkpoint, choosing which states it restores (xtuner's LoadCheckpointConfig)."""

    checkpoint_path: str | Path | None = opt(
        None, "a Trainer checkpoint (work_dir/checkpoints/step-N) to start from; auto_resume's newest one wins")
    load_optimizer_states: bool = opt(True, "restore the optimizer's moments (false: they start empty)")
    load_optimizer_args: bool = opt(True, "restore the optimizer's hyper-parameters (false: this config's)")
    load_dataset: bool = opt(True, "continue the data where it stopped (false: from the first row)")
    load_scheduler: bool = opt(True, "restore the lr schedule (false: a new one over the remaining steps)")
    load_rng: bool = opt(True, "restore the random number generators (false: this run's seed)")
    offload_optimizer_first_step: bool = opt(False, "keep the loaded optimizer states in host memory until the first "
                                                    "step (accelerators only: on CPU they are there already)")

    @property
    def everything(self) -> bool:
        return all((self.load_optimizer_states, self.load_optimizer_args, self.load_dataset, self.load_scheduler,
                    self.load_rng))


@dataclass
class ResumeConfig(Config):
    """xtuner's (deprecated) ResumeConfig: spelt into auto_resume and load_checkpoint.*."""

    FORWARD = {"resume_from": "load_checkpoint.checkpoint_path", "auto_resume": "auto_resume",
               "load_optimizer_states": "load_checkpoint.load_optimizer_states",
               "load_optimizer_args": "load_checkpoint.load_optimizer_args",
               "load_dataset": "load_checkpoint.load_dataset", "load_scheduler": "load_checkpoint.load_scheduler"}

    resume_from: str | Path | None = opt(None, "= load_checkpoint.checkpoint_path")
    auto_resume: bool | None = opt(None, "= auto_resume")
    load_optimizer_states: bool | None = opt(None, "= load_checkpoint.load_optimizer_states")
    load_optimizer_args: bool | None = opt(None, "= load_checkpoint.load_optimizer_args")
    load_dataset: bool | None = opt(None, "= load_checkpoint.load_dataset")
    load_scheduler: bool | None = opt(None, "= load_checkpoint.load_scheduler")

    def forwarded(self, name: str, value: Any) -> Any:
        return value


#: the events a hook can be called at, and the keyword arguments it gets (besides step, epoch, total_step,
#: total_epoch)
HOOK_EVENTS = {
    "before_train_step": (),
    "after_train_step": ("train_step_info",),
    "after_evaluate": ("metrics",),
    "after_save_dcp": ("checkpoint",),
    "after_save_snapshot": ("checkpoint",),
    "after_save_hf": ("checkpoint",),
    "after_fit": ("result",),
}


@dataclass
class HooksConfig(Config):
    """Your callables at the Trainer's events (xtuner's HooksConfig plus before_train_step, after_evaluate and
    after_fit). Each is a callable, a ``'module:function'`` name or a list of them; it is called on every rank
    with keywords: ``step``, ``epoch``, ``total_step``, ``total_epoch`` and the event's own (``train_step_info``:
    the step's metrics; ``metrics``: the evaluation's; ``checkpoint``: the directory written; ``result``: the
    FitResult). A hook with ``connect_trainer(trainer)`` is given the Trainer first."""

    before_train_step: Any = opt(None, "before each optimizer step's first micro-batch")
    after_train_step: Any = opt(None, "after each optimizer step, with its metrics (train_step_info)")
    after_evaluate: Any = opt(None, "after each evaluation, with its metrics")
    after_save_dcp: Any = opt(None, "after each resumable checkpoint is complete (checkpoint: its directory)")
    after_save_snapshot: Any = opt(None, "after each snapshot is complete")
    after_save_hf: Any = opt(None, "after each HF-format export is complete")
    after_fit: Any = opt(None, "when fit() ends, with its FitResult")

    def check(self) -> None:
        for event in HOOK_EVENTS:
            setattr(self, event, _callables(event, getattr(self, event)))

    def get_hooks(self, event: str) -> list[Any]:
        return list(getattr(self, event) or [])


def _callables(event: str, value: Any) -> list[Any] | None:
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in items:
        if isinstance(item, str):
            module, _, attr = item.partition(":")
            try:
                item = getattr(importlib.import_module(module), attr) if attr else None
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"{event}: cannot import {item!r} ({exc}); write "
                                  "'package.module:function'.") from None
            if item is None:
                raise ConfigError(f"{event}: {value!r} is no 'package.module:function' name.")
        if not callable(item):
            raise ConfigError(f"{event}: {item!r} is not callable; give a function, a callable object or "
                              "'package.module:function'.")
        out.append(item)
    return out


@dataclass
class InternalMetricsConfig(Config):
    """Model-internal numbers every ``internal_metrics_interval`` steps (and at the last step), logged to the
    tracker as ``internal/<metric>/<layer>`` (xtuner's InternalMetricsConfig, plus gradient norms and max logits)."""

    internal_metrics_interval: int | None = opt(None, "every N optimizer steps; none = off", min=1)
    monitor_weights_rms_norm: bool = opt(True, "RMS of each layer's trainable weights")
    monitor_grad_norm: bool = opt(True, "L2 norm of each layer's gradients (before clipping)")
    monitor_attn_logits_stats: bool = opt(True, "attention entropy and largest attention probability per layer "
                                                "(one more forward of the step's last batch, with eager attention)")
    monitor_max_logits: bool = opt(True, "largest output logit of that forward")
    monitor_moe_router_logits_stats: bool | None = opt(None, "MoE models: router logits max/mean per layer")
    monitor_moe_load_balance_stats: bool | None = opt(None, "MoE models: maxvio (busiest expert's load over the "
                                                            "mean, minus 1) per layer")
    monitor_gdn_stats: bool | None = opt(None, "gated-delta-net weight min/max: no such model in twinkle")

    def check(self) -> None:
        if self.monitor_gdn_stats:
            raise ConfigError("monitor_gdn_stats: twinkle has no gated-delta-net models; leave it unset.")
        if not any((self.monitor_weights_rms_norm, self.monitor_grad_norm, self.monitor_attn_logits_stats,
                    self.monitor_max_logits, self.monitor_moe_router_logits_stats,
                    self.monitor_moe_load_balance_stats)):
            self.internal_metrics_interval = None  # nothing to monitor (as xtuner)


def forward_groups(config: Any, names: tuple[str, ...]) -> None:
    """Copy the fields set in the forwarding groups ``names`` of ``config`` to their targets (see module doc)."""
    from twinkle.config import schema_of

    schema = schema_of(type(config))
    for group_name in names:
        group = getattr(config, group_name)
        for field_name, target in group.FORWARD.items():
            value = getattr(group, field_name)
            if value is None:
                continue
            value = group.forwarded(field_name, value)
            owner_name, _, attr = target.rpartition(".")
            owner = getattr(config, owner_name) if owner_name else config
            current = getattr(owner, attr)
            default = schema.specs[(owner_name, attr)].default
            if current != default and current != value:
                raise ConfigError(f"{group_name}.{field_name}: gives {target} = {value!r}, but {target} is also set to "
                                  f"{current!r}; set it in one place.", option=f"{group_name}.{field_name}")
            setattr(owner, attr, value)


__all__ = ["FSDPConfig", "HOOK_EVENTS", "HooksConfig", "InternalMetricsConfig", "LoadCheckpointConfig",
           "ResumeConfig", "forward_groups"]
