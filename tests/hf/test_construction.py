"""Constructing TransformersModel: through the registry, from config, local dirs and twinkle:// assets."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_batch, make_model, tiny_config
from peft import LoraConfig
from transformers import AutoConfig, Qwen2ForCausalLM

import twinkle.model
from twinkle.hub import resolve_path
from twinkle.model import TwinkleModel
from twinkle.model.optimizer_group import DEFAULT_GROUP
from twinkle_hf.model import TransformersModel


def test_resolved_through_the_registry_and_implements_the_protocol() -> None:
    assert twinkle.model.TransformersModel is TransformersModel
    assert issubclass(TransformersModel, TwinkleModel) and not TransformersModel.__abstractmethods__


def test_built_from_config_with_class_or_name() -> None:
    by_name = make_model(model_cls="Qwen2ForCausalLM", seed=0)
    by_class = make_model(model_cls=Qwen2ForCausalLM, seed=0)
    assert type(by_name.model) is Qwen2ForCausalLM is type(by_class.model)
    assert all(torch.equal(p, q) for p, q in zip(by_name.model.parameters(), by_class.model.parameters()))
    assert list(by_name.optimizer_group) == [DEFAULT_GROUP]
    assert next(by_name.model.parameters()).dtype == torch.float32
    # seed 003 reads the live module and sets FSDP wrapping hints on it
    layers = {type(m).__name__ for m in by_name.model.modules() if type(m).__name__.endswith("DecoderLayer")}
    assert layers == {"Qwen2DecoderLayer"}
    by_name.model._no_split_modules = list(layers)


def test_kwargs_reach_from_config_and_remote_group_is_accepted() -> None:
    model = make_model(attn_implementation="eager", dtype=torch.float64, remote_group=None)
    assert model.model.config._attn_implementation == "eager"
    assert next(model.model.parameters()).dtype == torch.float64
    assert model.remote_group is None


def test_twinkle_asset_and_local_directory(tmp_path) -> None:
    asset = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")
    expected = AutoConfig.from_pretrained(resolve_path("twinkle://tiny-qwen"))
    assert asset.model.config.vocab_size == expected.vocab_size and asset.model_path.endswith("tiny-qwen")

    source = make_model(seed=5)
    source.model.save_pretrained(tmp_path / "local")
    local = TransformersModel(model_id=str(tmp_path / "local"), mixed_precision="no")
    batch = make_batch(0)
    torch.testing.assert_close(local.forward_only(inputs=batch).logits, source.forward_only(inputs=batch).logits,
                               rtol=0, atol=0)


def test_lora_checkpoint_as_model_id_says_what_to_do(tmp_path) -> None:
    model = make_model()
    model.add_adapter_to_model("sft", LoraConfig(r=2, target_modules=["q_proj"]))
    path = model.save("lora", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"holds a LoRA adapter.*add_adapter_to_model\(name"):
        TransformersModel(model_id=path, mixed_precision="no")


def test_adapters_replace_the_full_model_group_and_inherit_its_data_settings() -> None:
    model = make_model(config=tiny_config("llama"))
    model.set_processor("InputProcessor", pad_token_id=0)
    processor = model.optimizer_group[DEFAULT_GROUP].processor
    model.add_adapter_to_model("default", LoraConfig(r=2, target_modules=["q_proj"]))
    assert list(model.optimizer_group) == ["default"] and model.optimizer_group["default"].is_adapter
    assert model.optimizer_group["default"].processor is processor

    trained = make_model()
    trained.set_optimizer("SGD", lr=0.1)
    with pytest.raises(RuntimeError, match="add adapters before"):
        trained.add_adapter_to_model("sft", LoraConfig(r=2, target_modules=["q_proj"]))
    assert not trained.is_peft
