"""Local vs Ray: the runtime the Trainer starts and how it follows the optimizer step.

In ray mode the model is a proxy for ``infra.dp_size`` actors; the Trainer's loop stays in this
process (the DataLoader yields whole global batches, the proxy slices them by data rank), and it
only calls the model's methods, never reads its attributes (those would be copies from rank 0).
"""

from __future__ import annotations

from typing import Any

from twinkle.trainer._validate import ConfigError
from twinkle.trainer.config import TrainerConfig

#: The device group the Trainer's model actors form in ray mode.
RAY_GROUP = "trainer"


def device_mesh(cfg: TrainerConfig) -> Any:
    """The job's mesh from ``cfg.infra``; ConfigError when the sizes do not fit the processes (checked early).

    Under torchrun (local) the world is the launched processes and data parallelism takes what the
    other sizes leave; in ray mode the world is ``dp_size`` times the other sizes.
    """
    import os

    from twinkle.mesh import DeviceMesh

    infra = cfg.infra
    local = infra.mode != "ray"
    try:
        return DeviceMesh.from_sizes(
            dp_size=None if local else infra.dp_size, fsdp_size=infra.fsdp_size, tp_size=infra.tp_size,
            pp_size=infra.pp_size, cp_size=infra.cp_size, ep_size=infra.ep_size,
            sequence_parallel=infra.sequence_parallel,
            world_size=int(os.environ.get("WORLD_SIZE", "1") or 1) if local else None)
    except ValueError as exc:
        raise ConfigError(f"infra: {exc}") from None


def initialize(cfg: TrainerConfig) -> Any:
    """``twinkle.initialize`` with the job's mesh; ray mode declares one group of all its ranks."""
    import twinkle

    infra, mesh = cfg.infra, device_mesh(cfg)
    if infra.mode != "ray":
        return twinkle.initialize(mode="local", global_device_mesh=mesh, seed=cfg.seed)
    from twinkle import DeviceGroup

    return twinkle.initialize(
        mode="ray", global_device_mesh=mesh,
        groups=[DeviceGroup(RAY_GROUP, mesh.world_size, device_type=infra.device_type)], seed=cfg.seed,
        num_cpus=infra.num_cpus, ray_address=infra.ray_address, timeout_s=infra.timeout_s,
    )


def model_kwargs(cfg: TrainerConfig, model_cls: Any) -> dict[str, Any]:
    """Extra constructor arguments: ``remote_group`` in ray mode, and the options the model class takes."""
    kwargs: dict[str, Any] = {"remote_group": RAY_GROUP} if cfg.infra.mode == "ray" else {}
    accepted = _init_parameters(model_cls)
    if cfg.model.strategy is not None:
        if "strategy" not in accepted:
            raise ConfigError(f"model.strategy: {cfg.model.type} takes no strategy; leave it unset.")
        kwargs["strategy"] = cfg.model.strategy
    if "strict_load" in accepted:
        kwargs["strict_load"] = cfg.strict_load
    return kwargs


def _init_parameters(model_cls: Any) -> set[str]:
    """Named constructor parameters of ``model_cls``, following ``**kwargs`` handed on to a base class's."""
    import inspect

    names: set[str] = set()
    for klass in model_cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        params = inspect.signature(init).parameters
        names |= {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return names


def progress(cfg: TrainerConfig, model: Any, adapter: str | None) -> GroupProgress | CountedProgress:
    """How the Trainer follows the step: the model's group (local) or its own count (ray)."""
    if cfg.infra.mode == "ray":
        return CountedProgress(cfg.dataloader.gradient_accumulation_steps)
    return GroupProgress(model, adapter)


def shutdown(cfg: TrainerConfig) -> None:
    """Stop the Ray actors (and a Ray session ``initialize`` began); nothing in local mode."""
    if cfg.infra.mode == "ray":
        import twinkle

        twinkle.shutdown()


class GroupProgress:
    """Step and accumulation position read from the model's own optimizer group (local mode)."""

    def __init__(self, model: Any, adapter: str | None) -> None:
        self._group = model.optimizer_group[adapter or next(iter(model.optimizer_group))]

    @property
    def cur_step(self) -> int:
        return self._group.cur_step

    @property
    def micro_step(self) -> int:
        return self._group.micro_step

    def micro_batch_done(self) -> None:
        """Called after each ``clip_grad_and_step``; the group counts by itself."""

    def restore(self, progress: dict[str, int]) -> None:
        """Called with ``resume_from_checkpoint``'s result; the group restored itself."""

    def check(self, metric: dict[str, Any]) -> None:
        """Nothing to reconcile: the group is the source of truth."""


class CountedProgress:
    """Step and accumulation position counted here (ray mode), as the model's group counts them.

    ``clip_grad_and_step`` steps the optimizer every ``gradient_accumulation_steps`` calls unless the
    model skips the step (``skipped_steps`` in the metrics grows); the step number in each training
    metric (``step``) is checked against the count.
    """

    def __init__(self, gradient_accumulation_steps: int, cur_step: int = 0) -> None:
        self.gas, self.cur_step, self.micro_step = gradient_accumulation_steps, cur_step, 0
        self.skipped = 0

    def micro_batch_done(self) -> None:
        self.micro_step += 1
        if self.micro_step >= self.gas:
            self.micro_step, self.cur_step = 0, self.cur_step + 1

    def restore(self, progress: dict[str, int]) -> None:
        """Continue from a checkpoint's progress: a fresh accumulation window at its step."""
        self.cur_step, self.micro_step, self.skipped = int(progress["cur_step"]), 0, 0

    def check(self, metric: dict[str, Any]) -> None:
        skipped = int(metric.get("skipped_steps", self.skipped))
        if skipped > self.skipped:  # the model skipped steps (inf/NaN): they were counted here as taken
            self.cur_step -= skipped - self.skipped
            self.skipped = skipped
        step = metric.get("step")
        if step is not None and int(step) != self.cur_step:
            raise RuntimeError(f"The model actors are at step {int(step)} but the Trainer counted {self.cur_step}; "
                               "the model's gradient accumulation differs from dataloader.gradient_accumulation_steps.")
