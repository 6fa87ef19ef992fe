"""Optimizer groups of a TransformersModel: looking them up, and LoRA adapters through peft.

Without adapters the model has one group, ``'default'``, that trains every parameter. The first
``add_adapter_to_model`` turns the model into a peft model: the full-model group goes away (its
template, processor and loss carry over) and each adapter is its own group with its own optimizer,
scheduler, loss and metrics. Only the adapter of the group being run is active in a forward.
Under ``mixed_precision='bf16'|'fp16'`` the frozen base weights are then held in that dtype and
the adapters' weights in float32 (``twinkle_hf.model.meta.hold_frozen_in``).
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch
from peft import PeftConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import ModulesToSaveWrapper

from twinkle.model.optimizer_group import (
    DEFAULT_GROUP,
    OptimizerGroup,
    check_accumulation_steps,
    check_adapter_name,
    lookup_group,
)
from twinkle_hf.model.meta import adapters_stay_real, hold_frozen_in
from twinkle_hf.model.vision import adapter_config

_GROUP_OPTIONS = ("gradient_accumulation_steps", "vision_tower", "projector")


class GroupsMixin:
    """Group lookup and adapter management; expects ``self.model`` and ``self.optimizer_group``."""

    model: Any
    optimizer_group: dict[str, OptimizerGroup]

    # ------------------------------------------------------------------ lookup
    def _group(self, adapter_name: str | None = None) -> OptimizerGroup:
        """The group for ``adapter_name``; with a single group the name may be omitted."""
        return lookup_group(self.optimizer_group, adapter_name)

    @property
    def is_peft(self) -> bool:
        return isinstance(self.model, PeftModel)

    def _hf_model(self) -> torch.nn.Module:
        """The transformers model underneath any peft wrapper (LoRA layers stay injected in it)."""
        return self.model.get_base_model() if self.is_peft else self.model

    def _activate(self, group: OptimizerGroup) -> None:
        """Make ``group``'s adapter the one a forward runs through."""
        if group.is_adapter and self.model.active_adapter != group.name:
            self.model.set_adapter(group.name)

    def _group_parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """The parameters ``group`` trains: its adapter's weights, or every trainable weight of the model."""
        if not group.is_adapter:
            return [p for p in self.model.parameters() if p.requires_grad]
        params: list[torch.nn.Parameter] = []
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                for attr in module.adapter_layer_names:
                    container = getattr(module, attr, None)
                    if container is not None and group.name in container:
                        item = container[group.name]
                        params.extend([item] if isinstance(item, torch.nn.Parameter) else item.parameters())
            elif isinstance(module, ModulesToSaveWrapper) and group.name in module.modules_to_save:
                params.extend(module.modules_to_save[group.name].parameters())
        seen: set[int] = set()
        return [p for p in params if not (id(p) in seen or seen.add(id(p)))]

    def _embedding_parameter_ids(self) -> set[int]:
        """ids of the input embedding and output head weights (kept off Muon)."""
        hf = self._hf_model()
        ids = set()
        for getter in ("get_input_embeddings", "get_output_embeddings"):
            module = getattr(hf, getter, lambda: None)()
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.nn.Parameter):
                ids.add(id(weight))
        return ids

    # ---------------------------------------------------------------- adapters
    def add_adapter_to_model(self, adapter_name: str, config_or_dir: Any, **kwargs: Any) -> None:
        """Add a LoRA adapter (a peft config, or a directory with a saved adapter) as a new group.

        ``gradient_accumulation_steps=`` sets the new group's accumulation. On a vision-language model
        the adapter targets the language model; ``vision_tower=``/``projector=`` ('freeze', 'lora',
        'full') choose what else it trains (see ``twinkle_hf.model.vision``). Everything is checked
        before the model is touched, so a bad call leaves the model as it was.
        """
        unknown = sorted(set(kwargs) - set(_GROUP_OPTIONS))
        if unknown:
            raise TypeError(f"add_adapter_to_model got unknown options {unknown}; "
                            f"it takes {', '.join(_GROUP_OPTIONS)}.")
        accumulation = check_accumulation_steps(kwargs.get("gradient_accumulation_steps", 1))
        self._check_adapter_name(adapter_name)
        adapter_dir, config = _adapter_source(config_or_dir)
        if adapter_dir is None:  # a VL model: LoRA on the language model unless vision_tower=/projector= say more
            config = adapter_config(self._hf_model(), config, kwargs.get("vision_tower"), kwargs.get("projector"))
        self._check_targets(config)
        inherited = self._full_group_defaults()

        with adapters_stay_real(self.model):  # a meta model (sharded load pending) gets real adapter weights
            if adapter_dir is None:
                if self.is_peft:
                    self.model.add_adapter(adapter_name, config)
                else:
                    self.model = get_peft_model(self.model, config, adapter_name=adapter_name)
            elif self.is_peft:
                self.model.load_adapter(adapter_dir, adapter_name=adapter_name, is_trainable=True)
            else:
                self.model = PeftModel.from_pretrained(self.model, adapter_dir, adapter_name=adapter_name,
                                                       is_trainable=True)
        if DEFAULT_GROUP in self.optimizer_group and not self.optimizer_group[DEFAULT_GROUP].is_adapter:
            del self.optimizer_group[DEFAULT_GROUP]
        group = self._new_group(adapter_name, is_adapter=True, gradient_accumulation_steps=accumulation)
        for attr in ("template", "processor", "loss"):
            setattr(group, attr, inherited.get(attr))
        self.optimizer_group[adapter_name] = group
        self.model.set_adapter(adapter_name)
        trainable = [p for g in self.optimizer_group.values() for p in self._group_parameters(g)]
        hold_frozen_in(self.model, self.mixed_precision, trainable)  # bf16/fp16: frozen base in 2 bytes/param

    def _check_adapter_name(self, adapter_name: Any) -> None:
        check_adapter_name(adapter_name)
        if adapter_name in self.optimizer_group and self.optimizer_group[adapter_name].is_adapter:
            raise ValueError(f"An adapter named {adapter_name!r} already exists; pick another name.")

    def _full_group_defaults(self) -> dict[str, Any]:
        """What the full-model group hands to the first adapter; refuse if it is already training."""
        full = self.optimizer_group.get(DEFAULT_GROUP)
        if full is None or full.is_adapter:
            return {}
        if full.optimizer is not None or full.total_micro_steps:
            raise RuntimeError(
                "The full model is already set up for training (it has an optimizer or has taken steps); "
                "add adapters before calling set_optimizer/forward_backward on the full model."
            )
        return {"template": full.template, "processor": full.processor, "loss": full.loss}

    def _check_targets(self, config: PeftConfig) -> None:
        """Every listed target module must exist in the model (peft only complains when none does)."""
        names = [name for name, _ in self._hf_model().named_modules() if name]
        for field_name in ("target_modules", "modules_to_save"):
            targets = getattr(config, field_name, None)
            if targets is None or targets == "all-linear":
                continue
            if isinstance(targets, str):
                if not any(re.fullmatch(targets, n) for n in names):
                    raise ValueError(f"LoRA {field_name}={targets!r} (a regex) matches no module of this model. "
                                     f"Module names look like: {', '.join(_leaf_names(self._hf_model())[:12])}.")
                continue
            missing = sorted(t for t in targets if not any(n == t or n.endswith("." + t) for n in names))
            if missing:
                raise ValueError(
                    f"LoRA {field_name} {missing} do not exist in {type(self._hf_model()).__name__}. "
                    f"Layers you can target: {', '.join(_leaf_names(self._hf_model()))}."
                )


def _adapter_source(config_or_dir: Any) -> tuple[str | None, PeftConfig]:
    """(directory or None, config) from a peft config or a directory holding adapter_config.json."""
    if isinstance(config_or_dir, PeftConfig):
        return None, config_or_dir
    if isinstance(config_or_dir, (str, os.PathLike)):
        directory = os.fspath(config_or_dir)
        if not os.path.isfile(os.path.join(directory, "adapter_config.json")):
            raise FileNotFoundError(f"{directory!r} has no adapter_config.json; pass a LoraConfig or a directory "
                                    "written by save() / PeftModel.save_pretrained().")
        return directory, PeftConfig.from_pretrained(directory)
    raise TypeError(f"config_or_dir must be a peft config (e.g. LoraConfig) or an adapter directory, got "
                    f"{type(config_or_dir).__name__}.")


def _leaf_names(model: torch.nn.Module) -> list[str]:
    """Distinct names of the Linear/Embedding layers (LoRA-wrapped ones included), the usual LoRA targets."""
    tuned = [name for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)]
    leaves = set()
    for name, module in model.named_modules():
        inside_tuner = any(name.startswith(t + ".") for t in tuned)
        if name in tuned or (isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) and not inside_tuner):
            leaves.add(name.rsplit(".", 1)[-1])
    return sorted(leaves)
