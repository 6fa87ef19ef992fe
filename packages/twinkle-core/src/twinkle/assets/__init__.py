"""Files twinkle-core ships so the main job and the tests run offline (made by scripts/ in the repo).

- ``self-cognition``: ``self_cognition.jsonl``, rows ``{"query", "response", "tag"}`` in the public
  swift/self-cognition format with ``{{NAME}}``/``{{AUTHOR}}`` placeholders
  (scripts/make_self_cognition.py).
- ``tiny-qwen`` (alias ``tokenizer``): a directory with a byte-level BPE tokenizer
  (tokenizer.json, tokenizer_config.json with a ChatML chat template) and the config.json of a
  tiny Qwen2 causal LM sized to it (scripts/make_tokenizer.py), with seeded float32 weights
  (model.safetensors, scripts/make_tiny_weights.py): every process loads the same model, and
  plain ``AutoModelForCausalLM.from_pretrained`` loads it too (the base of the main job's LoRA).
- ``tiny-qwen2.5-vl``, ``tiny-qwen3-vl``: tiny vision-language model directories (config.json of a
  Qwen2.5-VL / Qwen3-VL with a 2-block vision tower, the tokenizer above plus the vision tokens, a
  processor with a small image processor and the Qwen-VL chat template, and seeded float32 weights;
  scripts/make_tiny_vl.py): plain ``AutoModelForImageTextToText.from_pretrained`` loads them, so an
  adapter trained on them loads in plain transformers + peft.
- ``tiny-internvl2.5``: the same for InternVL 2.5 (``InternVLForConditionalGeneration``: a 2-layer
  InternViT on 56-pixel tiles, the MLP projector, a 2-layer hidden-64 Qwen2 language model; the
  tokenizer with InternVL's image tokens, a GotOcr2 tiling image processor, InternVL 2.5's chat template).

A checkpoint of an embedded model names its base as the user wrote it (``twinkle://tiny-qwen``);
elsewhere, resolve that name with ``twinkle.hub.resolve_path`` (twinkle installed) or copy the asset's
directory beside the checkpoint (its path: ``asset_path(NAME)``).

Address them as ``twinkle://NAME`` anywhere a path or hub id is accepted (see :mod:`twinkle.hub`).
"""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent

#: asset name -> path relative to this package
ASSETS: dict[str, str] = {
    "self-cognition": "self_cognition.jsonl",
    "tiny-qwen": "tiny-qwen",
    "tokenizer": "tiny-qwen",
    "tiny-qwen2.5-vl": "tiny-qwen2.5-vl",
    "tiny-qwen3-vl": "tiny-qwen3-vl",
    "tiny-internvl2.5": "tiny-internvl2.5",
}

#: what ``model_id=None`` means for a template: the embedded tokenizer
DEFAULT_MODEL_ID = "twinkle://tiny-qwen"


def asset_path(name: str) -> Path:
    """The path of an embedded asset by name; an unknown name lists the known ones."""
    if name not in ASSETS:
        raise FileNotFoundError(
            f"twinkle has no embedded asset {name!r}; known: {', '.join(sorted(ASSETS))} (use twinkle://<name>)."
        )
    path = ASSETS_DIR / ASSETS[name]
    if not path.exists():
        raise FileNotFoundError(
            f"embedded asset {name!r} is missing at {path}; reinstall twinkle-core (or run the scripts/ that make it)."
        )
    return path
