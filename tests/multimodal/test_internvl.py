"""InternVL 2.5 through the VL path: its conversation format, tiled images, collation, LoRA parts, lockstep inputs.

(Loss parity with plain transformers, LoRA training and the peft load run for it in test_vl_model.py.)
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from vl_testing import dataset, expected_labels, model, template

from twinkle.dataset.errors import DataError
from twinkle.multimodal.shapes import shape_image
from twinkle.processor import InputProcessor
from twinkle.template.chat_templates import INTERNVL2_5, INTERNVL2_5_SYSTEM

NO_MARKERS = INTERNVL2_5.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")


def conversation(images):
    return [{"role": "user", "content": [{"type": "image", "image": images[0]}, {"type": "text", "text": "Colour?"}]},
            {"role": "assistant", "content": "red"},
            {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "image", "image": images[1]}]},
            {"role": "assistant", "content": "It is blue."}]


@pytest.mark.parametrize("markers", [True, False], ids=["generation-markers", "prefix-render"])
def test_labels_token_by_token_with_tiled_images(markers):
    images = [shape_image("red", "circle"), shape_image("blue", "square", size=150)]
    tmpl = template("internvl2_5", **({} if markers else {"chat_template": NO_MARKERS}))
    encoded = tmpl.encode({"messages": conversation(images)})
    processor, tok = tmpl.processor, tmpl.tokenizer
    parts = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
             if isinstance(m["content"], list) else m for m in conversation(images)]
    text = processor.apply_chat_template(parts, tokenize=False, chat_template=tmpl.chat_template)
    assert text.startswith(f"<|im_start|>system\n{INTERNVL2_5_SYSTEM}<|im_end|>\n<|im_start|>user\n<IMG_CONTEXT>\n")
    ref = processor(text=[text], images=images, add_special_tokens=False)
    assert encoded["input_ids"] == list(ref["input_ids"][0])
    assert encoded["labels"] == expected_labels(encoded["input_ids"], tok)
    tiles = processor.image_processor(images=images, crop_to_patches=True)["num_patches"]
    assert list(tiles) == [1, 5]  # a 64-pixel square: one tile; 150 pixels: 2x2 tiles + the thumbnail
    context = tok.convert_tokens_to_ids("<IMG_CONTEXT>")
    assert encoded["input_ids"].count(context) == processor.image_seq_length * sum(tiles)
    vision = {context, tok.convert_tokens_to_ids("<img>"), tok.convert_tokens_to_ids("</img>")}
    assert all(label == -100 for i, label in zip(encoded["input_ids"], encoded["labels"]) if i in vision)
    assert [tok.decode([t]) for t in encoded["labels"] if t != -100] == \
        ["red", "<|im_end|>", *[tok.decode([t]) for t in tok("It is blue.")["input_ids"]], "<|im_end|>"]


def test_collation_gives_the_tiles_and_refuses_packing_and_videos():
    ds = dataset("internvl2_5", n=3)
    tmpl = ds.template
    rows = ds[0:3]
    batch = InputProcessor.for_template(tmpl)(rows)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "pixel_values"}
    from twinkle.multimodal.media import load_image

    reference = tmpl.processor.image_processor(images=[load_image(r["images"][0]) for r in rows],
                                               crop_to_patches=True, return_tensors="pt")
    assert torch.equal(batch["pixel_values"], reference["pixel_values"])
    with pytest.raises(DataError, match="InternVL2_5Template does not pack rows"):
        InputProcessor.for_template(tmpl, padding_free=True)(rows)
    frames = [shape_image("red", "circle"), shape_image("red", "square")]
    with pytest.raises(DataError, match="row 0: the row has a video: InternVL 2.5 takes images"):
        tmpl.encode({"messages": [{"role": "user", "content": "<video>What moves?"},
                                  {"role": "assistant", "content": "a circle"}], "videos": [frames]})


def test_lora_parts_and_the_blank_image_of_lockstep():
    from twinkle_hf.model.vision_lockstep import VisionLockstep

    vl = model("internvl2_5")
    vl.add_adapter_to_model("lm", LoraConfig(r=4, target_modules="all-linear"))
    tuned = {n.rsplit(".lora_A", 1)[0] for n, _ in vl.model.named_modules() if n.endswith(".lora_A")}
    assert tuned and all(".language_model." in n for n in tuned)
    vl = model("internvl2_5")
    vl.set_template(dataset("internvl2_5", n=1).template)
    vl.add_adapter_to_model("all", LoraConfig(r=4, target_modules="all-linear"), vision_tower="lora", projector="full")
    tuned = {n.rsplit(".lora_A", 1)[0] for n, _ in vl.model.named_modules() if n.endswith(".lora_A")}
    assert any(".vision_tower." in n for n in tuned) and not any(".multi_modal_projector." in n for n in tuned)
    projector = [p for n, p in vl.model.named_parameters() if ".multi_modal_projector.modules_to_save." in n]
    assert projector and all(p.requires_grad for p in projector)
    blank = VisionLockstep(vl.backend).blank_inputs()  # what a rank without images runs the tower on
    assert set(blank) == {"pixel_values"} and blank["pixel_values"].shape[1:] == (3, 56, 56)
    features = vl.backend.hf_model().get_image_features(**blank)
    values = [features] if torch.is_tensor(features) else list(features.values() if hasattr(features, "values")
                                                                else features)
    assert any(torch.is_tensor(v) and v.is_floating_point() for v in values)
