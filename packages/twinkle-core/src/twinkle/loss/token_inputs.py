"""Per-token inputs of the RL and preference losses, brought to one alignment, and what they give back.

A batch reaches a loss in one of two layouts:

* **Tinker's** (what the training service and :class:`twinkle.rollout.Rollout` rows use):
  ``target_tokens`` (rows, T), position ``t`` scored by ``logits[:, t]``; optional ``weights`` and the
  per-token fields ``logprobs`` (sampling), ``advantages``, ``ref_logprobs`` aligned the same way.
  Without ``weights`` every real token (``attention_mask``) weighs 1.
* **twinkle's SFT rows**: ``labels`` (rows, T), ``logits[:, t]`` predicting ``labels[:, t + 1]``, -100
  untrained; per-token fields are aligned with the tokens (like ``labels``) and shifted the same way.

:func:`token_view` turns either into :class:`TokenView` (Tinker alignment). Sequences are found
from the inputs: a padded row is one sequence; in a packed row (``padding_free``) a sequence starts
where ``position_ids`` restart at 0. Sequence-level losses (GRPO, GSPO, DPO...) sum per sequence
with :meth:`TokenView.per_sequence`, which stays differentiable.

A loss that computed the per-token log-probabilities of the targets keeps them in ``last_outputs``
(:class:`TokenOutputs`), so a model can hand each sample's values back (Tinker's
``loss_fn_outputs``) without a second forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.constants import IGNORE_INDEX

#: The fields a loss may read per token (besides target_tokens/labels and weights).
TOKEN_FIELDS = ("logprobs", "advantages", "ref_logprobs")

#: What a plain-sum loss reports as its item count: the model divides by ``max(items, 1) = 1``, so the
#: applied gradient is the sum over every micro-batch and data rank (Tinker's normalisation).
SUM_ITEMS = 0


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` per position, in float32 or better (targets must be valid ids)."""
    if logits.dtype != torch.float64:
        logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _shift(values: torch.Tensor, fill: float | int) -> torch.Tensor:
    """Position t takes the value of t + 1 (labels layout -> Tinker layout)."""
    return F.pad(values, (0, 1), value=fill)[..., 1:]


def segment_ids(inputs: Mapping[str, Any], shape: torch.Size, device: torch.device) -> torch.Tensor:
    """Sequence index of every position (row-major order), -1 on padding.

    A row starts a sequence at its first real token; inside a row a new one starts where
    ``position_ids`` return to 0 (packed rows).
    """
    mask = inputs.get("attention_mask")
    real = mask.to(device).bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 \
        else torch.ones(shape, dtype=torch.bool, device=device)
    starts = real & (real.long().cumsum(dim=1) == 1)
    positions = inputs.get("position_ids")
    if isinstance(positions, torch.Tensor) and positions.dim() == 2 and positions.shape == shape:
        starts = starts | (real & (positions.to(device) == 0))
    ids = starts.reshape(-1).long().cumsum(0).reshape(shape) - 1
    return torch.where(real, ids, torch.full_like(ids, -1))


@dataclass
class TokenView:
    """A batch's per-token targets, weights and fields in Tinker alignment, with its sequences."""

    targets: torch.Tensor
    weights: torch.Tensor
    fields: dict[str, torch.Tensor]
    segments: torch.Tensor
    labels_layout: bool
    loss_name: str

    @property
    def capacity(self) -> int:
        """Length of every per-sequence tensor: the position count, a bound on the sequences known without
        reading the device (each sequence has a position). Slots past the last sequence hold zeros."""
        return self.segments.numel()

    @cached_property
    def _buckets(self) -> torch.Tensor:
        """Flat sequence index of every position; padding goes to one spare bucket after the last slot."""
        return torch.where(self.segments >= 0, self.segments, self.capacity).reshape(-1)

    def field(self, name: str) -> torch.Tensor:
        """A per-token field, with an error saying how to provide it."""
        if name not in self.fields:
            hint = ("compute them with a reference forward (the model adds them when the loss asks) or "
                    "sampler.compute_logprobs(..., reference=True)") if name == "ref_logprobs" else \
                "build rows with twinkle.rollout.Rollout.to_row() or give the per-token values in the batch"
            raise KeyError(f"The {self.loss_name} loss needs per-token {name!r} in the inputs; {hint}.")
        return self.fields[name]

    def log_ratio(self, logprobs: torch.Tensor, name: str = "logprobs") -> torch.Tensor:
        """``logprobs - inputs[name]`` on weighted positions, 0 elsewhere (so no inf/nan leaks from padding)."""
        diff = logprobs - self.field(name)
        return torch.where(self.weights != 0, diff, torch.zeros_like(diff))

    def logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the targets under ``logits`` (rows, T)."""
        if logits.shape[:2] != self.targets.shape:
            raise ValueError(f"The {self.loss_name} loss got logits for {tuple(logits.shape[:2])} positions but "
                             f"targets for {tuple(self.targets.shape)}; give one target per input position.")
        return gather_logprobs(logits, self.targets)

    def per_sequence(self, values: torch.Tensor) -> torch.Tensor:
        """Sum of ``values`` (rows, T) over each sequence's positions -> (capacity,); differentiable.

        Shapes never depend on the data (no boolean indexing, no count read back), so a sequence-level
        loss queues its work without waiting for the device.
        """
        out = values.new_zeros(self.capacity + 1)
        return out.index_add(0, self._buckets, values.reshape(-1))[:-1]

    def trained_sequences(self) -> torch.Tensor:
        """(capacity,) bool: sequences with at least one weighted token (False on unused slots)."""
        return self.per_sequence((self.weights != 0).to(self.weights.dtype)) > 0

    def to_input_alignment(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token values in the layout the inputs use (inverse of the shift applied to labels)."""
        return F.pad(values, (1, 0), value=0.0)[..., :-1] if self.labels_layout else values


def token_view(inputs: Mapping[str, Any], logits: torch.Tensor, loss_name: str) -> TokenView:
    """Targets, weights and per-token fields of ``inputs`` in Tinker alignment, on ``logits``' device."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return inputs_view(inputs, logits.shape[:2], logits.device, dtype, loss_name)


def inputs_view(inputs: Mapping[str, Any], shape: tuple[int, ...], device: torch.device, dtype: torch.dtype,
                loss_name: str) -> TokenView:
    """:func:`token_view` without logits: for checks of a collated batch on the host, before any forward."""

    def as_float(value: Any, name: str) -> torch.Tensor:
        tensor = torch.as_tensor(value, device=device).to(dtype)
        if tensor.shape != shape:
            raise ValueError(f"The {loss_name} loss: inputs[{name!r}] has shape {tuple(tensor.shape)}, expected "
                             f"{tuple(shape)} (one value per input position).")
        return tensor

    if "target_tokens" in inputs:
        targets = torch.as_tensor(inputs["target_tokens"], device=device).long()
        if targets.shape != shape:
            raise ValueError(f"The {loss_name} loss: target_tokens has shape {tuple(targets.shape)} but the logits "
                             f"cover {tuple(shape)} positions.")
        if "weights" in inputs:
            weights = as_float(inputs["weights"], "weights")
        elif isinstance(inputs.get("attention_mask"), torch.Tensor) and inputs["attention_mask"].dim() == 2:
            weights = as_float(inputs["attention_mask"], "attention_mask")
        else:
            weights = torch.ones(shape, device=device, dtype=dtype)
        fields = {name: as_float(inputs[name], name) for name in TOKEN_FIELDS if name in inputs}
        labels_layout = False
    elif "labels" in inputs:
        labels = _shift(torch.as_tensor(inputs["labels"], device=device).long(), IGNORE_INDEX)
        if labels.shape != shape:
            raise ValueError(f"The {loss_name} loss: labels have shape {tuple(labels.shape)} but the logits cover "
                             f"{tuple(shape)} positions.")
        trained = labels != IGNORE_INDEX
        targets = torch.where(trained, labels, torch.zeros_like(labels))
        weights = trained.to(dtype)
        if "weights" in inputs:
            weights = weights * _shift(as_float(inputs["weights"], "weights"), 0.0)
        fields = {name: _shift(as_float(inputs[name], name), 0.0) for name in TOKEN_FIELDS if name in inputs}
        labels_layout = True
    else:
        raise KeyError(f"The {loss_name} loss needs 'target_tokens' (Tinker layout) or 'labels' (twinkle rows) in "
                       f"the inputs; got {', '.join(map(str, inputs))}.")
    segments = segment_ids(inputs, shape, device)
    weights = torch.where(segments >= 0, weights, torch.zeros_like(weights))
    return TokenView(targets, weights, fields, segments, labels_layout, loss_name)


@dataclass
class TokenOutputs:
    """What a loss computed besides its value: per-token tensors (rows, T) and per-sequence values."""

    per_token: dict[str, torch.Tensor]
    segments: torch.Tensor
    per_sequence: dict[str, torch.Tensor] = field(default_factory=dict)

    def per_sample(self) -> list[dict[str, torch.Tensor]]:
        """One dict per sequence of the batch, in batch order; per-token values cover the sequence's positions."""
        valid = self.segments >= 0
        counts = torch.bincount(self.segments[valid]).tolist() if valid.any() else []
        split = {name: torch.split(values.detach()[valid].cpu(), counts) for name, values in self.per_token.items()}
        samples = [{name: parts[k] for name, parts in split.items()} for k in range(len(counts))]
        for name, values in self.per_sequence.items():  # (capacity,): the slots past the last sequence are unused
            for k, value in enumerate(values.detach()[:len(counts)].cpu()):
                samples[k][name] = value
        return samples


#: upstream Twinkle's per-call names of the per-token fields: ``loss(inputs, outputs, advantages=...)``
CALL_OPTIONS = {"advantages": "advantages", "old_logps": "logprobs", "ref_logps": "ref_logprobs"}


def with_call_options(inputs: Mapping[str, Any], options: Mapping[str, Any], loss_name: str) -> Mapping[str, Any]:
    """``inputs`` with the per-call fields of ``options`` (see :data:`CALL_OPTIONS`) added, others refused.

    A value is per token (the shape of the batch's tokens, aligned as its other per-token fields are) or
    per sequence (one value per sequence of the batch, in batch order), spread over the sequence's tokens.
    """
    unknown = sorted(set(options) - set(CALL_OPTIONS))
    if unknown:
        raise TypeError(f"The {loss_name} loss takes no call options {unknown} (it takes "
                        f"{', '.join(CALL_OPTIONS)}); set the others when building the loss "
                        "(set_loss(name, **options)).")
    if not options:
        return inputs
    tokens = next((inputs[k] for k in ("input_ids", "labels", "target_tokens") if k in inputs), None)
    if tokens is None:
        raise KeyError(f"The {loss_name} loss needs 'input_ids', 'labels' or 'target_tokens' in the inputs.")
    shape = tuple(torch.as_tensor(tokens).shape)
    merged = dict(inputs)
    for option, value in options.items():
        if value is None:
            continue
        tensor = torch.as_tensor(value, dtype=torch.float32) if not isinstance(value, torch.Tensor) else value
        if tuple(tensor.shape) != shape:
            tensor = _per_sequence(tensor, inputs, shape, option, loss_name)
        merged[CALL_OPTIONS[option]] = tensor
    return merged


def _per_sequence(values: torch.Tensor, inputs: Mapping[str, Any], shape: tuple[int, ...], option: str,
                  loss_name: str) -> torch.Tensor:
    segments = segment_ids(inputs, torch.Size(shape), values.device)
    count = int(segments.max()) + 1 if segments.numel() else 0
    if values.dim() == 2 and values.shape[-1] == 1:  # a (sequences, 1) column, as upstream's examples build it
        values = values.reshape(-1)
    if values.dim() != 1 or values.numel() != count:
        raise ValueError(f"The {loss_name} loss: {option}= has shape {tuple(values.shape)}; give one value per token "
                         f"{shape} or one per sequence ({count} in this batch).")
    spread = values.to(torch.float32)[segments.clamp(min=0)]
    return torch.where(segments >= 0, spread, torch.zeros_like(spread))


def loss_inputs(inputs: Mapping[str, Any], outputs: Any, loss_name: str,
                options: Mapping[str, Any]) -> tuple[TokenView, torch.Tensor, torch.Tensor | None]:
    """What every RL/preference ``compute`` starts with: (view, target log-probabilities, logits).

    ``options`` are the call's keyword arguments: upstream Twinkle's per-call fields
    (:data:`CALL_OPTIONS`); the losses take their other settings at construction.
    """
    from twinkle.loss.base import output_field

    inputs = with_call_options(inputs, options, loss_name)
    logps = _output_logps(outputs)
    if logps is not None:  # the forward gave the targets' log-probabilities, aligned like the inputs' fields
        dtype = torch.float64 if logps.dtype == torch.float64 else torch.float32
        view = inputs_view(inputs, logps.shape, logps.device, dtype, loss_name)
        return view, _shift(logps.to(dtype), 0.0) if view.labels_layout else logps.to(dtype), None
    logits = output_field(outputs, "logits")
    view = token_view(inputs, logits, loss_name)
    return view, view.logprobs(logits), logits


def token_entropies(outputs: Any, logits: torch.Tensor | None, view: TokenView, loss_name: str) -> torch.Tensor:
    """Each position's policy entropy in the view's alignment: ``outputs['entropies']``, else from the logits."""
    get = outputs.get if isinstance(outputs, Mapping) else lambda name: getattr(outputs, name, None)
    given = get("entropies")
    if isinstance(given, torch.Tensor):
        values = given.to(view.weights)
        if values.shape != view.weights.shape:
            raise ValueError(f"The {loss_name} loss: outputs['entropies'] has shape {tuple(values.shape)}, expected "
                             f"{tuple(view.weights.shape)} (one per position).")
        return _shift(values, 0.0) if view.labels_layout else values
    if logits is None:
        raise KeyError(f"The {loss_name} loss with entropy_coef > 0 needs outputs['entropies'] or the logits.")
    logp = torch.log_softmax(logits.to(view.weights.dtype), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def _output_logps(outputs: Any) -> torch.Tensor | None:
    """``outputs['logps']`` when the outputs carry per-token log-probabilities and no logits, else None."""
    get = outputs.get if isinstance(outputs, Mapping) else lambda name: getattr(outputs, name, None)
    logps = get("logps")
    return logps if isinstance(logps, torch.Tensor) and get("logits") is None and logps.dim() == 2 else None


def reference_logprobs(inputs: Mapping[str, Any], logits: torch.Tensor) -> torch.Tensor:
    """``ref_logprobs`` for ``inputs`` from a reference forward's logits, in the inputs' own layout."""
    view = token_view(inputs, logits, "reference")
    return view.to_input_alignment(view.logprobs(logits))
