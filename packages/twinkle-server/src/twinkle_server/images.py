"""Images in a ``ModelInput`` (the client's ``ImageChunk``) for a vision-language base model.

An image chunk stands where the model's image tokens go: the server asks the model's own
processor (the VL template's, as a script's data path does) how many tokens the image takes,
puts that many image-pad tokens there, and hands the image bytes along with the row; the template's
media collator turns them into ``pixel_values`` at collate time, exactly as for a script's rows.
The image is checked before it is decoded: its format, and its pixel count from the header
(``MAX_PIXELS``), so a small file declaring a huge image costs nothing.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

#: Images larger than this many pixels (read from the header, before decoding) are refused.
MAX_PIXELS = 4096 * 4096
#: VL templates by the config's ``model_type``.
TEMPLATES = {"qwen2_vl": "Qwen2VLTemplate", "qwen2_5_vl": "Qwen2_5VLTemplate", "qwen3_vl": "Qwen3VLTemplate",
             "qwen3_5": "Qwen3_5VLTemplate"}


class ImageError(ValueError):
    """An image the server cannot use; the message says why."""


def template_name(model_path: str) -> str | None:
    """The VL template of a vision-language model directory (None: a text model)."""
    import json
    from pathlib import Path

    config = json.loads((Path(model_path) / "config.json").read_text())
    if "vision_config" not in config:
        return None
    return TEMPLATES.get(config.get("model_type"), "VLTemplate")


class ImageInputs:
    """How many tokens an image takes for this model, and which ids mark images (see the module docstring)."""

    def __init__(self, processor: Any, image_token_id: int, vision_start_id: int | None) -> None:
        self.processor = processor
        self.image_token_id = image_token_id
        self.vision_start_id = vision_start_id
        self._counts: dict[str, int] = {}

    @classmethod
    def for_model(cls, model_path: str, model_id: str) -> ImageInputs | None:
        import json
        from pathlib import Path

        from twinkle.registry import resolve

        name = template_name(model_path)
        if name is None:
            return None
        config = json.loads((Path(model_path) / "config.json").read_text())
        processor = resolve("template", name)(model_id=model_id).processor
        return cls(processor, int(config["image_token_id"]), config.get("vision_start_token_id"))

    def tokens(self, data: bytes, fmt: str, where: str) -> int:
        """The number of image tokens ``data`` takes (checked: format, size), cached by content."""
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._counts:
            return self._counts[digest]
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(data))
        except (UnidentifiedImageError, OSError):
            raise ImageError(f"{where}: the image data is not a PNG or JPEG image.") from None
        actual = (image.format or "").lower()
        if actual not in ("png", "jpeg") or (fmt and fmt.lower() not in (actual, "jpg" if actual == "jpeg" else "")):
            raise ImageError(f"{where}: format {fmt!r} was sent but the data is {actual or 'unknown'}; send PNG or "
                             "JPEG with its format.")
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise ImageError(f"{where}: the image is {width}x{height}; this server takes at most {MAX_PIXELS} "
                             "pixels per image (resize it first).")
        try:
            features = self.processor.image_processor(images=[image.convert("RGB")], return_tensors="np")
        except Exception as exc:  # noqa: BLE001 - the processor's own complaint, passed on
            raise ImageError(f"{where}: the model's image processor refused the image ({exc}).") from None
        merge = int(getattr(self.processor.image_processor, "merge_size", 1) or 1)
        count = int(features["image_grid_thw"].prod()) // (merge * merge)
        self._counts[digest] = count
        if len(self._counts) > 4096:
            self._counts.pop(next(iter(self._counts)))
        return count
