"""LoRA adapters through peft: adding them, routing a forward through one, the parameters each trains.

Without adapters the model trains every parameter (the ``'default'`` group). The first adapter turns
the module into a ``PeftModel``; each adapter is its own group and only the adapter of the group
being run is active in a forward. Under ``mixed_precision='bf16'|'fp16'`` the frozen base weights are
then held in that dtype and the adapters' weights in float32 (``meta.hold_frozen_in``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from peft import PeftConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import ModulesToSaveWrapper

from twinkle.engine import Route
from twinkle.hub import portable_id
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle_hf.model.meta import adapters_stay_real, hold_frozen_in
from twinkle_hf.model.vision import adapter_config
from twinkle_hf.model.weights import adapter_state_dict, load_adapter_weights, write_adapter


class PeftAdapters:
    """The adapters part of an :class:`~twinkle_hf.model.backend.HFBackend` with peft adapters (one at a time)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    # ------------------------------------------------------------------ routing
    @contextmanager
    def routed(self, routes: Sequence[Route]) -> Iterator[None]:
        """The route's adapter becomes peft's active one (a full-model group needs nothing)."""
        if len(routes) != 1 or routes[0].rows is not None:
            raise ValueError("A TransformersModel runs one adapter per forward; several tenants in one batch need "
                             "MultiLoraTransformersModel.forward_backward_multi.")
        group = routes[0].group
        module = self.backend.module
        if group.is_adapter and module.active_adapter != group.name:
            module.set_adapter(group.name)
        yield

    @contextmanager
    def reference(self, routes: Sequence[Route]) -> Iterator[None]:
        """The reference policy: the base model under the group's LoRA adapter, which is switched off."""
        group = routes[0].group
        if not group.is_adapter:
            raise ValueError(
                f"The loss of group {group.name!r} needs reference log-probabilities (a KL penalty or DPO) but the "
                "group trains the full model, so the reference would be a second, frozen copy: compute them with "
                "TorchSampler(reference_model).compute_logprobs(...) and put them in the batch as 'ref_logprobs', "
                "or train a LoRA adapter (its reference is the base model, no copy).")
        with self.backend.module.disable_adapter():
            yield

    def after_step(self, group: OptimizerGroup) -> None:
        """Nothing to restore after an optimizer step (slots re-zero their unused ranks here)."""

    # --------------------------------------------------------------- parameters
    def parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """The parameters ``group`` trains: its adapter's weights, or every trainable weight of the model."""
        module = self.backend.module
        if not group.is_adapter:
            return [p for p in module.parameters() if p.requires_grad]
        params: list[torch.nn.Parameter] = []
        for sub in module.modules():
            if isinstance(sub, BaseTunerLayer):
                for attr in sub.adapter_layer_names:
                    container = getattr(sub, attr, None)
                    if container is not None and group.name in container:
                        item = container[group.name]
                        params.extend([item] if isinstance(item, torch.nn.Parameter) else item.parameters())
            elif isinstance(sub, ModulesToSaveWrapper) and group.name in sub.modules_to_save:
                params.extend(sub.modules_to_save[group.name].parameters())
        seen: set[int] = set()
        return [p for p in params if not (id(p) in seen or seen.add(id(p)))]

    # ------------------------------------------------------------------ adding
    def add(self, name: str, config_or_dir: Any, options: dict[str, Any]) -> None:
        """Add a LoRA adapter (a peft config, or a directory with a saved adapter) named ``name``.

        On a vision-language model the adapter targets the language model; ``vision_tower=``/``projector=``
        ('freeze', 'lora', 'full') choose what else it trains (see ``twinkle_hf.model.vision``). Every
        check runs before the model changes.
        """
        backend = self.backend
        hf = backend.hf_model()
        adapter_dir, config = _adapter_source(config_or_dir)
        if adapter_dir is None:  # a VL model: LoRA on the language model unless vision_tower=/projector= say more
            config = adapter_config(hf, config, options.get("vision_tower"), options.get("projector"))
        check_targets(hf, config)
        module = backend.module
        with adapters_stay_real(module):  # a meta model (sharded load pending) gets real adapter weights
            if adapter_dir is None:
                if isinstance(module, PeftModel):
                    module.add_adapter(name, config)
                else:
                    module = get_peft_model(module, config, adapter_name=name)
            elif isinstance(module, PeftModel):
                module.load_adapter(adapter_dir, adapter_name=name, is_trainable=True)
            else:
                module = PeftModel.from_pretrained(module, adapter_dir, adapter_name=name, is_trainable=True)
        backend.module = module

    def added(self, name: str, groups: list[OptimizerGroup]) -> None:
        """After ``name`` joined: it becomes the active adapter; bf16/fp16 hold the frozen base in 2 bytes/param."""
        backend = self.backend
        backend.module.set_adapter(name)
        trainable = [p for g in groups for p in self.parameters(g)]
        hold_frozen_in(backend.module, backend.mixed_precision, trainable)

    # ------------------------------------------------------------------ files
    def state_dict(self, group: OptimizerGroup) -> dict[str, torch.Tensor]:
        """The adapter's weights under PEFT's file keys (as held on this rank: shards under FSDP2)."""
        return adapter_state_dict(self.backend.module, group.name)

    def write(self, group: OptimizerGroup, state: dict[str, torch.Tensor], directory: Path) -> None:
        """The flat PEFT adapter directory from ``state`` (full tensors)."""
        write_adapter(state, self.backend.module.peft_config[group.name], directory, portable_id(self.backend.model_id))

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        """An adapter directory's weights into the group's adapter (each rank its shard once wrapped)."""
        backend = self.backend
        if backend.dist_plan.distributed and backend.wrapped:
            from twinkle_hf.distributed.checkpoint import load_export

            load_export(backend, group, directory)
            return
        load_adapter_weights(backend.module, group.name, directory)

    def describe(self, group: OptimizerGroup) -> list[str]:
        if not group.is_adapter:
            return []
        config = self.backend.module.peft_config[group.name]
        return [f"    lora: r={getattr(config, 'r', '?')} alpha={getattr(config, 'lora_alpha', '?')} "
                f"targets={sorted(getattr(config, 'target_modules', None) or [])}"]


def check_targets(hf: torch.nn.Module, config: PeftConfig) -> None:
    """Every listed target module must exist in the model (peft only complains when none does)."""
    names = [name for name, _ in hf.named_modules() if name]
    for field_name in ("target_modules", "modules_to_save"):
        targets = getattr(config, field_name, None)
        if targets is None or targets == "all-linear":
            continue
        if isinstance(targets, str):
            if not any(re.fullmatch(targets, n) for n in names):
                raise ValueError(f"LoRA {field_name}={targets!r} (a regex) matches no module of this model. "
                                 f"Module names look like: {', '.join(_leaf_names(hf)[:12])}.")
            continue
        missing = sorted(t for t in targets if not any(n == t or n.endswith("." + t) for n in names))
        if missing:
            raise ValueError(f"LoRA {field_name} {missing} do not exist in {type(hf).__name__}. "
                             f"Layers you can target: {', '.join(_leaf_names(hf))}.")


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
