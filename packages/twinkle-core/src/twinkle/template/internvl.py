"""InternVL 2.5: images tiled into 448-pixel crops (plus a thumbnail), each crop a fixed number of tokens.

The model's processor (transformers' ``InternVLProcessor``) does the model-specific work, as for the
other VL families: its image processor cuts each image into between ``min_patches`` and
``max_patches`` tiles of the vision tower's size (aspect ratio kept) plus a thumbnail, and it expands
every ``<IMG_CONTEXT>`` placeholder the chat template writes into ``<img>`` + ``<IMG_CONTEXT>`` x
(tiles x ``image_seq_length``) + ``</img>``; all of those tokens are -100. The conversation format is
InternVL 2.5's (ChatML with its default system prompt). Collation asks the image processor for the
batch's ``pixel_values`` (tiles x 3 x H x W) the way the processor would (``crop_to_patches=True``).

InternVL 2.5 is supported for images; a row with a video is refused with that reason.
"""

from __future__ import annotations

from typing import ClassVar

from twinkle.template import chat_templates
from twinkle.template.vl import VLTemplate

INTERNVL_PACKING = (
    "{name} does not pack rows (padding_free=True): twinkle collates multimodal rows padded, one sequence per "
    "row. Use padding (padding_free=False); the padded batch trains the same tokens."
)


class InternVL2_5Template(VLTemplate):
    """InternVL 2.5 (InternViT + MLP projector + a Qwen2.5 / InternLM2.5 language model), images."""

    turn_end_token = "<|im_end|>"
    fallback_chat_template = chat_templates.INTERNVL2_5
    packing_refusal: ClassVar[str] = INTERNVL_PACKING
    video_refusal: ClassVar[str | None] = (
        "InternVL 2.5 takes images (it is supported for images); give the video's frames as images "
        "(one <image> tag each) or use a Qwen-VL family for videos.")
