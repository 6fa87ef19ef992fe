"""Which linear layers Tinker's ``train_attn`` / ``train_mlp`` / ``train_unembed`` switch on, for any HF model.

The layers are listed from the model's config on the meta device (no weights, no memory): the
output embedding is ``unembed``, layers under an attention block are ``attn``, every other linear
layer (MLP, experts) is ``mlp``. Families are given by leaf name (``q_proj``) when that is
unambiguous, else by full module name. The shared model's LoRA slots cover all three families.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES = ("attn", "mlp", "unembed")


def _meta_model(model_path: str, model_cls: Any = None) -> Any:
    """The model on the meta device (no weights): a causal LM, or an image-text-to-text model for a VL config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_path)
    cls = model_cls or (AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM)
    with torch.device("meta"):
        return cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)


def _vision(name: str) -> bool:
    return any(part in ("visual", "vision_tower", "vision_model", "vision") for part in name.split("."))


def layer_families(model_path: str, model_cls: Any = None) -> dict[str, list[str]]:
    """``{"attn": [...], "mlp": [...], "unembed": [...]}`` target_modules of the model at ``model_path``.

    A vision-language model's vision tower is left out (tenants train the language model, as
    twinkle's VL scripts do); its layer names are then given in full when a leaf name is shared
    with a vision layer.
    """
    import torch

    model = _meta_model(model_path, model_cls)
    output = model.get_output_embeddings()
    full: dict[str, list[str]] = {family: [] for family in FAMILIES}
    vision_leaves = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and _vision(n)}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or _vision(name):
            continue
        if module is output:
            full["unembed"].append(name)
        elif any("attn" in part or "attention" in part for part in name.split(".")[:-1]):
            full["attn"].append(name)
        else:
            full["mlp"].append(name)
    leaves = {family: sorted({n.rsplit(".", 1)[-1] for n in names}) for family, names in full.items()}
    everything = [leaf for names in leaves.values() for leaf in names]
    if len(everything) == len(set(everything)) and not vision_leaves & set(everything):
        return leaves
    return full


def tokenizer_dir(model_path: str) -> str | None:
    """The model directory when it holds a tokenizer (the client's ``get_tokenizer`` loads it from there)."""
    path = Path(model_path)
    return str(path) if any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")) else None


def vocab_size(model_path: str, model_cls: Any = None) -> int:
    """How many token ids the model takes: the smaller of its input and output embedding sizes (meta device)."""
    model = _meta_model(model_path, model_cls)
    sizes = [model.get_input_embeddings().num_embeddings]
    output = model.get_output_embeddings()
    if output is not None:
        sizes.append(output.out_features)
    return min(sizes)
