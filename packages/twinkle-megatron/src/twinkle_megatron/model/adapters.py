"""LoRA adapters of a MegatronModel: adding them, routing a forward through one, the parameters each trains.

As in TransformersModel: without adapters one group, ``'default'``, trains every parameter; the
first adapter freezes the base model (the facade removes the full-model group, its template,
processor and loss carry over) and every adapter becomes its own group. Only the adapter of the
group being run is active in a forward. Adapters sit on megatron's parallel linear layers
(:mod:`twinkle_megatron.lora`); their files are PEFT's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_megatron.lora.inject import (
    adapter_parameters,
    add_lora,
    check_lora_config,
    lora_modules,
    target_suffixes,
    with_default_targets,
)
from twinkle_megatron.lora.layer import LoraParallelLinear, base_only
from twinkle_megatron.lora.peft_io import adapter_source, export_adapter, import_adapter, read_adapter


class LoraAdapters:
    """The adapters part of a :class:`~twinkle_megatron.model.backend.MegatronBackend` (one adapter per forward)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        #: adapter -> its LoraConfig and the megatron layer suffixes it adapts
        self.info: dict[str, dict[str, Any]] = {}
        self.layers: list[LoraParallelLinear] = []

    # ------------------------------------------------------------------ routing
    def activate(self, group: OptimizerGroup) -> None:
        """Every LoRA layer runs the group's adapter (nothing for the full-model group)."""
        name = group.name if group.is_adapter else None
        for layer in self.layers:
            layer.set_adapter(name if name is not None and name in layer.lora_A else None)

    def route_rows(self, routes: Any) -> None:
        raise ValueError("A MegatronModel runs one adapter per forward; several tenants in one batch need "
                         "MultiLoraMegatronModel.forward_backward_multi.")

    def reference(self) -> Any:
        """The base model alone (the reference policy of a LoRA group), inside the block."""
        return base_only(self.layers)

    # --------------------------------------------------------------- parameters
    def named_parameters(self, group: OptimizerGroup) -> list[tuple[str, torch.nn.Parameter]]:
        """What ``group`` trains: its adapter's A and B, or every trainable weight of the model."""
        if group.is_adapter:
            return adapter_parameters(self.backend.gpt, group.name)
        return [(n, p) for n, p in self.backend.gpt.named_parameters() if p.requires_grad]

    def ddp_parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """The parameters the group's Megatron-DDP chunk holds gradient buffers for (GPU)."""
        return [p for _, p in self.named_parameters(group)]

    # ------------------------------------------------------------------ adding
    def add(self, name: str, config_or_dir: Any, options: dict[str, Any]) -> None:
        """Add a LoRA adapter (a peft LoraConfig, or a PEFT adapter directory); everything checked first.

        Adapters come before the model is wrapped for training (the first set_optimizer on GPU).
        """
        backend = self.backend
        if backend.chunks is not None:
            raise RuntimeError("The model is already wrapped for training (an optimizer was set); add adapters "
                               "before set_optimizer.")
        directory, config, weights = adapter_source(config_or_dir)
        config = with_default_targets(config, backend.hf_config.model_type)
        check_lora_config(config)
        suffixes = target_suffixes(config)
        first = not self.info
        add_lora(backend.gpt, name, config, seed=len(self.info), vocab_size=backend.args.vocab_size)
        backend.active_group = None  # add_lora switched every layer to the new adapter
        if weights is not None:
            try:
                import_adapter(backend.gpt, name, weights, backend.args, backend.layout, str(directory))
            except Exception:
                self._drop(name)
                raise
        if first:
            backend.freeze_base()
        self.info[name] = {"config": config, "suffixes": suffixes}
        self.layers = list(lora_modules(backend.gpt).values())

    def _drop(self, name: str) -> None:
        """Undo a half-added adapter: remove it, and unwrap layers left without adapters."""
        gpt = self.backend.gpt
        for module_name, module in lora_modules(gpt).items():
            if name in module.lora_A:
                module.remove_adapter(name)
            if not module.lora_A:
                parent, _, child = module_name.rpartition(".")
                setattr(gpt.get_submodule(parent) if parent else gpt, child, module.base_layer)

    # ------------------------------------------------------------------- files
    def state_dict(self, group: OptimizerGroup) -> dict[str, torch.Tensor]:
        """The adapter's tensors under PEFT file keys (full across TP; a collective under TP)."""
        backend = self.backend
        return export_adapter(backend.gpt, group.name, backend.args, backend.layout)

    def peft_config(self, group: OptimizerGroup) -> tuple[Any, list[str]]:
        """(the adapter's LoraConfig, the megatron layer suffixes it adapts), for its adapter_config.json."""
        info = self.info[group.name]
        return info["config"], info["suffixes"]

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        """A PEFT adapter directory's weights into the group's adapter (every name and shape checked first)."""
        backend = self.backend
        tensors, _ = read_adapter(directory)
        import_adapter(backend.gpt, group.name, tensors, backend.args, backend.layout, str(directory))

    def describe(self, group: OptimizerGroup) -> list[str]:
        if not group.is_adapter:
            return []
        config, suffixes = self.peft_config(group)
        return [f"    lora: r={config.r} alpha={config.lora_alpha} megatron layers={suffixes}"]
