"""Checks that a loaded side file fits what it will be loaded into, before anything is changed.

``torch.optim.lr_scheduler.LRScheduler.load_state_dict`` is ``__dict__.update``: it accepts any
dict and breaks the scheduler silently. These checks make a resume all-or-nothing: every file is
read and compared with the live object first, and only then is anything applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Number
from typing import Any

from twinkle.checkpoint.errors import CheckpointError


def check_state_like(saved: Any, current: Mapping[str, Any], where: str, what: str) -> None:
    """``saved`` has the keys of ``current`` (a live ``state_dict()``) with values of the same kind.

    ``where`` names the file, ``what`` the object (e.g. "group 'sft''s lr scheduler").
    """
    if not isinstance(saved, Mapping):
        raise CheckpointError(f"{where} holds {type(saved).__name__}, not the state of {what}; the checkpoint is "
                              "corrupt or was written by another program.")
    missing, unexpected = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
    if missing or unexpected:
        raise CheckpointError(f"{where} does not fit {what}: missing {missing[:5]}, unexpected {unexpected[:5]}. "
                              "Was it saved with another scheduler/scaler configuration?")
    for key, value in current.items():
        problem = _difference(saved[key], value)
        if problem:
            raise CheckpointError(f"{where} does not fit {what}: {key!r} {problem}.")


def _difference(saved: Any, current: Any) -> str | None:
    """Why ``saved`` cannot stand where ``current`` is, or None when it can (None on either side is fine)."""
    import torch

    if saved is None or current is None:
        return None
    if isinstance(current, torch.Tensor):
        if not isinstance(saved, torch.Tensor) or tuple(saved.shape) != tuple(current.shape):
            return f"is {_kind(saved)}, expected a tensor of shape {tuple(current.shape)}"
        return None
    if isinstance(current, Number) and not isinstance(current, bool):
        return None if isinstance(saved, Number) else f"is {_kind(saved)}, expected a number"
    if isinstance(current, (str, bool)):
        return None if isinstance(saved, type(current)) else f"is {_kind(saved)}, expected {type(current).__name__}"
    if isinstance(current, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(current):
            return f"is {_kind(saved)}, expected a list of {len(current)}"
        for i, (s, c) in enumerate(zip(saved, current)):
            problem = _difference(s, c)
            if problem:
                return f"[{i}] {problem}"
        return None
    if isinstance(current, Mapping):
        return None if isinstance(saved, Mapping) else f"is {_kind(saved)}, expected a mapping"
    return None


def _kind(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a tensor of shape {tuple(shape)}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return f"{type(value).__name__} {value!r}"[:80]


def check_optimizer_state(optimizer: Any, state_dict: Any) -> None:
    """Raise ValueError unless ``state_dict`` fits the torch ``optimizer`` (same groups, same parameter counts)."""
    if not isinstance(state_dict, Mapping) or "param_groups" not in state_dict or "state" not in state_dict:
        raise ValueError("the saved optimizer state has no 'param_groups'/'state' (saved by another optimizer?)")
    groups = state_dict["param_groups"]
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) and "params" in g for g in groups):
        raise ValueError("the saved optimizer's 'param_groups' is not a list of groups with 'params'")
    if not isinstance(state_dict["state"], Mapping):
        raise ValueError("the saved optimizer's 'state' is not a mapping")
    saved = [len(g["params"]) for g in groups]
    current = [len(g["params"]) for g in optimizer.param_groups]
    if saved != current:
        raise ValueError(f"the saved optimizer has parameter groups of sizes {saved}, this one has {current} "
                         "(different adapter, model, or optimizer type)")
    # torch's load_state_dict takes the saved groups whole: a hyper-parameter this optimizer needs and they lack
    # (SGD's momentum in an AdamW state) fails at the next step() with a raw KeyError. Flags (bool/None defaults)
    # are left out: a newer torch adds those and fills them in itself (``__setstate__``).
    needed = [k for k, v in getattr(optimizer, "defaults", {}).items()
              if isinstance(v, (int, float, tuple)) and not isinstance(v, bool)]
    lacking = sorted({k for g in groups for k in needed if k not in g})
    if lacking:
        raise ValueError(f"the saved optimizer state lacks {lacking}, which this {type(optimizer).__name__} needs: it "
                         "was saved by another optimizer type. Resume with the optimizer it was trained with, or "
                         "load its weights alone (resume_only_model=True; the Trainer: load_from)")
