"""Optimizer groups of a MegatronModel and LoRA adapters on megatron's parallel linear layers.

As in TransformersModel: without adapters one group, ``'default'``, trains every parameter; the
first ``add_adapter_to_model`` freezes the base model, removes the full-model group (its template,
processor and loss carry over) and every adapter becomes its own group. Only the adapter of the
group being run is active in a forward.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from twinkle.model.optimizer_group import (
    DEFAULT_GROUP,
    OptimizerGroup,
    check_accumulation_steps,
    check_adapter_name,
    lookup_group,
)
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.lora.inject import (
    adapter_parameters,
    add_lora,
    check_lora_config,
    set_active,
    target_suffixes,
    with_default_targets,
)
from twinkle_megatron.lora.peft_io import import_adapter, read_adapter

_GROUP_OPTIONS = ("gradient_accumulation_steps",)


class GroupsMixin:
    """Group lookup and adapters; expects ``self.gpt``, ``self.optimizer_group`` and ``self.adapters``."""

    gpt: torch.nn.Module
    optimizer_group: dict[str, OptimizerGroup]
    adapters: dict[str, dict[str, Any]]

    def _group(self, adapter_name: str | None = None) -> OptimizerGroup:
        return lookup_group(self.optimizer_group, adapter_name)

    def _activate(self, group: OptimizerGroup) -> None:
        set_active(self.gpt, group.name if group.is_adapter else None)

    def _group_named_parameters(self, group: OptimizerGroup) -> list[tuple[str, torch.nn.Parameter]]:
        if group.is_adapter:
            return adapter_parameters(self.gpt, group.name)
        return [(n, p) for n, p in self.gpt.named_parameters() if p.requires_grad]

    def _group_parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        return [p for _, p in self._group_named_parameters(group)]

    def _ddp_parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """The parameters the group's Megatron-DDP chunk holds gradient buffers for (GPU)."""
        return self._group_parameters(group)

    def _module_for(self, group: OptimizerGroup) -> torch.nn.Module:
        """What a forward of this group runs: its Megatron-DDP chunk once it has one, else the model."""
        chunks = getattr(group.optimizer, "chunks", None)
        return chunks[0] if chunks else self.model

    def _freeze_base(self) -> None:
        """Only LoRA tensors train. On CPU under bf16/fp16 the frozen weights are held in that dtype (half the
        memory, as megatron holds them on GPU); the LoRA tensors stay fp32, the optimizer's master weights."""
        dtype = self.precision.autocast_dtype if self.device_type != "cuda" else None
        for name, param in self.gpt.named_parameters():
            param.requires_grad = ".lora_A." in name or ".lora_B." in name
            if dtype is not None and not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(dtype)

    # ---------------------------------------------------------------- adapters
    def add_adapter_to_model(self, adapter_name: str, config_or_dir: Any, **kwargs: Any) -> None:
        """Add a LoRA adapter (a peft LoraConfig, or a PEFT adapter directory) as a new group.

        Everything is checked before the model is touched; adapters must be added before the model
        is wrapped for training (the first set_optimizer on GPU).
        """
        unknown = sorted(set(kwargs) - set(_GROUP_OPTIONS))
        if unknown:
            raise TypeError(f"add_adapter_to_model got unknown options {unknown}; "
                            f"it takes {', '.join(_GROUP_OPTIONS)}.")
        accumulation = check_accumulation_steps(kwargs.get("gradient_accumulation_steps", 1))
        check_adapter_name(adapter_name)
        if adapter_name in self.adapters:
            raise ValueError(f"An adapter named {adapter_name!r} already exists; pick another name.")
        if getattr(self, "chunks", None) is not None:
            raise RuntimeError("The model is already wrapped for training (an optimizer was set); add adapters "
                               "before set_optimizer.")
        directory, config, weights = _adapter_source(config_or_dir)
        config = with_default_targets(config, self.hf_config.model_type)
        check_lora_config(config)
        suffixes = target_suffixes(config)
        inherited = self._full_group_defaults()

        first = not self.adapters
        add_lora(self.gpt, adapter_name, config, seed=len(self.adapters))
        if weights is not None:
            try:
                import_adapter(self.gpt, adapter_name, weights, self.args, self.layout, str(directory))
            except Exception:
                self._drop_adapter(adapter_name)
                raise
        if first:
            self._freeze_base()
        self.adapters[adapter_name] = {"config": config, "suffixes": suffixes}
        if DEFAULT_GROUP in self.optimizer_group and not self.optimizer_group[DEFAULT_GROUP].is_adapter:
            del self.optimizer_group[DEFAULT_GROUP]
        group = OptimizerGroup(adapter_name, is_adapter=True, gradient_accumulation_steps=accumulation)
        for attr in ("template", "processor", "loss"):
            setattr(group, attr, inherited.get(attr))
        self.optimizer_group[adapter_name] = group

    def _drop_adapter(self, adapter_name: str) -> None:
        """Undo a half-added adapter: remove it, and unwrap layers left without adapters."""
        from twinkle_megatron.lora.inject import lora_modules

        for name, module in lora_modules(self.gpt).items():
            if adapter_name in module.lora_A:
                module.remove_adapter(adapter_name)
            if not module.lora_A:
                parent, _, child = name.rpartition(".")
                setattr(self.gpt.get_submodule(parent) if parent else self.gpt, child, module.base_layer)

    def _full_group_defaults(self) -> dict[str, Any]:
        full = self.optimizer_group.get(DEFAULT_GROUP)
        if full is None or full.is_adapter:
            return {}
        if full.optimizer is not None or full.total_micro_steps:
            raise RuntimeError("The full model is already set up for training (it has an optimizer or has taken "
                               "steps); add adapters before calling set_optimizer/forward_backward on it.")
        return {"template": full.template, "processor": full.processor, "loss": full.loss}


def _adapter_source(config_or_dir: Any) -> tuple[Path | None, Any, dict[str, torch.Tensor] | None]:
    """(directory, LoraConfig, PEFT-keyed weights) from a config or an adapter directory."""
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
