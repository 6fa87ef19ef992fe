"""Dependencies' warnings about twinkle's own use are silenced where they do not apply (issue 26, item 7),
and only there: the same model from a local directory (not twinkle's embedded one) still warns."""

from __future__ import annotations

import shutil
import warnings

import pytest
from peft import LoraConfig

from twinkle import known_warnings
from twinkle.assets import asset_path
from twinkle.launch import InfraConfig, ModelConfig, build_model

TARGETS = ["q_proj", "v_proj", "lm_head"]  # lm_head is tied to the embeddings in the tiny model


def _messages(model_id: str, tmp_path) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build_model(ModelConfig(model_id=model_id), InfraConfig())
        model.add_adapter_to_model("default", LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
        model.save("ckpt", output_dir=str(tmp_path / "out"))
    return [str(w.message) for w in caught]


def _known(messages: list[str]) -> set[str]:
    import re

    return {k.message for k in known_warnings.KNOWN for m in messages if re.match(k.message, m)}


def test_the_embedded_model_builds_trains_and_saves_without_the_known_warnings(tmp_path):
    assert _known(_messages("twinkle://tiny-qwen", tmp_path)) == set()


def test_a_local_model_keeps_the_warnings_about_tied_layers(tmp_path):
    local = tmp_path / "tiny"
    shutil.copytree(asset_path("tiny-qwen"), local)
    found = _known(_messages(str(local), tmp_path))
    assert found == {k.message for k in known_warnings.KNOWN if k.embedded_only}  # transformers' deprecation: gone


@pytest.mark.parametrize("known", known_warnings.KNOWN, ids=lambda k: k.category.__name__ + ":" + k.message[:30])
def test_each_filter_matches_only_its_own_message(known):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        known_warnings.silence("twinkle://tiny-qwen")
        warnings.warn(known.message.replace("\\", "") + " and more", known.category, stacklevel=1)
        warnings.warn("something else " + known.message.replace("\\", ""), known.category, stacklevel=1)
    assert [str(w.message)[:15] for w in caught] == ["something else "]
