"""Helpers for the multimodal tests: the tiny VL families, their templates, datasets and models."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from golden_bounds import VL  # noqa: E402

#: The reduction lengths of any of the three tiny families (tests/rounding.py): golden_bounds.VL (the same text
#: model and a vision tower of hidden 32, MLP 64, 2 layers in each), with Qwen3-VL's larger patch embedding
#: (3 x 2 x 16 x 16 = 1536 values) and rows of up to 128 tokens, 4 a batch (generous for these datasets).
VL_ANY = dataclasses.replace(VL, seq=128, tokens=512, extra=VL.extra + 1536 - 1176)

#: family -> (template name, embedded tiny model directory)
FAMILIES = {
    "qwen2_5_vl": ("Qwen2_5VLTemplate", "twinkle://tiny-qwen2.5-vl"),
    "qwen3_vl": ("Qwen3VLTemplate", "twinkle://tiny-qwen3-vl"),
    "internvl2_5": ("InternVL2_5Template", "twinkle://tiny-internvl2.5"),
}
#: the families whose processors expand Qwen-VL's vision tokens (<|image_pad|>, image_grid_thw)
QWEN_FAMILIES = ("qwen2_5_vl", "qwen3_vl")
#: the token an image expands into, per family
IMAGE_TOKEN = {"qwen2_5_vl": "<|image_pad|>", "qwen3_vl": "<|image_pad|>", "internvl2_5": "<IMG_CONTEXT>"}


def template(family: str, **kwargs: Any):
    from twinkle.registry import resolve

    name, model_id = FAMILIES[family]
    return resolve("template", name)(model_id=model_id, **kwargs)


def dataset(family: str, n: int = 16, seed: int = 0, **template_kwargs: Any):
    """The shapes rows, preprocessed and encoded with the family's template."""
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.multimodal.shapes import shape_rows
    from twinkle.preprocessor import MessagesProcessor

    rows = [{"messages": r["messages"], "images": r["images"]} for r in shape_rows(n, seed)]
    ds = Dataset(DatasetMeta(data=rows))
    ds.set_template(FAMILIES[family][0], model_id=FAMILIES[family][1], **template_kwargs)
    ds.map(MessagesProcessor())
    ds.encode()
    return ds


def model(family: str, seed: int = 0, **kwargs: Any):
    """A TransformersModel over the family's tiny VL model (its shipped seeded weights, fp32)."""
    from twinkle.model import TransformersModel

    torch.manual_seed(seed)
    return TransformersModel(model_id=FAMILIES[family][1], mixed_precision="no", **kwargs)


def hf_model(family: str, seed: int = 0):
    """The same tiny model loaded with plain transformers (the asset's weights)."""
    from transformers import AutoModelForImageTextToText

    from twinkle.hub import resolve_path

    torch.manual_seed(seed)
    return AutoModelForImageTextToText.from_pretrained(resolve_path(FAMILIES[family][1]), dtype=torch.float32)


def expected_labels(ids: list[int], tok) -> list[int]:
    """Independent rule: after '<|im_start|>assistant\\n', every token up to and including '<|im_end|>' is trained."""
    header = tok.convert_tokens_to_ids(["<|im_start|>"]) + tok("assistant\n", add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    labels, k = [-100] * len(ids), 0
    while k < len(ids):
        if ids[k:k + len(header)] == header:
            k += len(header)
            while ids[k] != end:
                labels[k] = ids[k]
                k += 1
            labels[k] = ids[k]
        k += 1
    return labels


def image_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Standard-format shape rows: '<image>What colour is the shape?' -> the colour."""
    from twinkle.multimodal.shapes import shape_rows

    return [{"messages": r["messages"], "images": r["images"]} for r in shape_rows(n, seed)]


def text_rows(n: int) -> list[dict[str, Any]]:
    """Text-only standard-format rows (no images column at all)."""
    return [{"messages": [{"role": "user", "content": f"Count to {k + 2}."},
                          {"role": "assistant", "content": " ".join(str(i) for i in range(1, k + 3))}]}
            for k in range(n)]

