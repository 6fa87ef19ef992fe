"""A job's runtime and model from typed configs: what the Trainer and ``twinkle serve`` both start.

:class:`ModelConfig` names a registered model class and its options, :class:`InfraConfig` where it
runs: in this process (or each ``torchrun`` process) or as Ray actors driven from here.
:func:`start` initialises twinkle for them, :func:`build_model` makes the model (in ray mode a
proxy for its actors) and :func:`stop` ends what :func:`start` began. Importing this module loads
no torch; the functions do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from twinkle.config import Config, ConfigError, opt
from twinkle.precision import MIXED_PRECISION
from twinkle.runtime import MODES

#: The embedded tiny model (weights, tokenizer and chat template shipped in twinkle-core).
TINY_MODEL = "twinkle://tiny-qwen"
#: The device group the model's actors form in ray mode.
RAY_GROUP = "trainer"


@dataclass
class ModelConfig(Config):
    """Which registered TwinkleModel to build, from what weights, with which constructor options."""

    type: str = opt("TransformersModel", "registered model class (twinkle plugins --kind model)")
    model_id: str = opt(TINY_MODEL, "weights: hub id (ms://, hf://), local directory or twinkle:// embedded model")
    mixed_precision: str = opt("no", "autocast precision", choices=MIXED_PRECISION)
    strategy: str | None = opt(None, "how the backend wraps the model for several processes (TransformersModel: "
                                     "accelerate | native_fsdp); none = the backend's default")
    gradient_checkpointing: bool = opt(False, "recompute activations in backward: less memory, the same losses")
    kwargs: dict[str, Any] = opt(help="extra constructor arguments of the model class (a table)", factory=dict)

    def check(self) -> None:
        if not self.type.strip():
            raise ConfigError("type: must name a registered model, e.g. 'TransformersModel'.")


@dataclass
class InfraConfig(Config):
    """Where the model runs: ``local`` (this process, or each torchrun process) or ``ray`` actors.

    The parallel sizes build the device mesh (``DeviceMesh.from_sizes``): under torchrun the
    data-parallel size is what the launched processes leave after fsdp * tp * pp * cp. With ``ray``
    this process drives ``dp_size`` times that many model actors on ``device_type`` devices in a
    Ray cluster it starts (``num_cpus``) or joins (``ray_address``).
    """

    mode: str = opt("local", "local (this process or each torchrun process) | ray", choices=MODES,
                    top_aliases=("infra_mode",))
    dp_size: int = opt(1, "ray: data-parallel actors (under torchrun: what the processes leave)", min=1)
    fsdp_size: int = opt(1, "FSDP shard-group size", min=1)
    tp_size: int = opt(1, "tensor-parallel size (Megatron backend)", min=1)
    pp_size: int = opt(1, "pipeline-parallel size (Megatron backend)", min=1)
    cp_size: int = opt(1, "context (sequence) parallel size; sp_size is xtuner's name for it", min=1,
                       aliases=("sp_size",), top_aliases=("sp_size",))
    ep_size: int = opt(1, "expert-parallel size (MoE)", min=1)
    sequence_parallel: bool = opt(False, "shard activations along the sequence in tensor-parallel regions")
    device_type: Literal["cpu", "gpu", "npu"] = opt("cpu", "ray: the actors' devices")
    num_cpus: int | None = opt(None, "ray: CPUs of the cluster this process starts", min=1)
    ray_address: str | None = opt(None, "ray: join this cluster instead of starting one")
    timeout_s: float | None = opt(None, "ray: seconds a remote call may take; local: collective timeout", gt=0)

    def check(self) -> None:
        if self.mode == "local" and (self.dp_size != 1 or self.num_cpus or self.ray_address):
            raise ConfigError("dp_size / num_cpus / ray_address: only used with infra.mode 'ray' (under torchrun the "
                              "data-parallel size is the number of launched processes).")


def device_mesh(infra: InfraConfig) -> Any:
    """The job's mesh; a ConfigError when the sizes do not fit the processes (checked before anything loads).

    Under torchrun (local) the world is the launched processes and data parallelism takes what the
    other sizes leave; in ray mode the world is ``dp_size`` times the other sizes.
    """
    import os

    from twinkle.mesh import DeviceMesh

    local = infra.mode != "ray"
    try:
        return DeviceMesh.from_sizes(
            dp_size=None if local else infra.dp_size, fsdp_size=infra.fsdp_size, tp_size=infra.tp_size,
            pp_size=infra.pp_size, cp_size=infra.cp_size, ep_size=infra.ep_size,
            sequence_parallel=infra.sequence_parallel,
            world_size=int(os.environ.get("WORLD_SIZE", "1") or 1) if local else None)
    except ValueError as exc:
        raise ConfigError(f"infra: {exc}") from None


def start(infra: InfraConfig, seed: int | None, backend: str | None = None) -> Any:
    """``twinkle.initialize`` with the job's mesh; ray mode declares one group (:data:`RAY_GROUP`) of all ranks.

    ``backend``: the torch.distributed backend of a multi-process local run (None: the platform's).
    """
    import twinkle

    mesh = device_mesh(infra)
    if infra.mode != "ray":
        try:
            return twinkle.initialize(mode="local", global_device_mesh=mesh, seed=seed, backend=backend)
        except (ValueError, RuntimeError) as exc:
            if backend is None:
                raise
            raise ConfigError(f"backend: {backend!r} could not start torch.distributed ({exc}); use one this machine "
                              "has (gloo on CPU, nccl on NVIDIA GPUs, 'cpu:gloo,cuda:nccl') or leave it unset.",
                              option="backend") from exc
    from twinkle import DeviceGroup

    return twinkle.initialize(
        mode="ray", global_device_mesh=mesh,
        groups=[DeviceGroup(RAY_GROUP, mesh.world_size, device_type=infra.device_type)], seed=seed,
        num_cpus=infra.num_cpus, ray_address=infra.ray_address, timeout_s=infra.timeout_s,
    )


def stop(infra: InfraConfig) -> None:
    """Stop the Ray actors (and a Ray session :func:`start` began); nothing in local mode."""
    if infra.mode == "ray":
        import twinkle

        twinkle.shutdown()


def build_model(model: ModelConfig, infra: InfraConfig, *, model_id: str | None = None,
                strict_load: bool | None = None, **options: Any) -> Any:
    """The registered ``model.type`` with the configured options (ray mode: on :data:`RAY_GROUP`'s actors).

    ``model_id`` replaces ``model.model_id`` (a Trainer's ``load_from``); ``options`` are more
    constructor arguments (the server's LoRA slots); ``strict_load`` goes to classes that take it.
    Gradient checkpointing is applied as the ``GradientCheckpointing`` patch. Dependencies' warnings
    that do not apply to this model are silenced (:mod:`twinkle.known_warnings`).
    """
    from twinkle import known_warnings
    from twinkle.registry import resolve

    known_warnings.silence(model.model_id)

    cls = resolve("model", model.type)
    accepted = _init_parameters(cls)
    kwargs: dict[str, Any] = {**model.kwargs, **options}
    if infra.mode == "ray":
        kwargs["remote_group"] = RAY_GROUP
    if model.strategy is not None:
        if "strategy" not in accepted:
            raise ConfigError(f"model.strategy: {model.type} takes no strategy; leave it unset.")
        kwargs["strategy"] = model.strategy
    if strict_load is not None and "strict_load" in accepted:
        kwargs["strict_load"] = strict_load
    try:
        built = cls(model_id=model_id or model.model_id, mixed_precision=model.mixed_precision, **kwargs)
    except TypeError as exc:  # model.kwargs reach the model class (and through it the HF model's constructor)
        bad = [key for key in model.kwargs if f"'{key}'" in str(exc)]
        if not bad:
            raise
        raise ConfigError(f"model.kwargs: {bad[0]!r} is not an argument of {model.type} or of the model it builds "
                          f"({exc}); remove it from model.kwargs, or check its spelling.", option="model.kwargs",
                          value=bad[0]) from exc
    if model.gradient_checkpointing:
        built.apply_patch("GradientCheckpointing")
    return built


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
