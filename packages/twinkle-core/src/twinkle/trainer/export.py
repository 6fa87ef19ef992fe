"""HF-format exports every ``hf_interval`` steps into ``work_dir/hf/step-N`` (LoRA merged on request)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from twinkle import collective
from twinkle.checkpoint import save_tokenizer, shared_atomic_directory
from twinkle.config import ConfigError
from twinkle.trainer.store import checkpoint_name, discard, list_checkpoints


def export_hf(trainer: Any, step: int) -> str:
    """Write one export atomically and drop the oldest beyond ``hf_max_keep``; return its path.

    Every rank calls this (a sharded model's save needs them all); a merged export is rank 0's.
    """
    cfg, root = trainer.config, trainer.work_dir / "hf"
    name = checkpoint_name(step)
    if cfg.lora.enabled and cfg.lora.merge_on_export:
        with shared_atomic_directory(root / name) as tmp:
            if collective.rank() == 0:
                save_merged(trainer.model, trainer.adapter, tmp)
    else:
        trainer.model.save(name, output_dir=str(root), adapter_name=trainer.adapter)
    keep = cfg.hf_max_keep
    if keep is not None and keep > 0 and collective.rank() == 0:
        for _, path in list_checkpoints(root)[:-keep]:
            discard(path)
    return str(root / name)


def save_merged(model: Any, adapter: str, directory: Path) -> None:
    """Save the base model with ``adapter`` merged in, from a copy, so training continues unmerged."""
    peft_model = getattr(model, "model", None)
    peft_model = getattr(peft_model, "module", peft_model)  # DDP-style wrappers
    if not hasattr(peft_model, "merge_and_unload"):
        raise ConfigError(f"lora.merge_on_export: {type(model).__name__} does not expose a peft model to merge; "
                          "export the adapter instead (merge_on_export=false).")
    merged_source = copy.deepcopy(peft_model)
    merged_source.set_adapter(adapter)
    _untie_output_embeddings(merged_source.get_base_model())
    merged = merged_source.merge_and_unload()
    merged.save_pretrained(str(directory))
    template = model.optimizer_group[adapter].template if hasattr(model, "optimizer_group") else None
    save_tokenizer(directory, template, getattr(model, "model_path", None))


def _untie_output_embeddings(base: Any) -> None:
    """Give a tied lm_head its own weight, so merging a LoRA on it does not also change the embeddings."""
    import torch

    out, inp = base.get_output_embeddings(), base.get_input_embeddings()
    out = getattr(out, "base_layer", out)  # a LoRA-wrapped lm_head
    if out is None or inp is None or out.weight.data_ptr() != inp.weight.data_ptr():
        return
    out.weight = torch.nn.Parameter(out.weight.detach().clone(), requires_grad=out.weight.requires_grad)
    for config in {id(c): c for c in (base.config, getattr(base.config, "get_text_config", lambda: None)())
                   if c is not None}.values():
        config.tie_word_embeddings = False
