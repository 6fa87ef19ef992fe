"""Finding the modules FSDP2 wraps one by one: the decoder layers of the live model.

The ``model_type.title() + 'DecoderLayer'`` guess misnames MoE models (``qwen3_5_moe`` gives
``Qwen3_5_MoeDecoderLayer``, the class is ``Qwen3_5MoeDecoderLayer``), so the classes are read
from the modules that actually exist: a user-set ``_no_split_modules`` first, else every class
named ``*DecoderLayer`` (with, for a vision-language model, the vision blocks its
``_no_split_modules`` declares), else transformers' own ``_no_split_modules`` that are present.
"""

from __future__ import annotations

import torch


def _names_present(model: torch.nn.Module) -> set[str]:
    return {type(m).__name__ for m in model.modules()}


def decoder_layer_classes(model: torch.nn.Module, hf_model: torch.nn.Module | None = None) -> list[str]:
    """Class names of the modules to shard one by one (sorted); an error when none exists."""
    hf_model = hf_model if hf_model is not None else model
    present = _names_present(model)
    holder = model if "_no_split_modules" in vars(model) and model is not hf_model else hf_model  # set on peft
    declared = list(getattr(holder, "_no_split_modules", None) or [])
    # transformers copies the class attribute onto the instance (as a set: its order follows the string hash
    # seed, so it is compared as a set); a different value is the user's choice
    user_set = holder is not hf_model or set(declared) != set(getattr(type(hf_model), "_no_split_modules", None) or [])
    if user_set and declared:
        missing = sorted(set(declared) - present)
        if missing:
            raise ValueError(f"model._no_split_modules names {missing}, which this model does not contain; "
                             f"decoder-like classes present: {sorted(n for n in present if 'Layer' in n)}.")
        return sorted(set(declared))
    discovered = sorted(n for n in present if n.endswith("DecoderLayer"))
    if discovered and getattr(getattr(hf_model, "config", None), "vision_config", None) is not None:
        # a vision-language model: its vision blocks are declared in _no_split_modules too
        discovered = sorted(set(discovered) | {n for n in declared if n in present})
    if discovered:
        return discovered
    from_class = sorted(n for n in declared if n in present)
    if from_class:
        return from_class
    raise ValueError(f"Found no decoder-layer class in {type(hf_model).__name__} (no *DecoderLayer module and no "
                     "usable _no_split_modules). Set model._no_split_modules = ['YourLayerClass'] before training.")


def modules_of(model: torch.nn.Module, class_names: list[str]) -> list[torch.nn.Module]:
    """Every module of ``model`` whose class name is in ``class_names``, in definition order."""
    wanted = set(class_names)
    return [m for m in model.modules() if type(m).__name__ in wanted]
