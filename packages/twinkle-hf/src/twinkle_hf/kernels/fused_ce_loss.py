"""LigerFusedLinearCrossEntropyLoss: next-token cross-entropy from hidden states and the lm_head weight.

Used with ``task='fused_lm_ce'``: the forward skips the lm_head matmul, so the (batch, seq, vocab)
logits never exist; this loss multiplies chunk by chunk. It runs the first choice of the
``fused_linear_cross_entropy`` chain that is available on the hidden states' device — liger on
cuda, the torch chunked kernel elsewhere — and when a choice raises (no GPU driver, a shape it
rejects) it falls back to the next one, says so once, and keeps using the fallback.

Contract for the forward's outputs (a dict or a transformers ModelOutput):

- ``last_hidden_state``: (batch, seq, hidden), the final-norm output that lm_head would consume
  (a tensor ``hidden_states`` is accepted too);
- ``lm_head_weight``: (vocab, hidden), and ``lm_head_bias`` (vocab,) when the head has one — or
  ``lm_head``: the head module itself. Build them with :func:`fused_ce_outputs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from twinkle.constants import IGNORE_INDEX, SHIFT_LABELS
from twinkle.kernel import KernelChoice, chain_for
from twinkle.kernel.config import normalize_config
from twinkle.kernel.cross_entropy import FusedCEOutput
from twinkle.log import get_logger
from twinkle.loss.base import Loss

OP = "fused_linear_cross_entropy"
logger = get_logger("twinkle.kernel")


def _field(outputs: Any, name: str) -> Any:
    if isinstance(outputs, Mapping):
        return outputs.get(name)
    return getattr(outputs, name, None)


def fused_ce_outputs(last_hidden_state: torch.Tensor, lm_head: torch.nn.Module) -> dict[str, Any]:
    """What a ``task='fused_lm_ce'`` forward returns: the hidden states and the head's weight/bias."""
    return {"last_hidden_state": last_hidden_state, "lm_head_weight": lm_head.weight,
            "lm_head_bias": getattr(lm_head, "bias", None)}


def fused_ce_inputs(outputs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(hidden, weight, bias) from a fused forward's outputs, or a KeyError stating the contract."""
    hidden = _field(outputs, "last_hidden_state")
    if hidden is None and isinstance(_field(outputs, "hidden_states"), torch.Tensor):
        hidden = _field(outputs, "hidden_states")
    head = _field(outputs, "lm_head")
    weight = _field(outputs, "lm_head_weight")
    bias = _field(outputs, "lm_head_bias")
    if weight is None and head is not None:
        weight, bias = head.weight, getattr(head, "bias", None)
    if not isinstance(hidden, torch.Tensor) or not isinstance(weight, torch.Tensor):
        have = list(outputs.keys()) if isinstance(outputs, Mapping) else [k for k in dir(outputs) if not k[0] == "_"]
        raise KeyError("LigerFusedLinearCrossEntropyLoss needs the forward of task='fused_lm_ce': outputs with "
                       "'last_hidden_state' (batch, seq, hidden) and 'lm_head_weight' (vocab, hidden) or 'lm_head'; "
                       f"these outputs have {', '.join(map(str, have))}. With task='causal_lm' use CrossEntropyLoss.")
    return hidden, weight, bias


class LigerFusedLinearCrossEntropyLoss(Loss):
    """Next-token CE (position t predicts ``labels[t + 1]``) without materialising the logits.

    ``reduction``: 'mean' over trained tokens or 'sum'. ``chain``: the kernel chain to use
    (choices or registered names; default: the installed ``fused_linear_cross_entropy`` chain).
    After each call :attr:`last_token_counts` holds ``(num_correct, num_tokens)`` tensors, so
    token accuracy is available without logits.
    """

    task = "fused_lm_ce"

    def __init__(self, reduction: str = "mean", ignore_index: int = IGNORE_INDEX,
                 chain: Sequence[KernelChoice | str] | None = None, chunk_size: int | None = None) -> None:
        super().__init__(reduction)
        self.ignore_index = ignore_index
        self.chunk_size = chunk_size
        self._chain = tuple(normalize_config({OP: list(chain)})[OP]) if chain is not None else None
        self.failed: dict[str, str] = {}  # choice name -> why it was dropped
        self.last_choice: str | None = None
        self.last_token_counts: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def chain(self) -> tuple[KernelChoice, ...]:
        return self._chain if self._chain is not None else chain_for(OP)

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if "labels" not in inputs and SHIFT_LABELS not in inputs:
            raise KeyError("LigerFusedLinearCrossEntropyLoss needs 'labels' in the inputs (encode with a template).")
        hidden, weight, bias = fused_ce_inputs(outputs)
        if inputs.get(SHIFT_LABELS) is not None:  # aligned with the hidden states already (sequence parallelism)
            shift_hidden = hidden.reshape(-1, hidden.shape[-1])
            shift_labels = inputs[SHIFT_LABELS].to(hidden.device).reshape(-1)
        else:
            labels = inputs["labels"].to(hidden.device)
            shift_hidden = hidden[..., :-1, :].reshape(-1, hidden.shape[-1])
            shift_labels = labels[..., 1:].reshape(-1)
        result = self.run(shift_hidden, weight, shift_labels, bias, reduction="sum")
        self.last_token_counts = (result.num_correct, result.num_tokens)
        return result.loss, result.num_tokens

    def run(self, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
            bias: torch.Tensor | None = None, reduction: str = "mean") -> FusedCEOutput:
        """Aligned (unshifted) rows through the first working choice of the chain."""
        device = hidden.device.type
        candidates = [c for c in self.chain if c.function is not None and c.name not in self.failed
                      and c.is_available(device)]
        if not candidates:
            raise RuntimeError(f"No fused_linear_cross_entropy kernel can run on {device!r}: chain "
                               f"[{', '.join(c.name for c in self.chain)}], dropped after failing: {self.failed}.")
        for i, choice in enumerate(candidates):
            try:
                fn = choice.load_function()
                result = fn(hidden, weight, labels, bias, ignore_index=self.ignore_index, reduction=reduction,
                            chunk_size=self.chunk_size)
            except Exception as exc:
                if i == len(candidates) - 1:
                    raise
                self.failed[choice.name] = f"{type(exc).__name__}: {exc}"
                logger.warning("LigerFusedLinearCrossEntropyLoss: %s failed on %s (%s); falling back to %s "
                               "from now on.", choice.name, device, self.failed[choice.name], candidates[i + 1].name)
                continue
            if choice.name != self.last_choice:
                skipped = [c.name for c in self.chain if c.function is not None and c not in candidates]
                logger.info("LigerFusedLinearCrossEntropyLoss: using %s on %s%s.", choice.name, device,
                            f" ({', '.join(skipped)} not available here)" if skipped else "")
                self.last_choice = choice.name
            return result
        raise AssertionError("unreachable")
