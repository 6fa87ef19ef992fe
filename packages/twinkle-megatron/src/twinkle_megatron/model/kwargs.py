"""Megatron training arguments given to ``MegatronModel(**kwargs)``, each sent to the object it configures.

The model API passes every Megatron initialisation argument through kwargs. megatron-core spreads
them over several objects, so each name goes where megatron itself reads it:

- ``TransformerConfig`` fields (``recompute_granularity``, ``recompute_method``, dropout...) build the model;
- ``DistributedDataParallelConfig`` fields (``overlap_grad_reduce``, ``bucket_size``...) wrap it for training;
- ``OptimizerConfig`` fields (``lr``, ``weight_decay``, ``adam_beta1``...) are the defaults of
  ``set_optimizer('default')`` (its own kwargs win); ``use_distributed_optimizer`` and
  ``overlap_param_gather`` belong to both, as in megatron;
- ``micro_batch_size`` is how many rows each micro-batch of ``forward_backward`` holds (it sets
  ``num_microbatches`` when that is not given); ``recompute_activations=True`` is megatron-LM's flag for
  ``recompute_granularity='selective'``.

Anything else is refused with the accepted names; parallel sizes and precision stay with
``device_mesh`` and ``mixed_precision`` (see ``build.split_megatron_kwargs``).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from twinkle.utils.checks import check_int
from twinkle_megatron.build import split_megatron_kwargs

#: arguments that configure no megatron-core dataclass but the schedule, or spell another field
EXTRA = ("micro_batch_size", "recompute_activations")


@dataclass
class MegatronKwargs:
    """The kwargs of one MegatronModel, by destination."""

    transformer: dict[str, Any] = field(default_factory=dict)
    ddp: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    micro_batch_size: int | None = None  # set: num_microbatches() applies

    def num_microbatches(self, rows: int) -> int:
        """Micro-batches of ``micro_batch_size`` rows for a batch of ``rows`` rows."""
        if rows % self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} does not divide this batch of {rows} rows; "
                             "use a batch size that is a multiple of it, or pass num_microbatches=.")
        return rows // self.micro_batch_size


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def split_kwargs(kwargs: dict[str, Any]) -> MegatronKwargs:
    """Sort ``kwargs`` by destination; TypeError for names no megatron object takes, naming the accepted ones."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    rest = dict(kwargs)
    micro = rest.pop("micro_batch_size", None)
    if micro is not None:
        check_int(micro, "micro_batch_size")
    if rest.pop("recompute_activations", False):
        rest.setdefault("recompute_granularity", "selective")
    transformer = split_megatron_kwargs(rest)
    ddp_names, optimizer_names = _names(DistributedDataParallelConfig), _names(OptimizerConfig)
    ddp = {k: v for k, v in rest.items() if k in ddp_names}
    optimizer = {k: v for k, v in rest.items() if k in optimizer_names}
    unknown = sorted(set(rest) - ddp_names - optimizer_names)
    if unknown:
        from megatron.core.transformer import TransformerConfig

        every = _names(TransformerConfig) | ddp_names | optimizer_names | set(EXTRA)
        close = {name: difflib.get_close_matches(name, every, n=2) for name in unknown}
        hint = "".join(f" Did you mean {' or '.join(c)} for {n!r}?" for n, c in close.items() if c)
        raise TypeError(
            f"MegatronModel got unknown arguments {unknown}.{hint} It accepts megatron-core TransformerConfig fields "
            f"(e.g. recompute_granularity, recompute_method, recompute_num_layers, attention_dropout), "
            f"DistributedDataParallelConfig fields ({', '.join(sorted(ddp_names))}), OptimizerConfig fields "
            f"({', '.join(sorted(optimizer_names - _names(TransformerConfig)))}) and {', '.join(EXTRA)}."
        )
    return MegatronKwargs(transformer, ddp, optimizer, micro)
