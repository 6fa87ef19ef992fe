"""Optimizer state of megatron-core's distributed optimizer through megatron's distributed checkpointing.

The optimizer state is sharded over data-parallel ranks (and TP/PP), so it cannot be one
``optimizer.pt``: it is a dist-checkpoint directory ``optimizer_dist/`` written collectively by all
ranks, keyed by the model's sharded state dict. The format is megatron's ``dp_reshardable`` (fully
parallel, no gather): a resume may change the data-parallel size, not TP/PP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

OPTIMIZER_DIR = "optimizer_dist"
_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _model_sharded(driver: Any) -> dict[str, Any]:
    """The sharded state dict of the module the driver's Megatron-DDP chunk wraps."""
    return driver.chunks[0].module.sharded_state_dict()


def save_optimizer(driver: Any, directory: Path) -> None:
    """Collective: every rank calls it with the same ``directory``."""
    from megatron.core import dist_checkpointing

    target = directory / OPTIMIZER_DIR
    target.mkdir(exist_ok=True)
    sharded = {"optimizer": driver.optimizer.sharded_state_dict(_model_sharded(driver), is_loading=False,
                                                                    metadata=_METADATA)}
    dist_checkpointing.save(sharded, str(target))


def _materialise_adam_state(optimizer: Any) -> None:
    """Give never-stepped torch Adam(W) optimizers their state tensors.

    Without Apex/TE, megatron-core 0.16 wraps torch's Adam, whose state appears at the first step;
    ``DistributedOptimizer.state_dict()`` (needed to build the sharded state for loading) asserts it
    exists. Zeros are placeholders: the checkpoint overwrites them.
    """
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(sub, "optimizer", None)
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            continue
        for group in inner.param_groups:
            for param in group["params"]:
                if not inner.state[param]:
                    inner.state[param] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                                          "exp_avg_sq": torch.zeros_like(param)}


def check_optimizer(directory: Path) -> None:
    """Refuse an ``optimizer_dist/`` whose pickled parts would run code when megatron's reader loads them.

    megatron reads the DCP metadata with ``pickle.load`` and byte values with ``weights_only=False``;
    twinkle-core checks both safely first (``twinkle.checkpoint.dcp_safe``).
    """
    from twinkle.checkpoint.dcp_safe import verify_dcp_directory

    verify_dcp_directory(directory / OPTIMIZER_DIR)


def load_optimizer(driver: Any, directory: Path) -> None:
    """Collective: restore the optimizer (fp32 main parameters and moments) saved by :func:`save_optimizer`."""
    from megatron.core import dist_checkpointing

    check_optimizer(directory)
    _materialise_adam_state(driver.optimizer)

    sharded = {"optimizer": driver.optimizer.sharded_state_dict(_model_sharded(driver), is_loading=True,
                                                                    metadata=_METADATA)}
    state = dist_checkpointing.load(sharded, str(directory / OPTIMIZER_DIR))
    with torch.no_grad():  # fp32 runs: the main parameters are views of the (grad-requiring) model weights
        driver.optimizer.load_state_dict(state["optimizer"])
    _restore_steps(driver.optimizer)


def _restore_steps(optimizer: Any) -> None:
    """Put the saved step count into every torch-Adam parameter state, one tensor each.

    megatron-core 0.16's torch-Adam fallback (no Apex/TE) restores the step into the parameter
    groups but leaves the per-parameter ``step`` tensors at their placeholder (and shared between
    parameters, which torch Adam would advance once per parameter): bias correction would restart.
    """
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(sub, "optimizer", None)
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            continue
        for group in inner.param_groups:
            if "step" not in group:
                continue
            for param in group["params"]:
                inner.state[param]["step"] = torch.tensor(float(group["step"]))


def has_optimizer(directory: Path) -> bool:
    return (directory / OPTIMIZER_DIR).is_dir()
