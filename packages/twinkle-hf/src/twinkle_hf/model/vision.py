"""Vision-language models in TransformersModel: which class loads them, which parts LoRA trains.

A VL model (its config has a ``vision_config``) has three parts, found by the module names
transformers gives them: the language model (``language_model``), the vision tower (``visual``,
``vision_tower``, ``vision_model``) and the projector that maps image features into the language
model (``multi_modal_projector``; Qwen-VL's ``merger`` and ``deepstack_merger_list`` inside the
tower). LoRA targets the language model's layers by default; ``vision_tower=``/``projector=``
choose ``'freeze'`` (default), ``'lora'`` (the part's linear layers get adapters) or ``'full'``
(the part is trained whole and saved with the adapter, peft's ``modules_to_save``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

PART_CHOICES = ("freeze", "lora", "full")
_LANGUAGE = ("language_model",)
_TOWER = ("visual", "vision_tower", "vision_model", "vision_encoder")
_PROJECTOR = ("multi_modal_projector", "mm_projector", "merger", "deepstack_merger_list", "connector")


def is_multimodal(config: Any) -> bool:
    """Whether a transformers config describes a vision-language model."""
    return getattr(config, "vision_config", None) is not None


def model_class_for(cls: Any, config: Any) -> Any:
    """``AutoModelForImageTextToText`` in place of the default ``AutoModelForCausalLM`` for a VL config."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if cls is AutoModelForCausalLM and is_multimodal(config):
        return AutoModelForImageTextToText
    return cls


@dataclass(frozen=True)
class VisionParts:
    """Module names of a VL model's parts (``projector`` may lie inside ``vision_tower``)."""

    language_model: str
    vision_tower: str
    projector: tuple[str, ...]


def vision_parts(model: torch.nn.Module) -> VisionParts | None:
    """The parts of a VL model by module name; None for a text-only model."""
    names = [name for name, _ in model.named_modules() if name]

    def shallowest(candidates: tuple[str, ...], under: str | None = None) -> list[str]:
        found = [n for n in names if n.rsplit(".", 1)[-1] in candidates and (under is None or n.startswith(under))]
        found = [n for n in found if not any(n.startswith(o + ".") for o in found)]
        return sorted(found, key=lambda n: n.count("."))

    language, tower = shallowest(_LANGUAGE), shallowest(_TOWER)
    if not language or not tower:
        return None
    projector = tuple(n for n in shallowest(_PROJECTOR) if not n.startswith(language[0] + "."))
    return VisionParts(language[0], tower[0], projector)


def needs_unused_search(hf_model: torch.nn.Module) -> bool:
    """Whether DDP must look for unused parameters: a VL model whose vision tower or projector trains
    (a micro-batch without images leaves them without a gradient)."""
    parts = vision_parts(hf_model)
    if parts is None:
        return False
    return any(p.requires_grad for name in (parts.vision_tower, *parts.projector)
               for p in hf_model.get_submodule(name).parameters())


def _linear_names(model: torch.nn.Module, prefix: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Names of the Linear layers under ``prefix`` (a LoRA-wrapped layer by its own name, once)."""
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or ".lora_" in name or not name.startswith(prefix + "."):
            continue
        name = name.removesuffix(".base_layer")
        if not any(name == e or name.startswith(e + ".") for e in exclude) and name not in names:
            names.append(name)
    return names


def adapter_config(model: torch.nn.Module, config: Any, vision_tower: str | None = None,
                   projector: str | None = None) -> Any:
    """A copy of a peft config whose targets follow the parts chosen (VL models); unchanged for text models.

    ``target_modules`` given as names (or ``'all-linear'``) is kept to the layers of those names in
    the chosen parts; a regex string is the user's exact choice and is kept as is.
    """
    parts = vision_parts(model)
    if parts is None:
        if vision_tower is not None or projector is not None:
            raise ValueError(f"vision_tower=/projector= apply to vision-language models; {type(model).__name__} "
                             "has no vision tower.")
        return config
    vision_tower, projector = _choice("vision_tower", vision_tower), _choice("projector", projector)
    inside = [p for p in parts.projector if p.startswith(parts.vision_tower + ".")]
    if vision_tower == "full" and inside and projector != "full":
        raise ValueError(f"vision_tower='full' trains {parts.vision_tower} whole, which holds the projector "
                         f"{inside}; pass projector='full' too.")
    targets = getattr(config, "target_modules", None)
    if isinstance(targets, str) and targets != "all-linear":
        if "lora" in (vision_tower, projector):
            raise ValueError(f"target_modules={targets!r} is a regex (your exact choice of layers); "
                             "vision_tower='lora'/projector='lora' need target names or 'all-linear'.")
        chosen = targets
    else:
        wanted = None if targets in (None, "all-linear") else {t.rsplit(".", 1)[-1] for t in targets}
        candidates = _linear_names(model, parts.language_model)
        if vision_tower == "lora":
            candidates += _linear_names(model, parts.vision_tower, exclude=parts.projector)
        if projector == "lora":
            candidates += [n for p in parts.projector for n in _linear_names(model, p)]
        chosen = sorted(n for n in candidates if wanted is None or n.rsplit(".", 1)[-1] in wanted)
        if not chosen:
            raise ValueError(f"LoRA target_modules={targets!r} match no linear layer of the language model "
                             f"{parts.language_model!r} (or the parts chosen with vision_tower=/projector=).")
    saved = list(getattr(config, "modules_to_save", None) or [])
    if vision_tower == "full":
        saved.append(parts.vision_tower)
    elif projector == "full":
        saved.extend(parts.projector)
    new = copy.deepcopy(config)
    new.target_modules = chosen
    new.modules_to_save = saved or None
    return new


def _choice(name: str, value: str | None) -> str:
    value = "freeze" if value is None else value
    if value not in PART_CHOICES:
        raise ValueError(f"{name}={value!r}; choose one of {', '.join(PART_CHOICES)}.")
    return value


def require_vision_parts(hf_model: torch.nn.Module, what: str) -> VisionParts:
    """The VL parts of ``hf_model``; a ValueError naming ``what`` for a text-only model."""
    parts = vision_parts(hf_model)
    if parts is None:
        raise ValueError(f"{what} applies to vision-language models; {type(hf_model).__name__} has no vision tower.")
    return parts


def freeze_vision(hf_model: torch.nn.Module, vision_tower: bool = True, projector: bool = False) -> None:
    """Full training: stop training the vision tower (and/or the projector); ``False, False`` trains both again."""
    parts = require_vision_parts(hf_model, "freeze_vision")
    projector_modules = [hf_model.get_submodule(p) for p in parts.projector]
    projector_ids = {id(p) for m in projector_modules for p in m.parameters()}
    for param in hf_model.get_submodule(parts.vision_tower).parameters():
        if id(param) not in projector_ids:
            param.requires_grad_(not vision_tower)
    for module in projector_modules:
        module.requires_grad_(not projector)
