"""The public types of a loss's two arguments: a collated batch and what the model's forward returned.

A loss is called ``loss(inputs, outputs, **kwargs)`` (``set_loss``'s signature:
``Callable[[InputFeature, ModelOutput, ...], torch.Tensor]``):

* :class:`InputFeature` — the batch as the model's processor collated it: a dict of tensors, every
  row padded to one length (or packed into one row). Which keys are present depends on the data:
  SFT rows have ``labels``; RL rows Tinker's ``target_tokens``/``weights`` and the per-token fields;
  VL rows the pixel tensors.
* :class:`ModelOutput` — the forward's result for the loss's ``task``: ``logits`` (``causal_lm``:
  transformers' own output object, which reads as a mapping too), ``embeddings`` and
  ``last_hidden_state`` (``embedding``), or the hidden states and head weight of the fused loss
  (``fused_lm_ce``).
  Read fields by key (``outputs["logits"]``), which every forward supports.

Both are ``TypedDict`` s (``total=False``): annotations for a reader and a type checker, plain dicts
at run time, so ``InputFeature(input_ids=ids, labels=labels)`` builds a batch ``forward_backward``
takes. A plain function written ``fn(inputs: InputFeature, outputs: ModelOutput) -> torch.Tensor``
works with ``set_loss(fn)``: it returns the batch's mean loss (each micro-batch weighs the same under
gradient accumulation); a :class:`twinkle.loss.Loss` subclass returns ``(sum, items)`` instead so
micro-batches are weighted by tokens.

Importing this module imports no torch (``import twinkle`` stays cheap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from torch import Tensor
else:  # the annotations stay resolvable (typing.get_type_hints) without importing torch
    Tensor = Any

__all__ = ["InputFeature", "LossFn", "ModelOutput"]


class InputFeature(TypedDict, total=False):
    """A collated batch, as a loss (and a model's forward) receives it. Tensors are (rows, tokens) unless said."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    #: twinkle's SFT rows: the ids to predict, -100 where not trained (``logits[:, t]`` predicts ``labels[:, t+1]``)
    labels: Tensor
    #: Tinker's RL rows: the target of each position (``logits[:, t]`` scores ``target_tokens[:, t]``) and its weight
    target_tokens: Tensor
    weights: Tensor
    #: per-token RL fields: the sampler's log-probabilities, the advantages, the reference log-probabilities
    logprobs: Tensor
    advantages: Tensor
    ref_logprobs: Tensor
    #: embedding batches: rows come in groups of ``group_size`` (query, positive, negatives...)
    group_size: int
    #: vision-language batches (the model's processor names them)
    pixel_values: Tensor
    image_grid_thw: Tensor
    pixel_values_videos: Tensor
    video_grid_thw: Tensor
    #: bookkeeping the processor adds: each row's real length
    length: Tensor


class ModelOutput(TypedDict, total=False):
    """What a forward returned, by task."""

    #: ``causal_lm``: (rows, tokens, vocab) next-token logits
    logits: Tensor
    #: ``embedding``: one pooled vector per row (rows, hidden); ``embedding`` and ``fused_lm_ce``: the final
    #: hidden states (rows, tokens, hidden)
    embeddings: Tensor
    last_hidden_state: Tensor
    #: ``fused_lm_ce``: the LM head's weight and bias (the logits are never built)
    lm_head_weight: Tensor
    lm_head_bias: Tensor


#: A loss function as ``set_loss`` takes it: ``fn(inputs, outputs, **kwargs) -> scalar tensor`` (the batch mean)
LossFn = Callable[..., "Tensor"]
