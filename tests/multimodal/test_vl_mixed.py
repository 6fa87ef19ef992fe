"""Text-only rows mixed with image rows (one source or several), and the blank vision passes that keep
data-parallel ranks in step when only some micro-batches hold images."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from rounding import within
from vl_testing import FAMILIES, IMAGE_TOKEN, VL_ANY, expected_labels, hf_model, image_rows, model, template, text_rows

from twinkle.dataset import Dataset, DatasetMeta
from twinkle.multimodal.media import load_image
from twinkle.preprocessor import MessagesProcessor
from twinkle.processor import InputProcessor

FAMILY_NAMES = sorted(FAMILIES)


def encoded(family: str, *sources: list[dict], interleave: bool = False) -> Dataset:
    """The sources (lists of raw rows) in one Dataset, mapped, then encoded with the family's VL template."""
    ds = Dataset(DatasetMeta(data=sources[0]))
    for rows in sources[1:]:
        ds.add_dataset(DatasetMeta(data=rows))
    ds.mix_dataset(interleave=interleave)
    ds.map(MessagesProcessor())
    assert ds.column_names == ["messages", "tools", "images", "videos"]  # combined before encoding too
    ds.set_template(FAMILIES[family][0], model_id=FAMILIES[family][1])
    return ds.encode()


def reference_text(tmpl, messages: list[dict]) -> str:
    """The processor's own chat-template rendering, an image part where each <image> tag is."""
    parts = [{**m, "content": [{"type": "image"}, {"type": "text", "text": m["content"].removeprefix("<image>")}]}
             if m["content"].startswith("<image>") else m for m in messages]
    return tmpl.processor.apply_chat_template(parts, tokenize=False, chat_template=tmpl.chat_template)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_text_and_image_rows_mix_in_one_source_and_across_sources(family):
    images, texts = image_rows(2), text_rows(2)
    raw = [texts[0], images[0], texts[1], images[1]]  # a text-only row first: its columns must not win
    single = encoded(family, raw)
    added = encoded(family, images, texts, interleave=True)  # two sources whose columns differ
    concatenated = encoded(family, texts, images)
    tmpl = template(family)
    pad = tmpl.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])
    for ds, order in ((single, raw), (added, [images[0], texts[0], images[1], texts[1]]),
                      (concatenated, texts + images)):
        assert len(ds) == 4
        for row, source in zip(ds, order):
            ids = tmpl.processor(text=[reference_text(tmpl, source["messages"])],
                                 images=[load_image(x) for x in source.get("images", [])] or None,
                                 add_special_tokens=False)["input_ids"][0]
            assert row["input_ids"] == list(ids)
            assert row["labels"] == expected_labels(row["input_ids"], tmpl.tokenizer)
            answer = source["messages"][1]["content"]
            assert tmpl.tokenizer.decode([t for t in row["labels"] if t != -100]) == answer + "<|im_end|>"
            assert row["videos"] == []
            if "images" in source:
                assert len(row["images"]) == 1 and row["input_ids"].count(pad) > 0
            else:  # a text-only row: empty media, no image token
                assert row["images"] == [] and pad not in row["input_ids"]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_mixed_batch_trains_like_plain_transformers(family):
    images, texts = image_rows(2, seed=1), text_rows(2)
    ds = encoded(family, images, texts, interleave=True)
    rows = ds[0:4]
    vl = model(family)
    vl.set_template(ds.template)
    vl.set_optimizer("AdamW", lr=1e-3)
    loss = vl.forward_backward(inputs=rows)
    grads = {n: p.grad.clone() for n, p in vl.model.named_parameters() if p.grad is not None}
    # reference: transformers alone, on the processor's own batch of the same four conversations
    reference = hf_model(family)
    reference.load_state_dict(vl.model.state_dict())
    tmpl = ds.template
    sources = [images[0], texts[0], images[1], texts[1]]
    batch = tmpl.processor(text=[reference_text(tmpl, s["messages"]) for s in sources],
                           images=[load_image(r["images"][0]) for r in images], padding=True, return_tensors="pt",
                           add_special_tokens=False)
    ours = InputProcessor.for_template(tmpl)(rows)
    assert torch.equal(batch["input_ids"], ours["input_ids"]) and torch.equal(batch["pixel_values"],
                                                                               ours["pixel_values"])
    want = reference(**batch, labels=ours["labels"]).loss
    want.backward()
    # the same step, its sums in another order (tests/rounding.py): the loss a forward's, gradients a step's bound
    assert loss == pytest.approx(float(want.detach()), rel=VL_ANY.forward_bound(), abs=0)
    theirs = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert grads.keys() == theirs.keys() and any(".visual." in n or ".vision_tower." in n for n in grads)
    for name, grad in theirs.items():
        torch.testing.assert_close(grads[name], grad, **within(VL_ANY.step_bound(), grad), msg=name)
    before = {n: p.detach().clone() for n, p in vl.model.named_parameters()}
    vl.clip_grad_and_step()
    moved = {n for n, p in vl.model.named_parameters() if not torch.equal(p, before[n])}
    assert any(".visual." in n or ".vision_tower." in n for n in moved) and any(".language_model." in n for n in moved)


def test_blank_vision_passes_run_the_tower_and_change_no_real_gradient():
    from twinkle_hf.model.vision_lockstep import VisionLockstep, extra_vision_passes

    ds = encoded("qwen2_5_vl", image_rows(2), text_rows(2))
    vl = model("qwen2_5_vl")
    vl.set_template(ds.template)
    vl.add_adapter_to_model("sft", LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False),
                            vision_tower="lora", projector="full")
    vl.set_optimizer("AdamW", lr=1e-3)
    blocks = [m for m in vl.model.modules() if type(m).__name__ == "Qwen2_5_VLVisionBlock"]
    calls = []
    for block in blocks:
        block.register_forward_hook(lambda *_: calls.append(1))

    def run(rows, passes):
        vl.model.zero_grad(set_to_none=True)
        calls.clear()
        if passes:
            with extra_vision_passes(vl.backend.hf_model(), VisionLockstep(vl.backend).blank_inputs(), passes):
                loss = vl.forward_backward(inputs=rows, adapter_name="sft")
        else:
            loss = vl.forward_backward(inputs=rows, adapter_name="sft")
        grads = {n: None if p.grad is None else p.grad.clone() for n, p in vl.model.named_parameters()
                 if p.requires_grad}
        return loss, grads, len(calls) // len(blocks)

    text, mixed = ds[2:4], ds[0:4]
    plain_loss, plain, plain_passes = run(text, 0)
    blank_loss, blank, blank_passes = run(text, 2)
    assert (plain_passes, blank_passes) == (0, 2)
    assert blank_loss == plain_loss  # bitwise: 0 x the blank image's features
    vision = {n for n in plain if ".visual." in n}
    assert vision and all(plain[n] is None for n in vision)  # a text batch leaves the tower without gradient
    assert all(blank[n] is not None and not blank[n].any() for n in vision)  # ... the blank passes: exact zeros
    for name in plain.keys() - vision:
        assert torch.equal(blank[name], plain[name]), name
    real_loss, real, real_passes = run(mixed, 0)
    both_loss, both, both_passes = run(mixed, 1)
    assert (real_passes, both_passes) == (1, 2) and both_loss == real_loss
    assert any(real[n].any() for n in vision)
    for name, grad in real.items():
        assert torch.equal(both[name], grad), name
