"""Keeping data-parallel ranks in step when only some micro-batches hold images or videos.

Under FSDP2 the vision blocks are sharded: each rank all-gathers a block's weights when it runs the
block (and reduce-scatters its gradient in backward). A rank whose micro-batch has no image skips
the vision tower, so its next all-gather is a decoder layer's while another rank's is a vision
block's: the collectives mismatch and the ranks hang (NCCL) or crash (gloo). The established fix
(ms-swift, LLaMA-Factory) is applied: the ranks first agree (a small exchange on the CPU) on which kinds
of media any of them has; a rank lacking a kind that another has runs the vision tower once per
missing kind on a blank image and adds ``0 x`` its outputs to the token embeddings, so every rank
runs the same modules in the same order and the real samples' loss and gradients are unchanged
(the blank image's gradients are exact zeros). When no rank has media, no rank runs the tower.

DDP has no forward collectives; it only needs every trainable parameter accounted for in each
backward, which ``find_unused_parameters=True`` does exactly (see :func:`twinkle_hf.model.vision.needs_unused_search`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

#: batch keys that carry each kind of media into the model's forward
MEDIA_INPUTS = ("pixel_values", "pixel_values_videos")


def media_kinds(batch: Mapping[str, Any]) -> list[int]:
    """[has images, has videos] of a collated micro-batch."""
    return [int(batch.get(key) is not None) for key in MEDIA_INPUTS]


def missing_passes(batch: Mapping[str, Any]) -> int:
    """How many vision-tower passes this rank must add: the kinds another rank has and this one lacks.

    A collective (every rank of the world calls it for every micro-batch). It exchanges the two host
    flags over the group's CPU backend, so the micro-batch never waits for the device.
    """
    from twinkle import collective

    local = media_kinds(batch)
    anywhere = [max(kind) for kind in zip(*collective.all_gather_object(local))]
    return sum(1 for mine, any_rank in zip(local, anywhere) if any_rank and not mine)


def image_features_inputs(hf_model: torch.nn.Module, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of the processor's ``inputs`` that ``hf_model.get_image_features`` takes."""
    method = getattr(hf_model, "get_image_features", None)
    if method is None:
        raise TypeError(f"{type(hf_model).__name__} has no get_image_features, which twinkle needs to keep "
                        "data-parallel ranks in step when only some micro-batches hold images.")
    accepted = inspect.signature(method).parameters
    return {k: v for k, v in inputs.items() if k in accepted}


@contextmanager
def extra_vision_passes(hf_model: torch.nn.Module, inputs: Mapping[str, Any], passes: int) -> Iterator[None]:
    """During the forward inside the block, run the vision tower ``passes`` times on ``inputs`` (a
    blank image) and add 0 x the outputs to the token embeddings.

    The passes run in a hook on the input embeddings: the model embeds the tokens just before it
    runs the vision tower on real media, so the blank passes take the place real ones take on the
    other ranks, in forward and in backward.
    """
    embeddings = hf_model.get_input_embeddings()

    def add_blank_passes(module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        handle.remove()  # once per forward, whatever else embeds tokens
        total = output.new_zeros((), dtype=torch.float32)
        for _ in range(passes):
            for tensor in _floating_tensors(hf_model.get_image_features(**inputs)):
                total = total + tensor.float().mean()
        return output + (torch.nan_to_num(total, nan=0.0, posinf=0.0, neginf=0.0) * 0.0).to(output.dtype)

    handle = embeddings.register_forward_hook(add_blank_passes)
    try:
        yield
    finally:
        handle.remove()


def _floating_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every floating tensor of a (nested) model output: hidden states, pooled features, deepstack features."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _floating_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _floating_tensors(item)


class VisionLockstep:
    """Under FSDP2, a rank without the images/videos another rank has runs the vision tower on a blank image.

    ``backend.groups`` (the model's optimizer groups) give the processor of a VL template for the blank
    image; without one, the processor saved beside the model's weights.
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._blank: dict[str, Any] | None = None

    @contextmanager
    def passes(self, batch: Mapping[str, Any]) -> Iterator[None]:
        """Inside the block, this rank's forward runs the vision passes another rank's micro-batch needs."""
        hf = self.backend.hf_model()
        blank = self.blank_inputs()  # on every rank before agreeing: a failure stops all alike
        count = missing_passes(batch)
        if not count:
            yield
            return
        with extra_vision_passes(hf, blank, count):
            yield

    def blank_inputs(self) -> dict[str, Any]:
        """``get_image_features`` inputs of one blank image, from the model's processor (built once)."""
        if self._blank is None:
            from twinkle.multimodal.collate import blank_image_inputs

            backend = self.backend
            inputs = blank_image_inputs(self._processor())
            self._blank = image_features_inputs(backend.hf_model(), {k: v.to(backend.device)
                                                                     for k, v in inputs.items()})
        return self._blank

    def _processor(self) -> Any:
        """The processor of a group's VL template, else the one saved beside the model's weights."""
        backend = self.backend
        for group in backend.groups.values():
            if callable(getattr(group.template, "media_collator", None)):
                return group.template.processor
        if backend.model_path is None:
            raise ValueError(f"{type(backend.hf_model()).__name__} was built from a config: give it its VL template "
                             "(model.set_template('Qwen2_5VLTemplate', model_id=...)) so that data-parallel ranks "
                             "can run the vision tower on a blank image when only some micro-batches hold images.")
        from twinkle.multimodal.processor import load_processor

        return load_processor(backend.model_path)
