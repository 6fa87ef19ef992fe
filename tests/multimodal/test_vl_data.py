"""The multimodal data path: preprocessors, VL templates (labels token by token), truncation, collation, resume."""

from __future__ import annotations

import io
import itertools

import pytest
import torch
from vl_testing import FAMILIES, QWEN_FAMILIES, dataset, expected_labels, template

from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, Dataset, DatasetMeta
from twinkle.multimodal.media import load_image
from twinkle.multimodal.processor import has_video_processor
from twinkle.multimodal.shapes import shape_image
from twinkle.preprocessor import AlpacaProcessor, MessagesProcessor
from twinkle.processor import InputProcessor
from twinkle.template.chat_templates import QWEN_VL

FAMILY_NAMES = sorted(QWEN_FAMILIES)  # Qwen-VL's tokens and grids; InternVL: test_internvl.py
NO_MARKERS = QWEN_VL.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def conversation(images):
    """Two user turns with an image each, two replies (parts form, as an OpenAI/HF client sends)."""
    return [
        {"role": "system", "content": "You describe pictures."},
        {"role": "user", "content": [{"type": "image", "image": images[0]}, {"type": "text", "text": "Colour?"}]},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": [{"type": "text", "text": "And this one "},
                                     {"type": "image", "image": images[1]}, {"type": "text", "text": "?"}]},
        {"role": "assistant", "content": "It is blue."},
    ]


@pytest.mark.parametrize("markers", [True, False], ids=["generation-markers", "prefix-render"])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_labels_token_by_token(family, markers):
    images = [shape_image("red", "circle"), shape_image("blue", "square", size=96)]
    tmpl = template(family, **({} if markers else {"chat_template": NO_MARKERS}))
    encoded = tmpl.encode({"messages": conversation(images)})
    processor = tmpl.processor
    # the reference: the processor alone, on the chat template's rendering of the same conversation
    parts = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
             if isinstance(m["content"], list) else m for m in conversation(images)]
    text = processor.apply_chat_template(parts, tokenize=False, chat_template=tmpl.chat_template)
    ref = processor(text=[text], images=images, add_special_tokens=False)
    assert encoded["input_ids"] == list(ref["input_ids"][0])
    assert encoded["labels"] == expected_labels(encoded["input_ids"], tmpl.tokenizer)
    pad = tmpl.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = processor.image_processor.merge_size ** 2
    assert encoded["input_ids"].count(pad) == int(sum(g.prod() for g in torch.as_tensor(ref["image_grid_thw"]))
                                                  // merge) > 2
    assert all(label == -100 for i, label in zip(encoded["input_ids"], encoded["labels"]) if i == pad)
    assert [tmpl.tokenizer.decode([t]) for t in encoded["labels"] if t != -100] == \
        ["red", "<|im_end|>", *[tmpl.tokenizer.decode([t]) for t in tmpl.tokenizer("It is blue.")["input_ids"]],
         "<|im_end|>"]
    assert len(encoded["images"]) == 2 and encoded["videos"] == []


def test_every_input_form_encodes_the_same(tmp_path):
    image = shape_image("green", "triangle")
    path = tmp_path / "shape.png"
    image.save(path)
    question, answer = "What colour is the shape?", "green"
    reply = [{"type": "text", "text": answer}]  # Arrow needs one type per column: parts everywhere
    raw = [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                   {"type": "text", "text": question}]},
                      {"role": "assistant", "content": reply}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(path)}},
                                                   {"type": "text", "text": question}]},
                      {"role": "assistant", "content": reply}]},
        {"messages": [{"role": "user", "content": f"<image>{question}"}, {"role": "assistant", "content": answer}],
         "images": [png(image)]},
        {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}],
         "image": str(path)},  # LLaVA style: no tag, the image goes before the first user turn
    ]
    encoded = []
    for row in raw:
        ds = Dataset(DatasetMeta(data=[row]))
        ds.map(MessagesProcessor())
        assert ds.column_names == ["messages", "tools", "images", "videos"]
        assert ds[0]["messages"][0]["content"] == f"<image>{question}"
        ds.set_template("Qwen2_5VLTemplate", model_id=FAMILIES["qwen2_5_vl"][1])
        ds.encode()
        encoded.append(ds[0])
    alpaca = Dataset(DatasetMeta(data=[{"instruction": question, "output": answer, "images": [str(path)]}]))
    alpaca.map(AlpacaProcessor()).set_template("Qwen2_5VLTemplate", model_id=FAMILIES["qwen2_5_vl"][1])
    encoded.append(alpaca.encode()[0])
    stored = {"path": None, "bytes": png(image)}
    assert encoded[0]["images"] == [stored] and encoded[2]["images"] == [stored]
    assert encoded[1]["images"] == [{"path": str(path), "bytes": None}]  # a path stays a path in Arrow
    collate = InputProcessor.for_template(template("qwen2_5_vl"))
    batches = [collate([row]) for row in encoded]
    for batch in batches[1:]:
        assert batch.keys() == batches[0].keys()
        for key in batch:
            assert torch.equal(batch[key], batches[0][key]), key


def test_bad_media_rows_name_the_row_and_the_fix(tmp_path):
    tmpl = template("qwen2_5_vl")
    image = png(shape_image("red", "circle"))
    two_tags = {"messages": [{"role": "user", "content": "<image><image>hi"}, {"role": "assistant", "content": "x"}],
                "images": [image]}
    with pytest.raises(DataError, match=r"row 0: the conversation has 2 <image> tag\(s\) but the row gives 1"):
        tmpl.encode(two_tags)
    url = {"messages": [{"role": "user", "content": [{"type": "image", "image": "https://example.com/a.png"}]},
                        {"role": "assistant", "content": "x"}]}
    with pytest.raises(DataError, match="is a URL; twinkle does not download"):
        tmpl.encode(url)
    missing = {"messages": [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "x"}],
               "images": [str(tmp_path / "nope.png")]}
    with pytest.raises(DataError, match="does not exist"):
        tmpl.encode(missing)
    both = {"messages": [{"role": "user", "content": [{"type": "image", "image": image}]},
                         {"role": "assistant", "content": "x"}], "images": [image]}
    with pytest.raises(DataError, match="both inside message contents and in an images/videos column"):
        tmpl.encode(both)
    ds = Dataset(DatasetMeta(data=[{"messages": [{"role": "user", "content": "<image>hi"},
                                                 {"role": "assistant", "content": "x"}], "images": [b"not a png"]}]))
    ds.map(MessagesProcessor()).set_template(tmpl)
    with pytest.raises(DataError, match="cannot decode image"):
        ds.encode()
    assert ds.column_names == ["messages", "tools", "images", "videos"]  # a failed encode changes nothing


def test_truncation_never_splits_an_image(twinkle_log_vl):
    row = {"messages": [{"role": "user", "content": "<image>What colour is the shape?"},
                        {"role": "assistant", "content": "It is red, a bright and clear red colour."}],
           "images": [png(shape_image("red", "circle"))]}
    full = template("qwen2_5_vl").encode(row)
    pad = template("qwen2_5_vl").tokenizer.convert_tokens_to_ids("<|image_pad|>")
    first_pad, last_pad = full["input_ids"].index(pad), len(full["input_ids"]) - full["input_ids"][::-1].index(pad)
    n = full["length"]
    # a right cut after the image keeps the row (and the whole image)
    kept = template("qwen2_5_vl", max_length=n - 2, truncation_strategy="right").encode(row)
    assert kept["input_ids"] == full["input_ids"][:n - 2] and kept["images"] == full["images"]
    # cuts through the image: dropped, never split
    assert template("qwen2_5_vl", max_length=last_pad - 1, truncation_strategy="right").encode(row) is None
    assert template("qwen2_5_vl", max_length=n - first_pad - 1, truncation_strategy="left").encode(row) is None
    # ... and so do cuts that would leave the image without its <|vision_start|>/<|vision_end|> markers
    assert template("qwen2_5_vl", max_length=last_pad, truncation_strategy="right").encode(row) is None
    assert template("qwen2_5_vl", max_length=n - first_pad, truncation_strategy="left").encode(row) is None
    with pytest.raises(DataError, match="more than max_length"):
        template("qwen2_5_vl", max_length=n - 1).encode(row)
    ds = Dataset(DatasetMeta(data=[row, {**row, "messages": [row["messages"][0], {"role": "assistant",
                                                                                  "content": "red"}]}]))
    ds.map(MessagesProcessor()).set_template("Qwen2_5VLTemplate", model_id=FAMILIES["qwen2_5_vl"][1],
                                             max_length=n - first_pad, truncation_strategy="left")
    ds.encode()
    assert len(ds) == 1 and ds[0]["input_ids"] == template("qwen2_5_vl").encode(
        {**row, "messages": [row["messages"][0], {"role": "assistant", "content": "red"}]})["input_ids"]
    assert "1 truncation would cut through an image or video" in twinkle_log_vl.text


@pytest.fixture
def twinkle_log_vl(caplog):
    import logging

    from twinkle.log import get_logger

    logger = get_logger("twinkle")
    logger.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.WARNING)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_padding_collates_vision_inputs_and_packing_is_refused(family):
    ds = dataset(family, n=4)
    tmpl = ds.template
    rows = ds[0:3]
    batch = InputProcessor.for_template(tmpl)(rows)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw",
                          "mm_token_type_ids"}
    assert batch["input_ids"].shape == (3, max(r["length"] for r in rows))
    reference = tmpl.processor(images=[load_image(r["images"][0]) for r in rows], return_tensors="pt")
    assert torch.equal(batch["pixel_values"], reference["pixel_values"])
    assert torch.equal(batch["image_grid_thw"], reference["image_grid_thw"])
    pad = tmpl.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert torch.equal(batch["mm_token_type_ids"], (batch["input_ids"] == pad).long())
    with pytest.raises(DataError, match="does not pack rows.*get_rope_index"):
        InputProcessor.for_template(tmpl, padding_free=True)(rows)
    with pytest.raises(DataError, match="no media collator"):
        InputProcessor()(rows)


def test_arrow_holds_bytes_not_pixels_and_resume_is_exact():
    ds = dataset("qwen2_5_vl", n=12)
    features = ds.hf_dataset.features
    assert repr(features["images"]) == "List(Image(mode=None, decode=False))"
    assert "pixel_values" not in ds.column_names
    collate = InputProcessor.for_template(ds.template)
    full = DataLoader(ds, batch_size=2, shuffle=True, seed=3, processor=collate)
    uninterrupted = list(itertools.islice(full, 5))
    first = DataLoader(ds, batch_size=2, shuffle=True, seed=3, processor=collate)
    list(itertools.islice(first, 2))
    resumed = DataLoader(ds, batch_size=2, shuffle=True, seed=3, processor=collate)
    resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
    for want, got in zip(uninterrupted[2:], itertools.islice(resumed, 3)):
        assert want.keys() == got.keys()
        for key in want:
            assert torch.equal(want[key], got[key]), key


def test_videos_go_through_the_video_processor_or_are_refused_with_the_fix():
    tmpl = template("qwen2_5_vl")
    frames = [png(shape_image("red", "circle", rng=None)) for _ in range(4)]
    row = {"messages": [{"role": "user", "content": "<video>What colour?"}, {"role": "assistant", "content": "red"}],
           "videos": [frames]}
    ds = Dataset(DatasetMeta(data=[row]))
    ds.map(MessagesProcessor())
    assert len(ds[0]["videos"][0]["frames"]) == 4
    if has_video_processor(tmpl.processor):  # torchvision present: the video's tokens are never trained
        encoded = tmpl.encode(ds[0])
        pad = tmpl.tokenizer.convert_tokens_to_ids("<|video_pad|>")
        assert encoded["input_ids"].count(pad) > 0
        assert all(lab == -100 for i, lab in zip(encoded["input_ids"], encoded["labels"]) if i == pad)
    else:
        with pytest.raises(DataError, match="row 0: the row has a video but .* torchvision"):
            tmpl.encode(ds[0])


def test_vl_templates_resolve_by_name_and_need_a_model():
    from twinkle.registry import resolve
    from twinkle.template import Qwen2_5VLTemplate, Qwen3_5VLTemplate, Qwen3VLTemplate

    for name, cls in (("Qwen2_5VLTemplate", Qwen2_5VLTemplate), ("Qwen3VLTemplate", Qwen3VLTemplate),
                      ("Qwen3_5VLTemplate", Qwen3_5VLTemplate)):
        assert resolve("template", name) is cls
    with pytest.raises(DataError, match="needs model_id="):
        _ = Qwen2_5VLTemplate().processor
    with pytest.raises(DataError, match="not a vision-language model"):
        _ = Qwen2_5VLTemplate(model_id="twinkle://tiny-qwen").processor
