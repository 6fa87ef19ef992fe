"""TransformersModel on vision-language models: loss parity with transformers, LoRA parts, training, checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, PeftModel
from rounding import within
from vl_testing import FAMILIES, VL_ANY, dataset, hf_model, model

from twinkle.multimodal.media import load_image
from twinkle.multimodal.processor import load_processor
from twinkle.multimodal.shapes import QUESTION, shape_rows
from twinkle.processor import InputProcessor

FAMILY_NAMES = sorted(FAMILIES)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_loss_equals_a_plain_transformers_forward(family):
    ds = dataset(family, n=4)
    rows = ds[0:4]
    twinkle_model = model(family)
    assert type(twinkle_model.model).__name__.endswith("ForConditionalGeneration")  # not AutoModelForCausalLM
    twinkle_model.set_template(ds.template)
    loss = twinkle_model.forward_backward(inputs=rows)
    # reference: transformers alone, the processor's own batch of the same conversations
    reference = hf_model(family)
    reference.load_state_dict(twinkle_model.model.state_dict())
    processor = ds.template.processor
    raw = shape_rows(4, seed=0)  # the rows dataset(family, n=4) was made from
    texts = [processor.apply_chat_template([
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
        {"role": "assistant", "content": r["colour"]}], tokenize=False) for r in raw]
    batch = processor(text=texts, images=[load_image(r["images"][0]) for r in raw], padding=True,
                      return_tensors="pt", add_special_tokens=False)
    ours = InputProcessor.for_template(ds.template)(rows)
    assert torch.equal(batch["input_ids"], ours["input_ids"]) and torch.equal(batch["pixel_values"],
                                                                               ours["pixel_values"])
    want = reference(**batch, labels=ours["labels"]).loss.detach()
    # the same forward, the loss's sums in another order: a forward's bound (tests/rounding.py)
    assert loss == pytest.approx(float(want), rel=VL_ANY.forward_bound(), abs=0)
    assert loss > 1.0


def _lora_modules(peft_model) -> set[str]:
    return {name.rsplit(".lora_A", 1)[0] for name, _ in peft_model.named_modules() if name.endswith(".lora_A")}


def test_lora_targets_the_language_model_unless_told_otherwise():
    vl = model("qwen2_5_vl")
    vl.add_adapter_to_model("lm", LoraConfig(r=4, target_modules="all-linear"))
    tuned = _lora_modules(vl.model)
    assert tuned and all(".language_model." in n for n in tuned)
    assert all(not p.requires_grad for n, p in vl.model.named_parameters() if ".visual." in n)
    vl = model("qwen2_5_vl")
    vl.add_adapter_to_model("both", LoraConfig(r=4, target_modules=["q_proj", "qkv", "fc1", "down_proj"]),
                            vision_tower="lora", projector="full")
    tuned = _lora_modules(vl.model)
    assert any(".visual.blocks." in n and n.endswith("qkv") for n in tuned)
    assert any(".language_model." in n and n.endswith("q_proj") for n in tuned)
    assert not any(".merger." in n for n in tuned)
    merger = [p for n, p in vl.model.named_parameters() if ".merger.modules_to_save." in n]
    assert merger and all(p.requires_grad for p in merger)
    with pytest.raises(ValueError, match="vision_tower='full' trains .* pass projector='full' too"):
        model("qwen2_5_vl").add_adapter_to_model("x", LoraConfig(target_modules="all-linear"), vision_tower="full")
    with pytest.raises(ValueError, match="choose one of freeze, lora, full"):
        model("qwen2_5_vl").add_adapter_to_model("x", LoraConfig(target_modules="all-linear"), projector="train")
    from twinkle.model import TransformersModel

    text = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")
    with pytest.raises(ValueError, match="has no vision tower"):
        text.add_adapter_to_model("x", LoraConfig(target_modules="all-linear"), vision_tower="lora")


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_lora_sft_learns_and_the_adapter_loads_in_peft(family, tmp_path):
    ds = dataset(family, n=16)
    vl = model(family)
    vl.set_template(ds.template)
    # a random tiny model's head is too small to move the logits: it trains with the adapter (modules_to_save)
    vl.add_adapter_to_model("sft", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                              modules_to_save=["lm_head"]))
    vl.set_optimizer("AdamW", lr=1e-2)
    from twinkle.dataloader import DataLoader

    losses = []
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=0)
    for _ in range(3):
        for batch in loader:
            losses.append(vl.forward_backward(inputs=batch))
            vl.clip_grad_and_step()
    assert len(losses) == 12 and losses[-1] < 0.5 * losses[0], losses
    path = vl.save("ckpt", output_dir=str(tmp_path))
    names = {p.name for p in tmp_path.joinpath("ckpt").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "processor_config.json", "chat_template.jinja",
            "tokenizer.json"} <= names
    settings = json.loads((tmp_path / "ckpt" / "processor_config.json").read_text())
    assert settings["processor_class"] == type(ds.template.processor).__name__
    # plain transformers + peft: the same base model, the saved adapter, the same logits
    base = hf_model(family)  # same seed: the same random base weights twinkle trained the adapter on
    trained_base = {k.replace(".base_layer", "").replace(".original_module", ""): v
                    for k, v in vl.model.get_base_model().state_dict().items()
                    if "lora_" not in k and ".modules_to_save." not in k}
    assert base.state_dict().keys() == trained_base.keys()
    assert all(torch.equal(v, trained_base[k]) for k, v in base.state_dict().items())
    loaded = PeftModel.from_pretrained(base, path).eval()
    processor = load_processor(path)  # AutoProcessor (image-only where torchvision is missing)
    assert type(processor).__name__ == type(ds.template.processor).__name__
    batch = InputProcessor.for_template(ds.template)(ds[0:3])
    ours = vl.forward_only(inputs=ds[0:3])["logits"]
    with torch.no_grad():
        theirs = loaded(**{k: v for k, v in batch.items() if k != "labels"}).logits
    torch.testing.assert_close(ours, theirs, **within(VL_ANY.forward_bound(), theirs))  # a forward, elementwise


def test_full_training_with_a_frozen_vision_tower_saves_a_loadable_model(tmp_path):
    from transformers import AutoModelForImageTextToText

    ds = dataset("qwen3_vl", n=8)
    vl = model("qwen3_vl")
    vl.set_template(ds.template)
    vl.freeze_vision(vision_tower=True, projector=False)
    before = {n: p.detach().clone() for n, p in vl.model.named_parameters()}
    vl.set_optimizer("AdamW", lr=1e-3)
    vl.forward_backward(inputs=ds[0:4])
    vl.clip_grad_and_step()
    moved = {n for n, p in vl.model.named_parameters() if not torch.equal(p, before[n])}
    tower = {n for n in before if ".visual." in n and ".merger." not in n and ".deepstack_merger_list." not in n}
    assert tower and not (moved & tower)
    assert any(".merger." in n for n in moved) and any(".language_model." in n for n in moved)
    with pytest.raises(RuntimeError, match="before set_optimizer"):
        vl.freeze_vision()
    path = vl.save("full", output_dir=str(tmp_path))
    loaded = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    batch = InputProcessor.for_template(ds.template)(ds[0:2])
    with torch.no_grad():
        theirs = loaded(**{k: v for k, v in batch.items() if k != "labels"}).logits
    torch.testing.assert_close(vl.forward_only(inputs=ds[0:2])["logits"], theirs,
                               **within(VL_ANY.forward_bound(), theirs))  # a forward, elementwise


def test_fsdp2_wraps_the_vision_blocks_and_megatron_refuses_vl_models():
    from twinkle_hf.distributed.layers import decoder_layer_classes
    from twinkle_megatron.bridge.config import model_args
    from twinkle_megatron.errors import MegatronConfigError

    for family, layers in (("qwen2_5_vl", ["Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"]),
                           ("qwen3_vl", ["Qwen3VLTextDecoderLayer", "Qwen3VLVisionBlock"])):
        hf = hf_model(family)
        assert decoder_layer_classes(hf) == layers
        with pytest.raises(MegatronConfigError, match="does not train vision-language models.*qwen2.*llama.*"
                                                      "TransformersModel"):
            model_args(hf.config)
