"""Which megatron layers a peft ``LoraConfig`` targets, and putting LoRA adapters on them.

Users write HF module names (the adapter must load on the HF model). megatron fuses q/k/v into
``linear_qkv`` and gate/up into ``linear_fc1``, so those come in complete sets: a LoRA on
``q_proj`` alone cannot be expressed without also adapting k and v. ``lm_head`` is GPTModel's
``output_layer`` (:class:`~twinkle_megatron.lora.layer.LoraOutputLayer`); as in peft, ``'all-linear'``
leaves it out.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.lora.layer import LoraOutputLayer, LoraParallelLinear

#: megatron module suffix -> the HF projections it fuses (in HF module names).
FUSED: dict[str, tuple[str, ...]] = {
    "self_attention.linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "self_attention.linear_proj": ("o_proj",),
    "mlp.linear_fc1": ("gate_proj", "up_proj"),
    "mlp.linear_fc2": ("down_proj",),
}
#: GPTModel's output layer (top level, not in a decoder layer) -> HF's name for it.
OUTPUT = "output_layer"
#: every megatron layer LoRA can adapt -> its HF names ('all-linear' is FUSED: peft leaves the output layer out).
LAYERS: dict[str, tuple[str, ...]] = {**FUSED, OUTPUT: ("lm_head",)}
_MEGATRON_NAMES = {suffix.rsplit(".", 1)[-1]: suffix for suffix in LAYERS}
_SUPPORTED_FIELDS = {"bias": "none", "use_dora": False, "modules_to_save": None, "layers_to_transform": None}


def target_suffixes(config: Any) -> list[str]:
    """megatron module suffixes for the config's ``target_modules`` (HF or megatron names, or 'all-linear')."""
    targets = config.target_modules
    if targets is None:
        raise MegatronConfigError("LoraConfig.target_modules is empty; name the projections to adapt, e.g. "
                                  "['q_proj', 'k_proj', 'v_proj', 'o_proj'] or 'all-linear'.")
    if isinstance(targets, str):
        if targets != "all-linear":
            raise MegatronConfigError(f"target_modules={targets!r}: MegatronModel takes a list of module names or "
                                      "'all-linear' (regular expressions are not mapped).")
        return list(FUSED)
    wanted = {t.rsplit(".", 1)[-1] for t in targets}  # peft writes full paths for 'all-linear' adapters
    chosen = []
    for suffix, hf in LAYERS.items():
        short = suffix.rsplit(".", 1)[-1]
        present = wanted & set(hf)
        if short in wanted or present == set(hf):
            chosen.append(suffix)
        elif present:
            raise MegatronConfigError(
                f"target_modules {sorted(present)} without {sorted(set(hf) - present)}: megatron fuses "
                f"{', '.join(hf)} into one layer ({short}), so LoRA adapts all of them or none. "
                f"Add {sorted(set(hf) - present)} or drop {sorted(present)}."
            )
    known = {n for hf in LAYERS.values() for n in hf} | set(_MEGATRON_NAMES)
    unknown = sorted(wanted - known)
    if unknown:
        raise MegatronConfigError(f"target_modules {unknown} have no megatron layer; MegatronModel can adapt "
                                  f"{sorted(n for hf in LAYERS.values() for n in hf)} (or 'all-linear').")
    return chosen


def with_default_targets(config: Any, model_type: str) -> Any:
    """No ``target_modules``: peft's defaults for ``model_type``, widened to whole fused layers.

    peft's default for Qwen/Llama/Mistral is q_proj and v_proj; megatron holds q, k and v in one
    ``linear_qkv``, so the default here adapts that layer (q_proj, k_proj and v_proj in HF names).
    """
    from twinkle.model.lora_targets import default_target_modules
    from twinkle.model.lora_targets import with_default_targets as peft_defaults

    if config.target_modules is not None:
        return config
    names = set(default_target_modules(model_type))
    completed = peft_defaults(config, model_type)
    completed.target_modules = {n for hf in FUSED.values() if names & set(hf) for n in hf}
    return completed


def hf_target_modules(suffixes: list[str]) -> list[str]:
    return sorted(n for suffix in suffixes for n in LAYERS[suffix])


def check_lora_config(config: Any) -> None:
    """Refuse peft options this LoRA layer does not implement (before anything is changed)."""
    from peft import LoraConfig

    if not isinstance(config, LoraConfig):
        raise MegatronConfigError(f"MegatronModel adapters are LoRA: pass a peft LoraConfig, got "
                                  f"{type(config).__name__}.")
    for name, allowed in _SUPPORTED_FIELDS.items():
        value = getattr(config, name, allowed)
        if value != allowed and not (allowed is None and not value):
            raise MegatronConfigError(f"LoraConfig({name}={value!r}) is not supported by MegatronModel's LoRA "
                                      f"layer; leave it at {allowed!r}.")
    if config.init_lora_weights is not True:
        raise MegatronConfigError(f"LoraConfig(init_lora_weights={config.init_lora_weights!r}): only the default "
                                  "(True: Kaiming-uniform A, zero B) is implemented.")
    if getattr(config, "rank_pattern", None) or getattr(config, "alpha_pattern", None):
        raise MegatronConfigError("LoraConfig rank_pattern / alpha_pattern are not supported by MegatronModel.")


def lora_modules(model: nn.Module) -> dict[str, LoraParallelLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraParallelLinear)}


def _targets(model: nn.Module, suffixes: list[str]) -> dict[str, nn.Module]:
    found = {}
    for name, module in model.named_modules():
        if ".experts." in name or not any(name == s or name.endswith("." + s) for s in suffixes):
            continue
        found[name] = module
    if not found:
        raise MegatronConfigError(f"No layer of this model matches {suffixes}.")
    return found


def add_lora(model: nn.Module, adapter: str, config: Any, seed: int = 0, vocab_size: int | None = None) -> list[str]:
    """Wrap the targeted layers (once) and add adapter ``adapter`` to each; returns the module names.

    ``vocab_size``: the real vocabulary (the output layer's rows beyond it are megatron's padding).
    """
    check_lora_config(config)
    suffixes = target_suffixes(config)
    targets = _targets(model, suffixes)
    generator = torch.Generator().manual_seed(seed)
    for name, module in sorted(targets.items()):
        if isinstance(module, LoraParallelLinear):
            layer = module
        else:
            layer = (LoraOutputLayer(module, vocab_size, device=next(model.parameters()).device) if name == OUTPUT
                     else LoraParallelLinear(module))
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        layer.add_adapter(adapter, r=int(config.r), alpha=float(config.lora_alpha),
                          dropout=float(config.lora_dropout or 0.0), use_rslora=bool(config.use_rslora),
                          generator=generator)
    for module in lora_modules(model).values():
        module.set_adapter(adapter if adapter in module.lora_A else None)
    return sorted(targets)


def adapter_parameters(model: nn.Module, adapter: str) -> list[tuple[str, torch.nn.Parameter]]:
    out = []
    for name, module in lora_modules(model).items():
        if adapter in module.lora_A:
            out += [(f"{name}.lora_A.{adapter}", module.lora_A[adapter]),
                    (f"{name}.lora_B.{adapter}", module.lora_B[adapter])]
    return out
