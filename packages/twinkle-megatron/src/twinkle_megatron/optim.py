"""The only optimizer and scheduler MegatronModel accepts, as registered components.

``MegatronDistributedOptimizer`` (optimizer kind, also ``'default'``) holds the settings of
megatron-core's optimizer (``OptimizerConfig`` fields: ``lr``, ``weight_decay``, ``adam_beta1``...);
the model builds the real ``DistributedOptimizer`` over its Megatron-DDP chunks. On a machine without
CUDA megatron-core's optimizers cannot be constructed (they allocate on ``'cuda'``), so the same
settings drive a stand-in: ``torch.optim.AdamW`` with megatron's parameter groups (no weight decay
on biases and 1-D weights) -- the update rule megatron itself falls back to without Apex/TE. The
stand-in exists for CPU tests; docs/megatron.md says so.

``OptimizerParamScheduler`` (lr_scheduler kind, also ``'default'``) is megatron-core's scheduler
with defaults taken from the optimizer (``max_lr`` = its lr, constant weight decay).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler as _MegatronScheduler

from twinkle.model.optimizer_group import check_lr
from twinkle_megatron.errors import MegatronConfigError

DEFAULT = "default"
OPTIMIZER_NAMES = (DEFAULT, "MegatronDistributedOptimizer")
SCHEDULER_NAMES = (DEFAULT, "OptimizerParamScheduler")


class MegatronDistributedOptimizer:
    """Settings of megatron-core's (distributed) optimizer; MegatronModel turns them into the optimizer."""

    def __init__(self, **kwargs: Any) -> None:
        from megatron.core.optimizer import OptimizerConfig

        kwargs = dict(kwargs)
        if "betas" in kwargs:
            kwargs["adam_beta1"], kwargs["adam_beta2"] = kwargs.pop("betas")
        if "eps" in kwargs:
            kwargs["adam_eps"] = kwargs.pop("eps")
        fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise MegatronConfigError(
                f"MegatronDistributedOptimizer got unknown settings {unknown}; it takes megatron-core OptimizerConfig "
                "fields such as lr, min_lr, weight_decay, adam_beta1, adam_beta2, adam_eps (or betas=, eps=), "
                "optimizer ('adam'|'sgd'), sgd_momentum."
            )
        if kwargs.get("optimizer", "adam") not in ("adam", "sgd"):
            raise MegatronConfigError(f"optimizer={kwargs['optimizer']!r}: MegatronDistributedOptimizer runs 'adam' "
                                      "or 'sgd'.")
        kwargs.setdefault("lr", 1e-5)
        for key in ("lr", "min_lr"):
            if kwargs.get(key) is not None:
                check_lr(kwargs[key], key)
        self.settings = kwargs

    def config(self, mixed_precision: str) -> Any:
        """megatron-core OptimizerConfig for this precision (clipping is applied per step by the model)."""
        import torch
        from megatron.core.optimizer import OptimizerConfig

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(mixed_precision,
                                                                                          torch.float32)
        return OptimizerConfig(**{"use_distributed_optimizer": True, "clip_grad": 0.0, "min_lr": 0.0,
                                  "bf16": dtype == torch.bfloat16, "fp16": dtype == torch.float16,
                                  "params_dtype": dtype, **self.settings})

    @property
    def lr(self) -> float:
        return float(self.settings["lr"])

    @property
    def weight_decay(self) -> float:
        return float(self.settings.get("weight_decay", 0.01))

    def cpu_standin(self, named_params: Iterable[tuple[str, Any]]) -> Any:
        """torch.optim.AdamW (or SGD) with megatron's default parameter groups, for CPU-only runs."""
        import torch

        decay, no_decay = [], []
        for name, param in named_params:
            (no_decay if name.endswith(".bias") or param.ndim == 1 else decay).append(param)
        groups = [{"params": p, "weight_decay": wd, "wd_mult": mult}
                  for p, wd, mult in ((decay, self.weight_decay, 1.0), (no_decay, 0.0, 0.0)) if p]
        if not groups:
            raise MegatronConfigError("This group has no trainable parameters; nothing to optimize.")
        s = self.settings
        if s.get("optimizer", "adam") == "sgd":
            return torch.optim.SGD(groups, lr=self.lr, momentum=s.get("sgd_momentum", 0.9))
        return torch.optim.AdamW(groups, lr=self.lr, betas=(s.get("adam_beta1", 0.9), s.get("adam_beta2", 0.999)),
                                 eps=s.get("adam_eps", 1e-8))


class OptimizerParamScheduler(_MegatronScheduler):
    """megatron-core's lr/weight-decay scheduler with defaults read from the optimizer.

    ``lr_warmup_steps`` and ``lr_decay_steps`` count optimizer steps; ``lr_decay_style`` is
    ``constant``, ``linear``, ``cosine``, ``inverse-square-root`` or ``WSD``.
    """

    def __init__(self, optimizer: Any, lr_warmup_steps: int = 0, lr_decay_steps: int | None = None,
                 lr_decay_style: str = "constant", max_lr: float | None = None, min_lr: float | None = None,
                 init_lr: float = 0.0, start_wd: float | None = None, end_wd: float | None = None,
                 wd_incr_steps: int | None = None, wd_incr_style: str = "constant", **kwargs: Any) -> None:
        first = optimizer.param_groups[0]
        explicit = {"max_lr": max_lr, "min_lr": min_lr}
        max_lr = float(first.get("max_lr") or first["lr"]) if max_lr is None else float(max_lr)
        min_lr = float(first.get("min_lr") or 0.0) if min_lr is None else float(min_lr)
        for group in optimizer.param_groups:  # megatron's groups carry their own max/min lr; keep them in step
            for key, value in (("max_lr", max_lr), ("min_lr", min_lr)):
                if explicit[key] is not None or group.get(key) is None:
                    group[key] = value
        wd = max((float(g.get("weight_decay", 0.0)) for g in optimizer.param_groups), default=0.0)
        start_wd = wd if start_wd is None else start_wd
        end_wd = start_wd if end_wd is None else end_wd
        steps = lr_decay_steps if lr_decay_steps is not None else max(lr_warmup_steps, 1)
        if lr_decay_style != "constant" and lr_decay_steps is None:
            raise MegatronConfigError(f"lr_decay_style={lr_decay_style!r} needs lr_decay_steps= (optimizer steps).")
        if not 0.0 <= min_lr <= max_lr or init_lr > max_lr:
            raise MegatronConfigError(f"Need 0 <= min_lr ({min_lr}) <= max_lr ({max_lr}) and init_lr ({init_lr}) "
                                      "<= max_lr.")
        super().__init__(optimizer, init_lr=init_lr, max_lr=max_lr, min_lr=min_lr, lr_warmup_steps=lr_warmup_steps,
                         lr_decay_steps=steps, lr_decay_style=lr_decay_style, start_wd=start_wd, end_wd=end_wd,
                         wd_incr_steps=wd_incr_steps or steps, wd_incr_style=wd_incr_style, **kwargs)

    def step(self, increment: int = 1) -> None:  # type: ignore[override]
        super().step(increment)


def resolve_optimizer(optimizer_cls: Any, kwargs: dict[str, Any]) -> MegatronDistributedOptimizer:
    """'default', 'MegatronDistributedOptimizer', the class or an instance; anything else is refused."""
    if isinstance(optimizer_cls, MegatronDistributedOptimizer):
        if kwargs:
            raise MegatronConfigError(f"set_optimizer got a configured MegatronDistributedOptimizer and settings "
                                      f"{sorted(kwargs)}; pass one or the other.")
        return optimizer_cls
    if optimizer_cls in OPTIMIZER_NAMES or optimizer_cls is MegatronDistributedOptimizer:
        return MegatronDistributedOptimizer(**kwargs)
    name = optimizer_cls if isinstance(optimizer_cls, str) else getattr(optimizer_cls, "__name__", repr(optimizer_cls))
    raise MegatronConfigError(
        f"MegatronModel cannot use optimizer {name!r}: it trains with megatron-core's distributed optimizer only. "
        "Pass 'default' or 'MegatronDistributedOptimizer' (settings as kwargs: lr=, weight_decay=, adam_beta1=...)."
    )


def check_scheduler(scheduler_cls: Any) -> None:
    if scheduler_cls in SCHEDULER_NAMES or scheduler_cls is OptimizerParamScheduler:
        return
    name = scheduler_cls if isinstance(scheduler_cls, str) else getattr(scheduler_cls, "__name__",
                                                                          repr(scheduler_cls))
    raise MegatronConfigError(
        f"MegatronModel cannot use lr scheduler {name!r}: it schedules with megatron-core's OptimizerParamScheduler "
        "only. Pass 'default' or 'OptimizerParamScheduler' (lr_warmup_steps=, lr_decay_steps=, lr_decay_style=...)."
    )
