"""Cross-entropy and token accuracy on vocabulary-parallel logits: no rank holds (tokens, vocab) logits.

GPTModel's output layer is column-parallel: TP rank r computes the logits of vocabulary rows
``[r*V/tp, (r+1)*V/tp)`` (V padded to a multiple of tp). The default loss runs megatron-core's
``vocab_parallel_cross_entropy`` on that shard (three small all-reduces over TP: max, target logit,
sum of exponentials); token accuracy comes from a vocab-parallel arg-max (each rank's best value
and index, one all-gather of a ``(2, tokens)`` tensor, the best over ranks). The padded vocabulary
columns are set to ``-inf`` first, so they take no probability and are never predicted.

Next-token labels are shifted on the whole row (:func:`next_token_labels`) *before* a
context-parallel split, so a token whose successor lives on another CP rank keeps its label.

Full logits are assembled only when someone asks: ``outputs['logits']`` of ``forward`` /
``forward_only`` gathers the shards over TP (megatron's differentiable gather) on first access.
A custom loss reads them that way; the default cross-entropy (:class:`VocabParallelCrossEntropy`,
what the backend applies for a group whose loss is twinkle's ``CrossEntropyLoss``) and the token
accuracy (``LogitsOutputs.token_matches``) never do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle import collective
from twinkle.constants import IGNORE_INDEX
from twinkle.loss import CrossEntropyLoss, Loss
from twinkle_megatron.errors import MegatronConfigError

#: Batch key of the labels shifted by one token on the full row (see :func:`next_token_labels`).
NEXT_LABELS = "next_token_labels"


def is_default_cross_entropy(loss_fn: Any) -> bool:
    """twinkle's CrossEntropyLoss (or a subclass that keeps its ``compute``): computed vocab-parallel."""
    return loss_fn is None or (isinstance(loss_fn, CrossEntropyLoss)
                               and type(loss_fn).compute is CrossEntropyLoss.compute)


def ignore_index_of(loss_fn: Any) -> int:
    return int(getattr(loss_fn, "ignore_index", IGNORE_INDEX)) if loss_fn is not None else IGNORE_INDEX


def next_token_labels(labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """``labels[:, t + 1]`` at position t (``ignore_index`` at the last position): what logits at t predict."""
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:]


def _tp() -> tuple[int, int, Any]:
    from megatron.core import parallel_state as ps

    return (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_group())


def mask_vocab_padding(shard: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Set this rank's padded vocabulary columns (global index >= ``vocab_size``) to -inf, in place.

    Not recorded by autograd (a recorded slice assignment would copy the whole gradient in backward):
    no loss reads those columns -- the softmax gives them 0, gathered logits cut them off -- so their
    gradient is 0 either way.
    """
    _, rank, _ = _tp()
    valid = vocab_size - rank * shard.shape[-1]
    if valid < shard.shape[-1]:
        with torch.no_grad():
            shard[..., max(valid, 0):] = float("-inf")
    return shard


def cross_entropy_sum(shard: torch.Tensor, next_labels: torch.Tensor, ignore_index: int,
                      consume: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, trained tokens) from this rank's vocabulary shard.

    megatron's kernel overwrites fp32 logits with their softmax to save memory; ``consume=False``
    hands it a copy (the caller still shows the logits to someone).
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    mask = next_labels != ignore_index
    target = next_labels.masked_fill(~mask, 0)
    losses = vocab_parallel_cross_entropy(shard if consume else shard.clone(), target)
    return (losses * mask).sum(), mask.sum()


@torch.no_grad()
def argmax_matches(shard: torch.Tensor, next_labels: torch.Tensor, ignore_index: int) -> tuple[Any, Any]:
    """(correct predictions, trained tokens): the arg-max over the whole vocabulary without gathering it."""
    size, rank, group = _tp()
    values, index = shard.max(dim=-1)
    index = index + rank * shard.shape[-1]
    if size > 1:  # torch.argmax keeps the first maximum: across ranks the lowest rank, i.e. the lowest index
        best = torch.stack(collective.all_gather(torch.stack([values.double(), index.double()]), group=group))
        pick = best[:, 0].argmax(dim=0, keepdim=True)
        index = best[:, 1].gather(0, pick).squeeze(0).long()
    mask = next_labels != ignore_index
    return ((index == next_labels) & mask).sum(), mask.sum()


def full_logits(shard: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The (…, vocab) logits from every TP rank's shard (differentiable), padding cut off."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    size, _, _ = _tp()
    full = gather_from_tensor_model_parallel_region(shard) if size > 1 else shard
    return full[..., :vocab_size]


class LogitsOutputs(Mapping):
    """What ``forward`` returns: ``{'logits': (batch, seq, vocab)}``, gathered over TP on first access.

    ``vocab_parallel_logits`` is this rank's shard (padded columns at -inf). Under context
    parallelism each rank holds its own part of the sequence, so full logits are not assembled.
    ``owned``: the shard is a whole forward's output, not rows of one (a kernel may overwrite it).
    """

    def __init__(self, shard: torch.Tensor, vocab_size: int, cp_size: int = 1, owned: bool = True) -> None:
        self.vocab_parallel_logits = shard
        self.vocab_size = vocab_size
        self.cp_size = cp_size
        self.owned = owned
        self._full: torch.Tensor | None = None

    def select_rows(self, rows: slice) -> LogitsOutputs:
        """Rows ``rows`` of the batch (one tenant's of a stacked multi-tenant forward)."""
        return LogitsOutputs(self.vocab_parallel_logits[rows], self.vocab_size, self.cp_size, owned=False)

    def token_matches(self, inputs: Mapping[str, Any], ignore_index: int) -> tuple[Any, Any] | None:
        """(correct arg-max predictions, trained tokens) for ``TokenAccuracy``, without gathering the vocabulary."""
        labels = inputs.get(NEXT_LABELS)
        return argmax_matches(self.vocab_parallel_logits, labels, ignore_index) if labels is not None else None

    def __getitem__(self, key: str) -> torch.Tensor:
        if key != "logits":
            raise KeyError(key)
        if self._full is None:
            if self.cp_size > 1:
                raise MegatronConfigError(
                    f"With cp_size={self.cp_size} every rank holds its own part of each sequence, so full logits "
                    "are not assembled; use the default CrossEntropyLoss (computed context- and vocab-parallel).")
            self._full = full_logits(self.vocab_parallel_logits, self.vocab_size)
        return self._full

    def __iter__(self) -> Iterator[str]:
        return iter(("logits",))

    def __len__(self) -> int:
        return 1


class VocabParallelCrossEntropy(Loss):
    """twinkle's ``CrossEntropyLoss`` computed on this rank's vocabulary shard (and, under CP, its tokens).

    ``consume``: megatron's kernel may overwrite the logits (the engine drops them after the loss);
    rows of a stacked batch (``owned=False``) are never overwritten, their neighbours still need them.
    """

    def __init__(self, ignore_index: int = IGNORE_INDEX, consume: bool = False) -> None:
        super().__init__("mean")
        self.ignore_index = ignore_index
        self.consume = consume

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if NEXT_LABELS not in inputs:
            raise KeyError("CrossEntropyLoss needs 'labels' in the inputs (encode the dataset with a template).")
        total, items = cross_entropy_sum(outputs.vocab_parallel_logits, inputs[NEXT_LABELS], self.ignore_index,
                                         self.consume and outputs.owned)
        return total.reshape(()), items
