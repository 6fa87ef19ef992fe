"""Every extension point of twinkle, one documented stub per hook.

A plugin is a module (or object) holding functions decorated with :data:`hookimpl` whose names
match the stubs below. Installed packages expose their plugin through the ``twinkle``
entry-point group::

    [project.entry-points.twinkle]
    mybackend = "my_backend.plugin"

Each ``register_*`` hook returns a mapping ``name -> spec``. A spec is either a lazy reference
``"package.module:attribute"`` (imported only when the name is first resolved, so listing
components stays cheap) or a :class:`twinkle.registry.ComponentSpec` when the plugin wants to
add a description or explicitly override a name another plugin already registered. twinkle-core
ships its own components through these very hooks (``twinkle._builtin``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Union

import pluggy

if TYPE_CHECKING:
    from twinkle.registry import ComponentSpec

PROJECT_NAME = "twinkle"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Specs = Mapping[str, Union[str, "ComponentSpec"]]


@hookspec
def register_models() -> Specs:
    """TwinkleModel implementations, e.g. ``{"TransformersModel": "twinkle_hf.model:TransformersModel"}``.

    Resolved by ``twinkle.model.<Name>`` and by any API taking a model name.
    """


@hookspec
def register_losses() -> Specs:
    """Loss classes (subclasses of ``twinkle.loss.Loss``) or loss callables, for ``set_loss(name)``."""


@hookspec
def register_metrics() -> Specs:
    """Metric classes, for ``add_metric(name)``."""


@hookspec
def register_optimizers() -> Specs:
    """Optimizer classes, for ``set_optimizer(name)``; torch.optim's are registered by core."""


@hookspec
def register_lr_schedulers() -> Specs:
    """Learning-rate scheduler classes, for ``set_lr_scheduler(name)``."""


@hookspec
def register_templates() -> Specs:
    """Chat templates (``twinkle.template.Template`` subclasses), for ``set_template(name)``."""


@hookspec
def register_preprocessors() -> Specs:
    """Row preprocessors turning raw dataset rows into standard messages, for ``Dataset.map(name)``."""


@hookspec
def register_processors() -> Specs:
    """Input processors collating encoded rows into model inputs, for ``set_processor(name)``."""


@hookspec
def register_patches() -> Specs:
    """Model patches (``twinkle.patch.Patch``), for ``apply_patch(name)``."""


@hookspec
def register_kernels() -> Specs:
    """Kernel choices: each name maps to an object describing an op, its devices and availability.

    ``twinkle.kernel`` assembles its per-op chains from these.
    """


@hookspec
def register_precisions() -> Specs:
    """Precision providers beyond what torch autocast offers, e.g. ``"fp8"`` from Transformer Engine."""


@hookspec
def register_platforms() -> Specs:
    """Device platforms (``twinkle.platform.Platform`` subclasses): cpu, cuda, npu, ...

    Detection asks every registered platform whether it is available and picks the one with the
    highest priority.
    """


@hookspec
def register_samplers() -> Specs:
    """Samplers (``twinkle.sampler.Sampler`` subclasses) that generate completions with per-token logprobs.

    E.g. ``{"TorchSampler": "twinkle_hf.sampler:TorchSampler"}``; an RL loop samples with one, scores
    the samples with rewards and trains on them.
    """


@hookspec
def register_advantages() -> Specs:
    """Advantage estimators: callables ``(rewards, group_size, **options) -> advantages`` per sample.

    Core registers ``grpo`` (group-normalised), ``rloo`` (leave-one-out) and ``reward_minus_baseline``.
    """


@hookspec
def register_rewards() -> Specs:
    """Reward functions: callables ``(completion: str, **row) -> float`` scoring one sampled completion.

    A script adds its own with ``twinkle.reward.register_reward(name)`` or passes the function itself.
    """


@hookspec
def register_commands() -> Specs:
    """``twinkle`` sub-commands, e.g. ``{"serve": "twinkle_server.cli:main"}`` (twinkle-server's ``twinkle serve``).

    The target is a function ``main(argv: list[str]) -> int | None``. ``twinkle NAME ARGS...`` imports it
    only when NAME runs and passes it every argument after NAME (its own ``--help`` included); a
    ``ComponentSpec(description=...)`` gives the line ``twinkle --help`` shows.
    """


@hookspec
def register_probers() -> Specs:
    """Trainer probers (``prober_list``), e.g. ``{"AccProber": "twinkle.trainer.probes:AccProber"}``.

    A prober is a :class:`twinkle.trainer.probes.Prober` subclass: it attaches hooks to the model's modules
    and, at the Trainer's ``profile_step`` steps, records per-module activation, gradient or timing
    statistics, written under ``log_dir/probes`` and summarised to the experiment tracker.
    """
