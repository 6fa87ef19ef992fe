"""Weights on disk in the layouts HF tools read: ``save_pretrained`` dirs and PEFT adapter dirs.

Loading checks every key and shape before copying anything, so a wrong checkpoint raises and
leaves the model untouched. Only safetensors files are read.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from twinkle.checkpoint import CheckpointError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
FULL_WEIGHTS = "model.safetensors"
FULL_INDEX = "model.safetensors.index.json"


# ----------------------------------------------------------------------- adapters
def adapter_state_dict(model: PeftModel, adapter_name: str) -> dict[str, torch.Tensor]:
    """The adapter's weights under PEFT's file keys (adapter name stripped)."""
    return get_peft_model_state_dict(model, adapter_name=adapter_name)


def write_adapter(state: Mapping[str, torch.Tensor], config: Any, directory: Path,
                  base_model_path: str | None = None) -> None:
    """``adapter_model.safetensors`` + ``adapter_config.json`` flat in ``directory`` from ``state`` (full tensors:
    gathered first when the model is sharded) and its peft config.

    (``PeftModel.save_pretrained`` puts non-default adapters in a sub-directory; a flat layout loads with
    ``PeftModel.from_pretrained(base, directory)`` whatever the adapter's name.)
    """
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    save_file(state, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = copy.deepcopy(config)
    config.inference_mode = True
    if base_model_path is not None:
        config.base_model_name_or_path = base_model_path
    config.save_pretrained(str(directory))


def load_adapter_weights(model: PeftModel, adapter_name: str, directory: Path) -> None:
    """Load an adapter directory's weights into the existing adapter ``adapter_name``."""
    path = directory / ADAPTER_WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{str(directory)!r} has no {ADAPTER_WEIGHTS} (a LoRA checkpoint written by save()).")
    state = _read_safetensors(path)
    _check_state(state, adapter_state_dict(model, adapter_name), str(path), allow_missing=set())
    set_peft_model_state_dict(model, state, adapter_name=adapter_name)


# --------------------------------------------------------------------- full model
def save_full(model: torch.nn.Module, directory: Path) -> None:
    """``save_pretrained`` (safetensors) of the full transformers model."""
    model.save_pretrained(str(directory))


def weight_files(directory: str | Path) -> dict[str, Path] | None:
    """Every tensor name of a ``save_pretrained`` directory and the safetensors file holding it (from the
    index, or the single ``model.safetensors``); None when the directory has neither."""
    from safetensors import safe_open

    directory = Path(directory)
    index = directory / FULL_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return {key: directory / file for key, file in weight_map.items()}
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{str(index)!r} is not a valid safetensors index ({exc}).") from exc
    single = directory / FULL_WEIGHTS
    if not single.is_file():
        return None
    try:
        with safe_open(str(single), framework="pt") as handle:
            return dict.fromkeys(handle.keys(), single)
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{str(single)!r} is not a readable safetensors file ({type(exc).__name__}: "
                              f"{exc}).") from exc


def read_full_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``save_pretrained`` directory (single file or sharded with an index)."""
    files = weight_files(directory)
    if files is None:
        raise CheckpointError(f"{str(directory)!r} has no {FULL_WEIGHTS} or {FULL_INDEX} (full-model weights).")
    state: dict[str, torch.Tensor] = {}
    for file in sorted(set(files.values())):
        state.update(_read_safetensors(file))
    return state


def load_full_weights(model: torch.nn.Module, directory: Path) -> None:
    """Load a ``save_pretrained`` directory into ``model``; tied weights may be absent from the files."""
    state = read_full_weights(directory)
    current = model.state_dict()
    _check_state(state, current, str(directory), allow_missing=_tied_keys(current))
    model.load_state_dict(state, strict=False)


def _tied_keys(current: Mapping[str, torch.Tensor]) -> set[str]:
    """Keys whose tensor shares storage with an earlier key (e.g. lm_head tied to the embeddings)."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for key, tensor in current.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen and tensor.numel():
            tied.update({key, seen[ptr]})
        else:
            seen[ptr] = key
    return tied


# ------------------------------------------------------------------------ helpers
def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file ({type(exc).__name__}: {exc}).") \
            from exc


def _check_state(state: Mapping[str, Any], current: Mapping[str, torch.Tensor], where: str,
                 allow_missing: set[str]) -> None:
    unexpected = sorted(set(state) - set(current))
    missing = sorted(set(current) - set(state) - allow_missing)
    mismatched = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(current[k].shape)}"
                  for k in state if k in current and tuple(state[k].shape) != tuple(current[k].shape)]
    problems = []
    if unexpected:
        problems.append(f"{len(unexpected)} unknown keys (e.g. {unexpected[:3]})")
    if missing:
        problems.append(f"{len(missing)} missing keys (e.g. {missing[:3]})")
    if mismatched:
        problems.append(f"{len(mismatched)} shape mismatches (e.g. {mismatched[:2]})")
    if problems:
        raise CheckpointError(f"The weights in {where} do not fit this model: {'; '.join(problems)}. "
                              "Was it saved from a different model or adapter configuration?")
