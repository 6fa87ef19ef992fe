"""Where MegatronModel's HF config and weights come from: a hub id, a local directory, or a config."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from twinkle.checkpoint import CheckpointError
from twinkle_megatron.bridge.config import ModelArgs
from twinkle_megatron.bridge.hf_io import SafetensorsReader, TensorLookup
from twinkle_megatron.bridge.transfer import RankLayout, load_into


def resolve_model_path(model_id: str) -> str:
    from twinkle.hub import resolve_path

    return str(resolve_path(model_id, repo_type="model"))


def _has_weights(path: Path) -> bool:
    return any(p.suffix in (".safetensors", ".bin") or p.name.endswith(".index.json") for p in path.iterdir()
               if p.name != "adapter_model.safetensors")


def load_hf_config(model_id: str | None, config: Any) -> tuple[Any, str | None]:
    """(HF config, directory with weights or None). Only the config is read here: no weights."""
    from transformers import AutoConfig, PretrainedConfig

    if model_id is None:
        if config is None:
            raise ValueError("MegatronModel needs model_id= (hub id or local HF directory) or config= (random init).")
        if not isinstance(config, PretrainedConfig):
            raise TypeError(f"config must be a transformers PretrainedConfig, got {type(config).__name__}.")
        return copy.deepcopy(config), None
    path = Path(resolve_model_path(model_id))
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        raise ValueError(f"{str(path)!r} holds a LoRA adapter, not a full model. Build MegatronModel from the base "
                         f"model, then add_adapter_to_model(name, {str(path)!r}).")
    hf_config = copy.deepcopy(config) if config is not None else AutoConfig.from_pretrained(str(path))
    return hf_config, str(path) if path.is_dir() and _has_weights(path) else None


def load_weights(module: torch.nn.Module, path: str, args: ModelArgs, layout: RankLayout) -> int:
    """Read this rank's tensors from the safetensors in ``path`` into ``module``."""
    reader = SafetensorsReader(path)
    try:
        return load_into(module, TensorLookup(reader), args, layout, available=set(reader.keys()))
    except KeyError as exc:
        raise CheckpointError(f"{path!r} does not hold a {args.family.architecture} checkpoint this config "
                              f"describes: {exc}") from exc
