"""MediaCollator: the images and videos of a batch's rows -> the vision inputs of the model's forward.

The rows were encoded by a VL template, so their ``input_ids`` already hold the right number of
image/video tokens; here the model's own processor turns the stored images (paths/bytes) into
``pixel_values`` + ``image_grid_thw`` (videos: ``pixel_values_videos`` + ``video_grid_thw``), in
row order, and marks the media tokens (``mm_token_type_ids``) for families whose rotary positions
need them. Pixels exist only for the batch being trained, never in the dataset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.dataset.errors import DataError
from twinkle.multimodal.media import load_image, load_video
from twinkle.multimodal.processor import has_video_processor


class MediaCollator:
    """Vision inputs of a batch from a transformers processor.

    ``packing_refusal``: why this family cannot be packed (``padding_free=True``); the
    InputProcessor raises it. Families with multimodal rotary positions (Qwen-VL) compute them per
    padded row from the image grids, which packed rows would break.
    """

    def __init__(self, processor: Any, packing_refusal: str | None = None) -> None:
        self.processor = processor
        self.packing_refusal = packing_refusal

    def __call__(self, rows: Sequence[Mapping[str, Any]], input_ids: Any) -> dict[str, Any]:
        import torch

        images = [load_image(item) for row in rows for item in (row.get("images") or [])]
        videos = [load_video(item) for row in rows for item in (row.get("videos") or [])]
        out: dict[str, Any] = {}
        if videos and not has_video_processor(self.processor):
            raise DataError(f"the batch has videos but {type(self.processor).__name__} has no video processor "
                            "(transformers builds video processors on torchvision; install it for this torch).")
        out.update(vision_inputs(self.processor, images, videos))
        if "mm_token_type_ids" in getattr(self.processor, "model_input_names", ()):
            out["mm_token_type_ids"] = torch.as_tensor(self.processor.create_mm_token_type_ids(input_ids.tolist()),
                                                       dtype=torch.long)
        return out

    def __repr__(self) -> str:
        return f"MediaCollator({type(self.processor).__name__})"


def blank_image_inputs(processor: Any, size: int = 56) -> dict[str, Any]:
    """The processor's vision inputs (``pixel_values``, ``image_grid_thw``...) for one blank image.

    A data-parallel rank whose micro-batch has no image runs the vision tower on these while other
    ranks run it on theirs, so that all ranks take part in the same collectives (see docs/multimodal.md).
    ``size``: a small image (the processor resizes it up to its own minimum where it has one).
    """
    from twinkle.extras import require

    Image = require("PIL.Image", "the blank image of a rank without images")

    return vision_inputs(processor, [Image.new("RGB", (size, size), (0, 0, 0))], [])


#: processors that place media by reading the text (``processor(images=...)`` without text fails): their image
#: processor is asked directly, with the options the processor itself passes it (InternVL: crop_to_patches=True)
TEXT_PLACED = ("InternVLProcessor",)


def vision_inputs(processor: Any, images: Sequence[Any], videos: Sequence[Any]) -> dict[str, Any]:
    """The tensors ``processor`` makes of ``images`` and ``videos`` (none: an empty dict)."""
    import torch

    if not images and not videos:
        return {}
    if type(processor).__name__ in TEXT_PLACED:
        if videos:
            raise DataError(f"{type(processor).__name__}: twinkle collates images for this family, not videos.")
        options = dict(getattr(type(processor), "images_kwargs", None) or {})
        features = processor.image_processor(images=list(images), return_tensors="pt", **options)
    else:
        features = processor(images=list(images) or None, videos=list(videos) or None, return_tensors="pt")
    return {k: v for k, v in features.items() if isinstance(v, torch.Tensor) and k != "num_patches"}
