"""Checkpoints that travel: embedded models ship weights plain transformers loads, and an adapter names its base
as the user did (``base_model_name_or_path``), never a path into the install or a cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftConfig, PeftModel
from rounding import tiny_qwen, within
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from twinkle.assets import ASSETS, asset_path
from twinkle.hub import portable_id, resolve_path
from twinkle_hf.model.loading import has_weights

MODEL_ASSETS = sorted({name for name, rel in ASSETS.items() if (asset_path(name) / "config.json").is_file()
                       and name != "tokenizer"})


def test_every_embedded_model_ships_weights_plain_transformers_loads():
    assert {"tiny-qwen", "tiny-qwen2.5-vl", "tiny-qwen3-vl"} <= set(MODEL_ASSETS)
    for name in MODEL_ASSETS:
        path = asset_path(name)
        assert has_weights(str(path)), name
        config = AutoConfig.from_pretrained(path)
        cls = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None \
            else AutoModelForCausalLM
        _, info = cls.from_pretrained(path, output_loading_info=True)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), (name, info)


@pytest.mark.parametrize("given,expected", [
    ("ms://Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"), ("hf://Qwen/Qwen3-0.6B/", "Qwen/Qwen3-0.6B"),
    ("twinkle://tiny-qwen", "twinkle://tiny-qwen"), ("models/my-base", "models/my-base"), (None, None),
])
def test_the_base_is_named_as_the_user_named_it(given, expected):
    assert portable_id(given) == expected


def _adapter_base(path: str) -> str:
    return json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"]


def test_an_adapter_on_an_embedded_model_names_it_and_loads_elsewhere(tmp_path):
    from twinkle.model import TransformersModel

    model = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")
    model.add_adapter_to_model("sft", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    path = model.save("final", output_dir=str(tmp_path))
    assert _adapter_base(path) == "twinkle://tiny-qwen"
    # elsewhere (twinkle installed): resolve the recorded name, then plain transformers + peft
    base = AutoModelForCausalLM.from_pretrained(resolve_path(PeftConfig.from_pretrained(path).base_model_name_or_path))
    plain = PeftModel.from_pretrained(base, path).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = model.forward_only(inputs={"input_ids": ids}).logits  # float32's forward bound (tests/rounding.py)
        torch.testing.assert_close(plain(input_ids=ids).logits, want, **within(tiny_qwen(4, 1).forward_bound(), want))


def test_a_local_base_is_named_by_the_path_given(tmp_path, monkeypatch):
    from twinkle.model import MultiLoraTransformersModel, TransformersModel

    shutil.copytree(asset_path("tiny-qwen"), tmp_path / "bases" / "mine")
    monkeypatch.chdir(tmp_path)
    model = TransformersModel(model_id="bases/mine", mixed_precision="no")
    model.add_adapter_to_model("sft", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    assert _adapter_base(model.save("a", output_dir="out")) == "bases/mine"
    multi = MultiLoraTransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no", max_loras=1, max_r=4)
    multi.acquire_lora("tenant", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    assert _adapter_base(multi.save("t", output_dir="out", adapter_name="tenant")) == "twinkle://tiny-qwen"
