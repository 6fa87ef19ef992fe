"""Loading a model's multimodal processor (``AutoProcessor``), and saving it beside checkpoints.

transformers builds every video processor on torchvision. Where torchvision is missing (or has no
build for the installed torch, as on CPU-only machines), ``AutoProcessor`` cannot build a
Qwen-VL/InternVL processor at all, although its image processor has a Pillow backend. twinkle
then builds the family's processor from its image processor and tokenizer without transformers'
video processor (a logged warning says so): images work, and for the Qwen-VL families videos given
as frames work through :class:`twinkle.multimodal.frames.FramesVideoProcessor` (Pillow and numpy);
a video file raises an error naming what to install.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from typing import Any

from twinkle.dataset.errors import DataError
from twinkle.log import get_logger

logger = get_logger("twinkle.multimodal")

#: files a model directory needs to rebuild its processor (copied into checkpoints when absent)
PROCESSOR_FILES = (
    "preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json", "chat_template.jinja",
    "chat_template.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json",
)
PROCESSOR_PATTERNS = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
_WARNED: set[str] = set()  # directories whose image-only fallback was already reported


def load_processor(model_id: str) -> Any:
    """The ``AutoProcessor`` of ``model_id`` (resolved by :func:`twinkle.hub.resolve_path`), image-only
    when transformers cannot build its video processor here."""
    from twinkle.hub import resolve_path

    path = resolve_path(model_id, "model", allow_patterns=PROCESSOR_PATTERNS)
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path)
    except Exception as exc:
        processor = image_only_processor(path)
        if processor is None:
            raise DataError(f"Could not load a processor from {model_id!r} ({path}): {type(exc).__name__}: {exc}") \
                from exc
        if str(path) not in _WARNED:
            _WARNED.add(str(path))
            _report_image_only(model_id, exc, processor)
    if not hasattr(processor, "image_processor"):
        raise DataError(f"{model_id!r} has no image processor (got {type(processor).__name__}); it is not a "
                        "vision-language model. Use a text template (Qwen2_5Template, ...) for it.")
    return processor


def _report_image_only(model_id: str, exc: Exception, processor: Any) -> None:
    """Say once what videos can be here. Without torchvision (CPU builds of torch) that is expected: an info
    line. Any other cause is a warning quoting the error's first sentence whole."""
    import importlib.util

    name = type(processor).__name__
    videos = ("videos given as frames are read with Pillow; video files need torchvision and a decoder"
              if has_video_processor(processor) else "videos need torchvision installed for this torch build")
    if importlib.util.find_spec("torchvision") is None:
        logger.info("%s: %s without its video processor (transformers' video processors need torchvision, which "
                    "this environment does not have): %s.", model_id, name, videos)
        return
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    sentence = first.split(". ")[0].rstrip(".")
    logger.warning("%s: transformers could not build the video processor (%s: %s); using %s without it: %s.",
                   model_id, type(exc).__name__, sentence, name, videos)


def image_only_processor(path: str | Path) -> Any:
    """The family's processor class built from the directory's image processor and tokenizer, with no
    video processor; None when the directory names no such processor."""
    import transformers
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    directory = Path(path)
    settings = _read_json(directory / "processor_config.json")
    name = settings.get("processor_class") or _read_json(directory / "tokenizer_config.json").get("processor_class")
    if not name and (directory / "config.json").is_file():
        name = PROCESSOR_MAPPING_NAMES.get(AutoConfig.from_pretrained(directory).model_type)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None or "video_processor" not in cls.get_attributes():
        return None
    try:
        image_processor = AutoImageProcessor.from_pretrained(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception:
        return None
    accepted = inspect.signature(cls.__init__).parameters
    extra = {k: v for k, v in settings.items() if k in accepted and k not in cls.get_attributes()}
    template = directory / "chat_template.jinja"
    if template.is_file():
        extra["chat_template"] = template.read_text()
    processor = _image_only_class(cls)(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                                       **extra)
    from twinkle.multimodal.frames import FramesVideoProcessor, takes_frames

    if takes_frames(image_processor) and getattr(processor, "video_token", None) is not None:
        processor.video_processor = FramesVideoProcessor(image_processor)  # videos given as frames: no torchvision
    return processor


def _image_only_class(cls: type) -> type:
    """``cls`` without its video-processor attribute (so it builds and saves without one)."""

    class ImageOnly(cls):  # type: ignore[misc, valid-type]
        video_processor = None

        @classmethod
        def get_attributes(klass) -> list[str]:
            return [a for a in super().get_attributes() if a != "video_processor"]

        def to_dict(self) -> dict[str, Any]:  # a frames video processor attached here is twinkle's, not saved
            out = super().to_dict()
            out.pop("video_processor", None)
            return out

    ImageOnly.__name__ = cls.__name__  # what save_pretrained writes as processor_class
    ImageOnly.__qualname__ = cls.__qualname__
    ImageOnly.__module__ = cls.__module__
    return ImageOnly


def has_video_processor(processor: Any) -> bool:
    return getattr(processor, "video_processor", None) is not None


def save_processor(processor: Any, directory: str | Path, source: str | Path | None = None) -> None:
    """``processor.save_pretrained(directory)``, then the source directory's processor files it did not
    write (an image-only processor has no video config to save; the source's keeps the directory whole)."""
    directory = Path(directory)
    processor.save_pretrained(str(directory))
    if source is None:
        return
    copy_missing_files(source, directory)
    written = _read_json(directory / "processor_config.json")
    original = _read_json(Path(source) / "processor_config.json")
    missing = {k: v for k, v in original.items() if k not in written}
    if written and missing:
        (directory / "processor_config.json").write_text(json.dumps({**written, **missing}, indent=2) + "\n")


def copy_missing_files(source: str | Path, directory: str | Path) -> list[str]:
    """Copy the processor/tokenizer files of ``source`` that ``directory`` lacks; returns their names."""
    source, directory = Path(source), Path(directory)
    if not source.is_dir() or source.resolve() == directory.resolve():
        return []
    copied = []
    for name in PROCESSOR_FILES:
        if (source / name).is_file() and not (directory / name).exists():
            shutil.copyfile(source / name, directory / name)
            copied.append(name)
    return copied


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
