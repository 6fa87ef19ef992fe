"""A megatron LoRA adapter <-> a PEFT adapter directory that ``PeftModel.from_pretrained`` loads on the HF model.

File keys are PEFT's (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``); the fused
``linear_qkv`` / ``linear_fc1`` adapters are split with the same layouts as the weights
(``bridge/layout.py``), their shared A repeated for each projection. The output layer's adapter is
``base_model.model.lm_head.lora_{A,B}.weight`` (B without megatron's vocabulary padding). peft's own
``save_pretrained`` puts a copy of the base ``lm_head`` weight next to a LoRA on it; loading checks that
it is this model's weight and drops it (the base model stays shared and frozen).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from twinkle.checkpoint import CheckpointError
from twinkle_megatron.bridge.config import ModelArgs
from twinkle_megatron.bridge.layout import to_hf, to_mcore
from twinkle_megatron.bridge.naming import LAYER_PREFIX, module_key
from twinkle_megatron.bridge.shard import shard
from twinkle_megatron.bridge.transfer import RankLayout, gather_tp
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.lora.inject import OUTPUT, hf_target_modules, lora_modules

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
#: the base weight peft saves with a LoRA on lm_head (``save_embedding_layers='auto'``)
_LM_HEAD_COPY = PEFT_PREFIX + "lm_head.base_layer.weight"


def _canonical_modules(model: nn.Module, adapter: str, layout: RankLayout) -> list[str]:
    """Canonical (global-layer) names of the modules carrying ``adapter`` on this rank."""
    out = []
    offset = layout.layers.start if layout.layers else 0
    for name, module in lora_modules(model).items():
        if adapter not in module.lora_A:
            continue
        if name == OUTPUT:
            out.append(name)
            continue
        found = LAYER_PREFIX.match(name)
        if found is None:
            raise CheckpointError(f"LoRA layer {name!r} is outside the decoder layers; it cannot be exported.")
        out.append(f"decoder.layers.{int(found.group(1)) + offset}." + name[found.end():])
    return sorted(out)


def canonical_tensor_names(model: nn.Module, adapter: str, layout: RankLayout) -> list[str]:
    return [f"{m}.lora_{ab}.weight" for m in _canonical_modules(model, adapter, layout) for ab in "AB"]


def export_adapter(model: nn.Module, adapter: str, args: ModelArgs, layout: RankLayout) -> dict[str, torch.Tensor]:
    """This stage's adapter tensors under PEFT file keys (full across TP)."""
    state = model.state_dict(keep_vars=True)
    keys = set(state)
    out: dict[str, torch.Tensor] = {}
    for name in canonical_tensor_names(model, adapter, layout):
        local = state[module_key(name, keys, layout.placement, adapter)].detach()
        for hf_name, tensor in to_hf(name, gather_tp(name, local, layout), args).items():
            out[PEFT_PREFIX + hf_name] = tensor
    return out


def drop_base_copies(model: nn.Module, tensors: dict[str, torch.Tensor], args: ModelArgs, layout: RankLayout,
                     where: str) -> dict[str, torch.Tensor]:
    """``tensors`` without peft's copy of the base ``lm_head`` weight, once it is checked to be this model's.

    Collective over TP when the copy is there (every rank reads the same file): the output weight (the
    embeddings when they are tied) is gathered to compare it whole.
    """
    if _LM_HEAD_COPY not in tensors:
        return tensors
    rest = {k: v for k, v in tensors.items() if k != _LM_HEAD_COPY}
    name = "embedding.word_embeddings.weight" if args.tie_word_embeddings else "output_layer.weight"
    state = model.state_dict(keep_vars=True)
    try:
        local = state[module_key(name, set(state), layout.placement)].detach()
    except KeyError:
        return rest  # a pipeline stage without that weight: the stage holding it checks
    (base,) = to_hf(name, gather_tp(name, local, layout), args).values()
    saved = tensors[_LM_HEAD_COPY]
    if tuple(saved.shape) != tuple(base.shape) or not torch.equal(saved.to(base.dtype).cpu(), base.cpu()):
        raise CheckpointError(f"{where} carries an lm_head weight (lm_head.base_layer.weight) that differs from this "
                              "model's; a MegatronModel adapter keeps the base model frozen, so it loads only adapters "
                              "saved on this base model.")
    return rest


def import_adapter(model: nn.Module, adapter: str, tensors: dict[str, torch.Tensor], args: ModelArgs,
                   layout: RankLayout, where: str) -> None:
    """Load PEFT-keyed tensors into adapter ``adapter``; every name and shape is checked before copying."""
    tensors = drop_base_copies(model, tensors, args, layout, where)
    hf = {k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k: v for k, v in tensors.items()}
    state = model.state_dict(keep_vars=True)
    keys = set(state)
    names = canonical_tensor_names(model, adapter, layout)
    planned = []
    for name in names:
        try:
            full = to_mcore(name, hf, args, layout.padded_vocab)
        except KeyError as exc:
            raise CheckpointError(f"{where} lacks the LoRA tensor {exc} that adapter {adapter!r} needs; it was saved "
                                  "with other target_modules.") from None
        target = state[module_key(name, keys, layout.placement, adapter)]
        piece = shard(name, full, layout.tp_rank, layout.tp_size)
        if tuple(piece.shape) != tuple(target.shape):
            raise CheckpointError(f"{where}: {name} has shape {tuple(piece.shape)} for this rank, the adapter has "
                                  f"{tuple(target.shape)} (different r?).")
        planned.append((target, piece))
    with torch.no_grad():
        for target, piece in planned:
            target.data.copy_(piece.to(dtype=target.dtype, device=target.device))


def adapter_config(config: Any, suffixes: list[str], base_model: str | None) -> Any:
    """The peft LoraConfig to write: HF target names, inference mode, causal-LM task."""
    out = copy.deepcopy(config)
    out.target_modules = set(hf_target_modules(suffixes))
    out.inference_mode = True
    out.base_model_name_or_path = base_model
    out.task_type = out.task_type or "CAUSAL_LM"
    return out


def write_adapter(directory: Path, tensors: dict[str, torch.Tensor], config: Any) -> None:
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(directory / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    config.save_pretrained(str(directory))


def read_adapter(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    weights, config = directory / ADAPTER_WEIGHTS, directory / ADAPTER_CONFIG
    if not weights.is_file() or not config.is_file():
        raise CheckpointError(f"{str(directory)!r} is not a PEFT adapter directory ({ADAPTER_WEIGHTS} and "
                              f"{ADAPTER_CONFIG} are needed).")
    try:
        return load_file(str(weights)), json.loads(config.read_text(encoding="utf-8"))
    except Exception as exc:
        raise CheckpointError(f"Could not read the adapter in {str(directory)!r}: {exc}") from exc


def adapter_source(config_or_dir: Any) -> tuple[Path | None, Any, dict[str, torch.Tensor] | None]:
    """(directory, LoraConfig, PEFT-keyed weights) from a peft config or a PEFT adapter directory."""
    from peft import LoraConfig, PeftConfig

    if isinstance(config_or_dir, PeftConfig):
        return None, config_or_dir, None
    if isinstance(config_or_dir, (str, os.PathLike)):
        directory = Path(config_or_dir).expanduser()
        weights, _ = read_adapter(directory)
        config = PeftConfig.from_pretrained(str(directory))
        if not isinstance(config, LoraConfig):
            raise MegatronConfigError(f"{str(directory)!r} holds a {type(config).__name__} adapter; MegatronModel "
                                      "loads LoRA adapters only.")
        config.inference_mode = False
        return directory, config, weights
    raise TypeError(f"config_or_dir must be a peft LoraConfig or an adapter directory, got "
                    f"{type(config_or_dir).__name__}.")
