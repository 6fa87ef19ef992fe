"""Images and videos through the data path (see docs/multimodal.md).

``media``: how rows carry media (tags in the text, paths/bytes in ``images``/``videos`` columns);
``processor``: loading and saving the model's transformers processor; ``collate``: turning a
batch's stored media into the model's vision inputs. The VL templates live in ``twinkle.template.vl``.
Nothing heavy is imported here (Pillow, datasets and transformers load on first use).
"""

from __future__ import annotations

from twinkle.multimodal.media import IMAGE_TAG, MEDIA_COLUMNS, VIDEO_TAG

__all__ = ["IMAGE_TAG", "MEDIA_COLUMNS", "VIDEO_TAG"]
