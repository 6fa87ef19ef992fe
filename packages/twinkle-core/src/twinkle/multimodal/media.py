"""Images and videos inside conversations: how rows carry them, and how they are stored.

A multimodal row in the standard format keeps every message's ``content`` a string, with one
``<image>`` / ``<video>`` tag where each item goes, and the items themselves, in tag order, in two
row-level columns::

    {"messages": [{"role": "user", "content": "<image>What colour is the shape?"}, ...],
     "images": [{"bytes": b"...", "path": None}],                  # datasets.Image storage
     "videos": [{"frames": [{"bytes": ..., "path": ...}, ...], "path": None}]}   # frames, or a file

Arrow holds only paths or encoded bytes (a PIL image is stored as PNG bytes); pixels are
computed by the model's processor when a batch is collated (see :mod:`twinkle.multimodal.collate`).
Content given as OpenAI/HF parts (``[{"type": "image", "image": ...}, {"type": "text", ...}]``) is
turned into this form by :func:`split_content`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.dataset.errors import DataError, preview

IMAGE_TAG = "<image>"
VIDEO_TAG = "<video>"
MEDIA_COLUMNS = ("images", "videos")
#: raw column names read as the row's images / videos (a single value or a list)
IMAGE_COLUMNS = ("images", "image")
VIDEO_COLUMNS = ("videos", "video")
VISION_HINT = "pip install 'twinkle-core[vision]' (Pillow)"


def media_features() -> dict[str, Any]:
    """The ``datasets`` features of the two media columns (paths/bytes only, never decoded pixels)."""
    import datasets

    image = datasets.Image(decode=False)
    return {"images": [image], "videos": [{"frames": [image], "path": datasets.Value("string")}]}


def with_media_columns(parts: Sequence[Any]) -> list[Any]:
    """``datasets.Dataset`` sources, those without the media columns another one has given them empty.

    Text-only sources and sources with images or videos then mix (``add_dataset``, ``mix_dataset``):
    a text-only row carries ``images: []`` / ``videos: []`` (None for a single-value raw column
    such as ``image``), typed like the source that has the column, and trains as text.
    """
    parts = list(parts)
    for name in (*IMAGE_COLUMNS, *VIDEO_COLUMNS):
        feature = next((p.features[name] for p in parts if name in p.column_names), None)
        if feature is None:
            continue
        empty = [] if _is_list_feature(feature) else None
        parts = [p if name in p.column_names else p.add_column(name, [empty] * len(p), feature=feature)
                 for p in parts]
    return parts


def _is_list_feature(feature: Any) -> bool:
    import datasets

    return isinstance(feature, (list, tuple, datasets.List, datasets.LargeList))


def has_media(row: Mapping[str, Any]) -> bool:
    return any(row.get(c) for c in MEDIA_COLUMNS)


def row_media(row: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """The raw images and videos of a source row (``images``/``image``, ``videos``/``video`` columns)."""
    found = []
    for names in (IMAGE_COLUMNS, VIDEO_COLUMNS):
        value = next((row[n] for n in names if row.get(n) is not None), None)
        if value is None:
            found.append([])
        elif names is VIDEO_COLUMNS and _is_frame_list(value):
            found.append([value])  # one video given as its frames
        elif isinstance(value, (list, tuple)):
            found.append(list(value))
        else:
            found.append([value])
    return found[0], found[1]


# ------------------------------------------------------------------------- content
def split_content(messages: Any, images: Sequence[Any] = (), videos: Sequence[Any] = ()
                  ) -> tuple[Any, list[Any], list[Any]]:
    """Messages with string contents (media parts become tags), and the row's images and videos in tag order.

    Messages whose content is a list of parts (``text``, ``image``/``image_url``, ``video``) are
    flattened; media given both as parts and as row columns is refused (their order would be a
    guess). Anything that is not a list of dicts is returned unchanged for ``check_messages`` to reject.
    """
    images, videos = list(images or ()), list(videos or ())
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        return messages, images, videos
    part_images: list[Any] = []
    part_videos: list[Any] = []
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, (list, tuple)):
            message = {**message, "content": _flatten_parts(content, i, part_images, part_videos)}
        out.append(message)
    if (part_images and images) or (part_videos and videos):
        raise DataError("the row gives media both inside message contents and in an images/videos column; "
                        "use one of the two.")
    return out, images or part_images, videos or part_videos


def _flatten_parts(parts: Sequence[Any], index: int, images: list[Any], videos: list[Any]) -> str:
    text = []
    for part in parts:
        if isinstance(part, str):
            text.append(part)
            continue
        if not isinstance(part, Mapping):
            raise DataError(f"message {index}: a content part must be a dict, got {preview(part)}.")
        kind = part.get("type") or next((k for k in ("text", "image", "image_url", "video") if k in part), None)
        if kind == "text":
            text.append(str(part.get("text") or ""))
        elif kind in ("image", "image_url"):
            value = part.get("image", part.get("image_url", part.get("url", part.get("path"))))
            if isinstance(value, Mapping) and "url" in value:
                value = value["url"]
            if value is None:
                raise DataError(f"message {index}: an image part without an image: {preview(part)}.")
            images.append(value)
            text.append(IMAGE_TAG)
        elif kind == "video":
            value = part.get("video", part.get("url", part.get("path")))
            if value is None:
                raise DataError(f"message {index}: a video part without a video: {preview(part)}.")
            videos.append(value)
            text.append(VIDEO_TAG)
        else:
            raise DataError(f"message {index}: unknown content part type {kind!r} (text, image, image_url, video).")
    return "".join(text)


def place_tags(messages: list[dict[str, Any]], num_images: int, num_videos: int) -> list[dict[str, Any]]:
    """Check that the tags match the media; a conversation with media but no tag at all gets them
    in front of its first user turn (the LLaVA convention). Raises DataError on a mismatch."""
    counts = [sum(m["content"].count(tag) for m in messages) for tag in (IMAGE_TAG, VIDEO_TAG)]
    if counts == [0, 0] and (num_images or num_videos):
        first = next(i for i, m in enumerate(messages) if m["role"] == "user")
        messages = list(messages)
        prefix = IMAGE_TAG * num_images + VIDEO_TAG * num_videos
        messages[first] = {**messages[first], "content": prefix + messages[first]["content"]}
        return messages
    for tag, count, given in ((IMAGE_TAG, counts[0], num_images), (VIDEO_TAG, counts[1], num_videos)):
        if count != given:
            raise DataError(f"the conversation has {count} {tag} tag(s) but the row gives {given} "
                            f"{'image' if tag == IMAGE_TAG else 'video'}(s); put one {tag} where each goes.")
    return messages


def to_parts(content: str) -> str | list[dict[str, str]]:
    """A tagged content string as chat-template parts (``[{'type': 'image'}, {'type': 'text', ...}]``)."""
    if IMAGE_TAG not in content and VIDEO_TAG not in content:
        return content
    parts: list[dict[str, str]] = []
    rest = content
    while rest:
        positions = [(rest.find(tag), tag) for tag in (IMAGE_TAG, VIDEO_TAG) if tag in rest]
        if not positions:
            parts.append({"type": "text", "text": rest})
            break
        pos, tag = min(positions)
        if pos:
            parts.append({"type": "text", "text": rest[:pos]})
        parts.append({"type": "image" if tag == IMAGE_TAG else "video"})
        rest = rest[pos + len(tag):]
    return parts


# ------------------------------------------------------------------------- storage
def stored_image(value: Any, where: str) -> dict[str, Any]:
    """``{'bytes', 'path'}`` for an image given as a path, bytes, a PIL image, an array or stored dict."""
    import datasets

    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if value.startswith(("http://", "https://")):
            raise DataError(f"{where}: image {value!r} is a URL; twinkle does not download media, fetch it first.")
        if value.startswith("data:"):
            value = _data_uri_bytes(value, where)
        elif not os.path.isfile(value):
            raise DataError(f"{where}: image file {value!r} does not exist.")
    if isinstance(value, bytearray):
        value = bytes(value)
    if isinstance(value, Mapping) and value.get("bytes") is None and value.get("path") is None:
        raise DataError(f"{where}: an image dict needs 'bytes' or 'path', got {preview(value)}.")
    try:
        return datasets.Image(decode=False).encode_example(value)
    except ImportError as exc:
        raise DataError(f"{where}: storing this image needs Pillow: {VISION_HINT}.") from exc
    except Exception as exc:
        raise DataError(f"{where}: cannot use {preview(value)} as an image (a path, bytes, a PIL image or a "
                        f"{{'bytes', 'path'}} dict): {type(exc).__name__}: {exc}") from None


def stored_video(value: Any, where: str) -> dict[str, Any]:
    """``{'frames': [...], 'path': None}`` for a list of frames, ``{'frames': None, 'path': p}`` for a file."""
    if isinstance(value, Mapping) and ("frames" in value or "path" in value) and "bytes" not in value:
        frames, path = value.get("frames"), value.get("path")
        if frames:
            return {"frames": [stored_image(f, f"{where} frame {k}") for k, f in enumerate(frames)], "path": None}
        value = path
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if not os.path.isfile(value):
            raise DataError(f"{where}: video file {value!r} does not exist.")
        return {"frames": None, "path": value}
    if _is_frame_list(value):
        if not value:
            raise DataError(f"{where}: a video needs at least one frame.")
        return {"frames": [stored_image(f, f"{where} frame {k}") for k, f in enumerate(value)], "path": None}
    raise DataError(f"{where}: a video is a list of frames or a file path, got {preview(value)}.")


def stored_media(images: Sequence[Any], videos: Sequence[Any]) -> dict[str, list[Any]]:
    return {"images": [stored_image(v, f"image {k}") for k, v in enumerate(images)],
            "videos": [stored_video(v, f"video {k}") for k, v in enumerate(videos)]}


def load_image(stored: Any) -> Any:
    """A PIL image from storage (a stored dict, a path, bytes, or already a PIL image)."""
    try:
        import PIL.Image
    except ImportError as exc:
        raise DataError(f"images need Pillow: {VISION_HINT}.") from exc
    if isinstance(stored, PIL.Image.Image):
        return stored
    import datasets

    value = stored if isinstance(stored, Mapping) else stored_image(stored, "image")
    try:
        image = datasets.Image().decode_example(dict(value))
        image.load()
    except Exception as exc:
        raise DataError(f"cannot decode image {preview(value)}: {type(exc).__name__}: {exc}") from None
    return image


def load_video(stored: Mapping[str, Any]) -> Any:
    """The frames of a stored video as PIL images (one size, RGB), or its file path (decoded by the processor).

    The processors stack a video's frames into one array, so frames of two sizes are refused here, naming the
    sizes (numpy's stacking error names neither the video nor the fix), and a grey or RGBA frame among RGB ones
    is converted like the processors convert images."""
    if not stored.get("frames"):
        return stored["path"]
    frames = [load_image(f) for f in stored["frames"]]
    sizes = sorted({tuple(f.size) for f in frames})
    if len(sizes) > 1:
        raise DataError(f"a video's frames have different sizes (width x height: {sizes}); every frame of a video "
                        "must have one size: resize them to the first frame's size before encoding.")
    return [f if f.mode == "RGB" else f.convert("RGB") for f in frames]


def _is_frame_list(value: Any) -> bool:
    """A list of frames (images), as opposed to a list of videos (frame lists, files or stored dicts)."""
    return isinstance(value, (list, tuple)) and bool(value) and not any(
        isinstance(v, (list, tuple)) or _is_video_file(v) or (isinstance(v, Mapping) and "frames" in v)
        for v in value)


def _is_video_file(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and os.fspath(value).lower().endswith(_VIDEO_SUFFIXES)


_VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")


def _data_uri_bytes(uri: str, where: str) -> bytes:
    import base64

    head, _, data = uri.partition(",")
    if not head.endswith(";base64"):
        raise DataError(f"{where}: only base64 data URIs are accepted for images.")
    return base64.b64decode(data)
