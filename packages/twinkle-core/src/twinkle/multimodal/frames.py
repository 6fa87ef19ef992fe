"""Videos as frame lists for the Qwen-VL families, with Pillow and numpy only (no torchvision).

transformers builds every video processor on torchvision, which has no build for some torch
versions (this project's CPU torch among them). A video given as its frames (a list of images) needs
no decoder, and a Qwen-VL video is its frames cut into patches the way the family's image processor
cuts an image, paired along time: so :class:`FramesVideoProcessor` runs the family's own image
processor on every frame (same resizing, rescaling and normalisation as images) and lays the
patches out as transformers' ``Qwen2VLVideoProcessor`` does: frames padded to a multiple of
``temporal_patch_size`` by repeating the last one, ``temporal_patch_size`` consecutive frames per
temporal patch, ``video_grid_thw = (frames / temporal_patch_size, grid_h, grid_w)``.
:func:`twinkle.multimodal.processor.load_processor` attaches it where transformers could not build the
family's video processor, so the processor expands ``<|video_pad|>`` and the model runs its vision tower
on ``pixel_values_videos`` as with torchvision.

The frames are taken as given, one per ``1 / fps`` seconds (``fps=2``: what Qwen's video processors
sample by default); Qwen3-VL's timestamps (``<0.5 seconds>``...) follow from it. A video *file* needs
a decoder: it is refused with what to install.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.dataset.errors import DataError

#: what a video file needs: transformers' own video processor (torchvision) and a decoder (PyAV)
VIDEO_FILE_HINT = ("a video file needs transformers' video processor and a decoder: pip install torchvision av (a "
                   "torchvision build that matches this torch); or give the video as a list of frames (images)")


def takes_frames(image_processor: Any) -> bool:
    """Whether ``image_processor`` cuts images the Qwen-VL way (patches merged spatially, a temporal patch size)."""
    return all(isinstance(getattr(image_processor, name, None), int)
               for name in ("patch_size", "merge_size", "temporal_patch_size"))


class FramesVideoProcessor:
    """A Qwen-VL video processor for videos given as lists of frames (see the module docstring)."""

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, image_processor: Any, fps: float = 2.0) -> None:
        if not takes_frames(image_processor):
            raise TypeError(f"{type(image_processor).__name__} does not cut images into Qwen-VL patches "
                            "(patch_size, merge_size, temporal_patch_size).")
        self.image_processor = image_processor
        self.patch_size = image_processor.patch_size
        self.merge_size = image_processor.merge_size
        self.temporal_patch_size = image_processor.temporal_patch_size
        self.fps = float(fps)

    def __call__(self, videos: Any, return_metadata: bool = False, return_tensors: Any = None,
                 **_: Any) -> Any:
        import numpy as np
        from transformers import BatchFeature
        from transformers.video_utils import VideoMetadata

        pixels, grids, metadata = [], [], []
        for k, frames in enumerate(_videos(videos)):
            patches, grid = self.patches(frames, k)
            pixels.append(patches)
            grids.append(grid)
            width, height = frames[0].size
            metadata.append(VideoMetadata(total_num_frames=len(frames), fps=self.fps, width=width, height=height,
                                          frames_indices=list(range(len(frames)))))
        data = {"pixel_values_videos": np.concatenate(pixels), "video_grid_thw": np.array(grids, dtype=np.int64)}
        features = BatchFeature(data=data, tensor_type=return_tensors)
        if return_metadata:
            features["video_metadata"] = metadata
        return features

    def patches(self, frames: Sequence[Any], index: int = 0) -> tuple[Any, list[int]]:
        """``(patches (t * h * w, C * T * p * p), [t, h, w])`` of one video's frames."""
        import numpy as np

        out = self.image_processor(images=list(frames), return_tensors="np")  # one size: media.load_video
        grids = np.asarray(out["image_grid_thw"])
        if len({tuple(g) for g in grids.tolist()}) != 1:
            raise DataError(f"video {index}: its frames have different sizes ({sorted({f.size for f in frames})}); "
                            "every frame of a video must have one size.")
        _, grid_h, grid_w = (int(x) for x in grids[0])
        t, p = self.temporal_patch_size, self.patch_size
        count = grid_h * grid_w
        # the image processor repeats each frame along time: keep one copy, (frames, patches, C, p, p)
        per_frame = np.asarray(out["pixel_values"]).reshape(len(frames), count, -1, t, p, p)[:, :, :, 0]
        if pad := -len(frames) % t:  # as transformers' video processors: the last frame repeated
            per_frame = np.concatenate([per_frame, np.repeat(per_frame[-1:], pad, axis=0)])
        grid_t = per_frame.shape[0] // t
        channels = per_frame.shape[2]
        paired = per_frame.reshape(grid_t, t, count, channels, p, p).transpose(0, 2, 3, 1, 4, 5)
        return paired.reshape(grid_t * count, channels * t * p * p), [grid_t, grid_h, grid_w]

    def __repr__(self) -> str:
        return (f"FramesVideoProcessor(patch_size={self.patch_size}, merge_size={self.merge_size}, "
                f"temporal_patch_size={self.temporal_patch_size}, fps={self.fps:g})")


def _videos(videos: Any) -> list[list[Any]]:
    """A list of videos, each a list of PIL frames; a file path is refused with what it needs."""
    import os

    items = videos if isinstance(videos, (list, tuple)) else [videos]
    if items and not isinstance(items[0], (list, tuple, str, os.PathLike)):
        items = [items]  # one video given as its frames
    out = []
    for k, video in enumerate(items):
        if isinstance(video, (str, os.PathLike)):
            raise DataError(f"video {k} is the file {os.fspath(video)!r}: {VIDEO_FILE_HINT}.")
        if not video:
            raise DataError(f"video {k} has no frames.")
        out.append(list(video))
    return out
