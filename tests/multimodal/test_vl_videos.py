"""Videos as frame lists on the Qwen-VL families without torchvision (FramesVideoProcessor), and video files refused."""

from __future__ import annotations

import pytest
import torch
from vl_testing import QWEN_FAMILIES, expected_labels, model, template

from twinkle.dataset.errors import DataError
from twinkle.multimodal.frames import FramesVideoProcessor
from twinkle.multimodal.shapes import shape_image
from twinkle.processor import InputProcessor


def _row(frames, answer="the shape"):
    return {"messages": [{"role": "user", "content": "<video>What changes?"}, {"role": "assistant", "content": answer}],
            "videos": [frames]}


def test_frames_are_laid_out_as_transformers_video_patches():
    tmpl = template("qwen2_5_vl")
    image_processor = tmpl.processor.image_processor
    frames = FramesVideoProcessor(image_processor)
    f0, f1 = shape_image("red", "circle"), shape_image("blue", "square")
    image = image_processor(images=[f0, f1], return_tensors="np")
    t, p = image_processor.temporal_patch_size, image_processor.patch_size
    per_image = torch.as_tensor(image["pixel_values"]).reshape(2, -1, 3, t, p, p)  # each image repeated along time
    video = frames(videos=[[f0, f1]], return_tensors="pt")
    assert video["video_grid_thw"].tolist() == [[1, *image["image_grid_thw"][0][1:].tolist()]]
    slots = video["pixel_values_videos"].reshape(-1, 3, t, p, p)  # (patches, C, T, p, p): frame k in time slot k
    assert torch.equal(slots[:, :, 0], per_image[0, :, :, 0]) and torch.equal(slots[:, :, 1], per_image[1, :, :, 0])
    still = frames(videos=[[f0, f0]], return_tensors="pt")  # a still video is the image, patch for patch
    assert torch.equal(still["pixel_values_videos"], torch.as_tensor(image["pixel_values"][:len(slots)]))
    odd = frames(videos=[[f0, f1, f0]], return_tensors="pt", return_metadata=True)  # padded with the last frame
    assert odd["video_grid_thw"][0, 0] == 2 and odd["video_metadata"][0].frames_indices == [0, 1, 2]


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_a_row_with_frames_encodes_collates_and_trains(family):
    tmpl = template(family)
    assert type(tmpl.processor.video_processor).__name__ == "FramesVideoProcessor"  # no torchvision here
    rows = [tmpl.encode(_row([shape_image(c, s) for s in ("circle", "square", "triangle", "circle")], f"{c} moves"))
            for c in ("red", "blue")]
    tok = tmpl.tokenizer
    pad = tok.convert_tokens_to_ids("<|video_pad|>")
    batch = InputProcessor.for_template(tmpl)(rows)
    grids = batch["video_grid_thw"]
    merge = tmpl.processor.image_processor.merge_size ** 2
    for k, row in enumerate(rows):
        assert row["input_ids"].count(pad) == int(grids[k].prod()) // merge > 0
        assert row["labels"] == expected_labels(row["input_ids"], tok)
        assert all(label == -100 for i, label in zip(row["input_ids"], row["labels"]) if i == pad)
        assert len(row["videos"]) == 1 and len(row["videos"][0]["frames"]) == 4 and row["images"] == []
    assert batch["pixel_values_videos"].shape[0] == int(grids.prod(dim=1).sum())
    vl = model(family)
    vl.set_template(tmpl)
    vl.set_optimizer("AdamW", lr=1e-2)
    losses = []
    for _ in range(3):
        losses.append(vl.forward_backward(inputs=rows))
        grads = [p.grad for n, p in vl.model.named_parameters() if ".visual." in n and p.grad is not None]
        vl.clip_grad_and_step()
    assert grads and losses[-1] < losses[0], losses  # the vision tower ran on the frames and the loss falls


def test_a_video_file_says_what_to_install(tmp_path):
    import json

    template("qwen3_vl").save_pretrained(tmp_path)  # the frames processor is twinkle's: never written
    assert "video_processor" not in json.loads((tmp_path / "processor_config.json").read_text())
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"not decoded here")
    tmpl = template("qwen2_5_vl")
    with pytest.raises(DataError, match="row 0: .*clip.mp4.*pip install torchvision av"):
        tmpl.encode(_row(str(clip)))


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_frames_of_two_sizes_are_refused_naming_the_sizes_and_a_grey_frame_is_converted(family):
    """transformers' processor stacks a video's frames with numpy, whose error names neither the row, the video
    nor the fix: the sizes are checked before it. A grey frame among RGB ones is converted to RGB."""
    tmpl = template(family)
    with pytest.raises(DataError, match=r"^row 0: a video's frames have different sizes \(width x height: "
                                        r"\[\(64, 64\), \(96, 96\)\]\).*resize them"):
        tmpl.encode(_row([shape_image("red", "circle"), shape_image("red", "circle", size=96)]))
    grey = shape_image("blue", "square").convert("L")
    mixed = tmpl.encode(_row([shape_image("red", "circle"), grey]))
    rgb = tmpl.encode(_row([shape_image("red", "circle"), grey.convert("RGB")]))
    assert mixed["input_ids"] == rgb["input_ids"]  # encoded (numpy's stacking refused it before) like RGB frames
