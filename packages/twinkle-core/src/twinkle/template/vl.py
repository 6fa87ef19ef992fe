"""Vision-language templates: conversations with images/videos -> token rows that keep their media.

The model's own processor (``AutoProcessor``) does everything model-specific: its chat template
renders the conversation (each ``<image>`` tag becomes the family's placeholder, e.g.
``<|vision_start|><|image_pad|><|vision_end|>``), its image/video processor decides how many
tokens each item takes, and it expands and tokenizes the text. twinkle only labels: the
assistant spans found on the rendered text (as for text templates) are carried through the
processor's expansion offsets, and every token an image or video expanded into is -100.

An encoded row keeps ``images``/``videos`` as paths/bytes; pixels are computed at collate time
(:class:`twinkle.multimodal.collate.MediaCollator`). Truncation never splits an item: a row
whose ``left``/``right`` cut would remove media tokens is dropped and counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from twinkle.constants import IGNORE_INDEX
from twinkle.dataset.errors import DataError
from twinkle.template import chat_templates
from twinkle.template.base import EncodeResult, Template
from twinkle.template.labels import labels_from_spans
from twinkle.template.qwen import Qwen3_5Template
from twinkle.template.spans import Conversation, Span

QWEN_VL_PACKING = (
    "{name} does not pack rows (padding_free=True): Qwen-VL models compute 3-D multimodal rotary positions "
    "per padded row from the image/video grids (get_rope_index), which packed rows would mix up. Use padding "
    "(padding_free=False); the padded batch trains the same tokens."
)


class VLTemplate(Template):
    """Encode conversations with images and videos through the model's ``AutoProcessor``.

    ``model_id`` names the model (its processor is loaded from it); ``processor=`` passes one
    already built. Rows are in the standard format with ``images``/``videos`` columns and
    ``<image>``/``<video>`` tags, or carry media as content parts. Other arguments as :class:`Template`.
    """

    turn_end_token = "<|im_end|>"
    fallback_chat_template = chat_templates.QWEN_VL
    #: why padding_free packing is refused for this family (formatted with the template's name)
    packing_refusal: ClassVar[str] = QWEN_VL_PACKING
    #: why rows with videos are refused for this family (None: videos are taken)
    video_refusal: ClassVar[str | None] = None

    def __init__(self, model_id: str | None = None, max_length: int | None = None, truncation_strategy: str = "raise",
                 *, processor: Any = None, **kwargs: Any) -> None:
        super().__init__(model_id, max_length, truncation_strategy, **kwargs)
        self._processor = processor
        self._source: str | None = None

    # ------------------------------------------------------------ processor
    @property
    def processor(self) -> Any:
        """The model's transformers processor, loaded on first use."""
        if self._processor is None:
            if self.model_id is None:
                raise DataError(f"{type(self).__name__} needs model_id= (the vision-language model whose processor "
                                "encodes the images), e.g. 'Qwen/Qwen2.5-VL-7B-Instruct' or a local directory.")
            from twinkle.hub import resolve_path
            from twinkle.multimodal.processor import PROCESSOR_PATTERNS, load_processor

            self._processor = load_processor(self.model_id)
            self._source = str(resolve_path(self.model_id, "model", allow_patterns=PROCESSOR_PATTERNS))
        return self._processor

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self.processor.tokenizer
        return self._tokenizer

    @property
    def chat_template(self) -> str:
        if self._chat_template:
            return self._chat_template
        own = getattr(self.processor, "chat_template", None)
        if isinstance(own, Mapping):
            own = own.get("default")
        return own or super().chat_template

    def media_collator(self) -> Any:
        """What turns a batch's stored media into the model's vision inputs (used by InputProcessor)."""
        from twinkle.multimodal.collate import MediaCollator

        return MediaCollator(self.processor, self.packing_refusal.format(name=type(self).__name__))

    def _check_media(self, media: dict[str, list[Any]]) -> None:
        if media["videos"] and self.video_refusal is not None:
            raise DataError(f"the row has a video: {self.video_refusal}")

    def extra_features(self) -> dict[str, Any]:
        """The columns an encoded row holds besides the token ones."""
        from twinkle.multimodal.media import media_features

        return media_features()

    def save_pretrained(self, directory: str | Path) -> None:
        """The processor (image settings, chat template, tokenizer), so the directory loads with AutoProcessor."""
        from twinkle.multimodal.processor import save_processor

        save_processor(self.processor, directory, source=self._source)

    # --------------------------------------------------------------- encode
    def batch_encode(self, rows: Sequence[Any], indices: Sequence[int] | None = None) -> list[EncodeResult]:
        indices = list(range(len(rows))) if indices is None else list(indices)
        prepared = [self._prepare(row, idx) for row, idx in zip(rows, indices)]
        convs = [conv for conv, _ in prepared]
        rendered = self._render(convs, indices)
        processed = self._process([text for text, _ in rendered], [media for _, media in prepared], indices)
        results: list[EncodeResult] = []
        for conv, (_, spans), (ids, labels, media_mask), (_, media), index in zip(
                convs, rendered, processed, prepared, indices):
            trained = [span for span, keep in zip(spans, self._trained_turns(conv)) if keep]
            results.append(self._finish_media(ids, labels(trained), media_mask, media, index))
        return results

    def _prepare(self, row: Any, index: int) -> tuple[Conversation, dict[str, list[Any]]]:
        """The conversation (tagged contents as chat-template parts) and the row's stored media."""
        from twinkle.multimodal.media import place_tags, split_content, stored_media, to_parts

        if isinstance(row, Mapping) and row.get("messages") is None:
            self._conversation(row, index)  # raises, naming the fields the row has
        messages = row.get("messages") if isinstance(row, Mapping) else row
        images = (row.get("images") or []) if isinstance(row, Mapping) else []
        videos = (row.get("videos") or []) if isinstance(row, Mapping) else []
        try:
            messages, images, videos = split_content(messages, images, videos)
            conv = self._conversation({"messages": messages, "tools": row.get("tools")
                                       if isinstance(row, Mapping) else None}, index)
            conv.messages = place_tags(conv.messages, len(images), len(videos))
            media = stored_media(images, videos)
            self._check_media(media)
        except DataError as exc:
            message = str(exc)
            raise DataError(message if message.startswith("row ") else f"row {index}: {message}") from None
        conv.messages = [{**m, "content": to_parts(m["content"])} for m in conv.messages]
        return conv, media

    def _process(self, texts: list[str], media: list[dict[str, list[Any]]], indices: list[int]
                 ) -> list[tuple[list[int], Any, list[bool]]]:
        """Expand and tokenize with the processor: (ids, spans -> labels, media-token mask) per text.

        A failing batch is re-run row by row to name the row."""
        try:
            return self._process_batch(texts, media)
        except Exception as exc:
            failure, where = exc, indices[0]
            for text, item, index in zip(texts, media, indices):
                try:
                    self._process_batch([text], [item])
                except Exception as row_exc:
                    failure, where = row_exc, index
                    break
            detail = str(failure) if isinstance(failure, DataError) else f"the processor failed: {_describe(failure)}"
            raise DataError(f"row {where}: {detail}") from None

    def _process_batch(self, texts: list[str], media: list[dict[str, list[Any]]]
                       ) -> list[tuple[list[int], Any, list[bool]]]:
        from twinkle.multimodal.media import load_image, load_video
        from twinkle.multimodal.processor import has_video_processor

        images = [load_image(x) for item in media for x in item["images"]]
        videos = [load_video(x) for item in media for x in item["videos"]]
        if videos and not has_video_processor(self.processor):
            raise DataError(f"the row has a video but {type(self.processor).__name__} has no video processor: "
                            "transformers builds video processors on torchvision, which is not installed for this "
                            "torch. Install torchvision, or drop the videos.")
        out = self.processor(text=texts, images=images or None, videos=videos or None,
                             return_text_replacement_offsets=True, return_offsets_mapping=True,
                             add_special_tokens=False)
        if "text_replacement_offsets" not in out or "offset_mapping" not in out:
            raise DataError(f"{type(self.processor).__name__} does not report where it expanded the media tokens "
                            "(text_replacement_offsets); VL templates need transformers >= 5.")
        results = []
        for ids, offsets, replaced in zip(out["input_ids"], out["offset_mapping"], out["text_replacement_offsets"]):
            ids = [int(x) for x in ids]
            offsets = [tuple(map(int, o)) for o in offsets]
            new_spans = [tuple(r["new_span"]) for r in replaced]
            mask = _inside(offsets, new_spans)

            def labels(spans: list[Span], ids=ids, offsets=offsets, replaced=replaced, mask=mask) -> list[int]:
                moved = [(_moved(s, replaced), _moved(e, replaced)) for s, e in spans]
                return [IGNORE_INDEX if m else v for v, m in zip(labels_from_spans(ids, offsets, moved), mask)]

            results.append((ids, labels, mask))
        return results

    def _finish_media(self, ids: list[int], labels: list[int], media_mask: list[bool],
                      media: dict[str, list[Any]], index: int) -> EncodeResult:
        n, limit = len(ids), self.max_length
        if limit is not None and n > limit and self.truncation_strategy in ("left", "right"):
            # an item's tokens and the marker token on each side of them (<|vision_start|>, <|vision_end|>)
            item = [any(media_mask[max(k - 1, 0):k + 2]) for k in range(n)]
            cut = item[:n - limit] if self.truncation_strategy == "left" else item[limit:]
            if any(cut):
                return None, "truncation would cut through an image or video"
        encoded, why = self._finish(ids, labels, index)
        if encoded is not None:
            encoded.update(media)
        return encoded, why

    def fingerprint(self) -> str:
        image_processor = getattr(self.processor, "image_processor", None)
        settings = image_processor.to_json_string() if hasattr(image_processor, "to_json_string") else ""
        return hashlib.sha256(f"{super().fingerprint()}\0{settings}".encode()).hexdigest()[:32]


def _inside(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """Per token: whether it lies inside one of the (sorted) character spans."""
    mask, j = [], 0
    for start, end in offsets:
        while j < len(spans) and start >= spans[j][1]:
            j += 1
        mask.append(j < len(spans) and end > spans[j][0] and end > start)
    return mask


def _moved(position: int, replaced: list[dict[str, Any]]) -> int:
    """A character position of the rendered text, in the text the processor expanded."""
    shift = 0
    for r in replaced:
        (start, end), (_, new_end) = r["span"], r["new_span"]
        if position >= end:
            shift = new_end - end
        elif position > start:
            return new_end
        else:
            break
    return position + shift


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"


class Qwen2VLTemplate(VLTemplate):
    """Qwen2-VL (images and videos; ChatML turns)."""


class Qwen2_5VLTemplate(Qwen2VLTemplate):
    """Qwen2.5-VL: Qwen2-VL's conversation format and vision tokens."""


class Qwen3VLTemplate(VLTemplate):
    """Qwen3-VL (Instruct; the Thinking variants' template renders its reasoning itself)."""


class Qwen3_5VLTemplate(VLTemplate, Qwen3_5Template):
    """Qwen3.5 with images/videos: the Qwen3 thinking switch, per conversation, on the VL path."""
