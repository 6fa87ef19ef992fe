"""Helpers for the multimodal tests: the tiny VL families, their templates, datasets and models."""

from __future__ import annotations

from typing import Any

import torch

#: family -> (template name, embedded tiny model directory)
FAMILIES = {
    "qwen2_5_vl": ("Qwen2_5VLTemplate", "twinkle://tiny-qwen2.5-vl"),
    "qwen3_vl": ("Qwen3VLTemplate", "twinkle://tiny-qwen3-vl"),
}


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
    """A TransformersModel over the family's tiny VL model (random init, fp32)."""
    from twinkle.model import TransformersModel

    torch.manual_seed(seed)
    return TransformersModel(model_id=FAMILIES[family][1], mixed_precision="no", **kwargs)


def hf_model(family: str, seed: int = 0):
    """The same tiny model built with plain transformers."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from twinkle.hub import resolve_path

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(resolve_path(FAMILIES[family][1]))
    return AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
