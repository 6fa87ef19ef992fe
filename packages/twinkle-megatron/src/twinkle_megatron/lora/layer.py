"""LoRA on megatron-core's ColumnParallelLinear / RowParallelLinear (local or Transformer Engine flavours).

peft 0.21's own megatron layer cannot be used: its dispatcher raises ``KeyError: 'fan_in_fan_out'``
and its forward feeds the ``(output, bias)`` tuple of a parallel layer into the next linear. This
layer keeps peft's maths (``y = W x + B A dropout(x) * alpha / r``) and its init (A Kaiming-uniform,
B zero) and shards like the layer it wraps:

* column-parallel base (output split over TP): A ``[r, in]`` replicated, B ``[out/tp, r]`` split by
  rows; the A-output passes ``copy_to_tensor_model_parallel_region`` so A's gradient is summed over TP;
* row-parallel base (input split over TP): A ``[r, in/tp]`` split by columns, its output summed over
  TP (``reduce_from_tensor_model_parallel_region``); B ``[out, r]`` replicated.

Under sequence parallelism the column input is gathered along the sequence and the row output
reduce-scattered, as the base layer does; a column layer asked to gather its output (``gather_output``
or GPTModel's ``runtime_gather_output=``) gathers the LoRA delta with it. Several adapters live side by
side; one is active, or (a batched multi-tenant step) each range of rows has its own
(:meth:`LoraParallelLinear.route_rows`). GPTModel's ``output_layer`` (HF ``lm_head``) is a column layer
with a padded vocabulary and, with tied embeddings, no weight of its own: :class:`LoraOutputLayer`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def is_row_parallel(layer: nn.Module) -> bool:
    """Row-parallel layers (input split over TP) have ``input_is_parallel``; column ones ``gather_output``."""
    return hasattr(layer, "input_is_parallel") or getattr(layer, "parallel_mode", None) == "row"


def _dims(layer: nn.Module) -> tuple[int, int]:
    """(full input features, full output features) of a megatron parallel linear layer."""
    if hasattr(layer, "input_size") and hasattr(layer, "output_size"):
        return int(layer.input_size), int(layer.output_size)
    weight = layer.weight
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    out, inp = weight.shape
    return (inp * tp, out) if is_row_parallel(layer) else (inp, out * tp)


class LoraParallelLinear(nn.Module):
    """A megatron parallel linear layer plus LoRA adapters; forward returns ``(output, bias)`` like the base."""

    #: where the base layer's tensors sit in the sharded state dict (dist-checkpointing), below this module's prefix
    base_prefix = "base_layer."

    def __init__(self, base_layer: nn.Module) -> None:
        super().__init__()
        from megatron.core import parallel_state

        self.base_layer = base_layer
        self.row = is_row_parallel(base_layer)
        self.in_features, self.out_features = _dims(base_layer)
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.sequence_parallel = bool(getattr(base_layer, "sequence_parallel", False))
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        self.lora_dropout = nn.ModuleDict()
        self.scaling: dict[str, float] = {}
        self.r: dict[str, int] = {}
        self.active_adapter: str | None = None
        #: (adapter or None, first row, end row) per range of the batch ([]: no adapter for any row); None:
        #: ``active_adapter`` for every row
        self.row_adapters: list[tuple[str | None, int, int]] | None = None

    def add_adapter(self, name: str, r: int, alpha: float, dropout: float = 0.0, use_rslora: bool = False,
                    generator: torch.Generator | None = None) -> None:
        """Create adapter ``name``: A drawn as peft does (on the full matrix, then this rank's slice), B zero."""
        device = self.device
        a = self.draw_a(r, generator)
        b = torch.zeros(self.out_features if self.row else self.out_features // self.tp_size, r)
        self.lora_A[name] = nn.Parameter(a.to(device))
        self.lora_B[name] = nn.Parameter(b.to(device))
        self._mark_parallel(name)
        self.lora_dropout[name] = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling[name] = alpha / math.sqrt(r) if use_rslora else alpha / r
        self.r[name] = r
        if self.active_adapter is None:
            self.active_adapter = name

    @property
    def device(self) -> torch.device:
        """Where the LoRA tensors live: with the base layer's weight."""
        return self.base_layer.weight.device

    def draw_a(self, r: int, generator: torch.Generator | None) -> torch.Tensor:
        """peft's init of an ``[r, in]`` A (kaiming_uniform_(a=sqrt(5))) drawn whole, then this rank's slice."""
        full_a = torch.empty(r, self.in_features, dtype=torch.float32)
        bound = 1.0 / math.sqrt(self.in_features)
        full_a.uniform_(-bound, bound, generator=generator)
        return torch.chunk(full_a, self.tp_size, dim=1)[self.tp_rank].contiguous() if self.row else full_a

    def _mark_parallel(self, name: str) -> None:
        """Tell megatron (grad norm, distributed checkpointing) which LoRA tensors are split over TP."""
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

        split, dim = (self.lora_A[name], 1) if self.row else (self.lora_B[name], 0)
        set_tensor_model_parallel_attributes(split, True, dim, 1)
        if self.row and self.sequence_parallel:
            self.lora_B[name].sequence_parallel = True  # its grad is summed over the sequence shards

    def configure(self, name: str, r: int, scaling: float, dropout: float) -> None:
        """Use only the first ``r`` ranks of adapter ``name``, with this scaling and dropout (multi-LoRA slots)."""
        if not 1 <= r <= self.lora_A[name].shape[0]:
            raise ValueError(f"r={r} is outside 1..{self.lora_A[name].shape[0]} for adapter {name!r}.")
        self.r[name] = r
        self.scaling[name] = scaling
        self.lora_dropout[name] = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def remove_adapter(self, name: str) -> None:
        for container in (self.lora_A, self.lora_B, self.lora_dropout):
            del container[name]
        self.scaling.pop(name)
        self.r.pop(name)
        if self.active_adapter == name:
            self.active_adapter = next(iter(self.lora_A.keys()), None)

    def set_adapter(self, name: str | None) -> None:
        if name is not None and name not in self.lora_A:
            raise KeyError(f"This layer has no adapter {name!r}; it has {list(self.lora_A.keys())}.")
        self.active_adapter = name

    def route_rows(self, routes: list[tuple[str | None, int, int]] | None) -> None:
        """Rows ``start:stop`` of the batch through adapter ``name`` (None: no adapter) for each route; None:
        every row through the active adapter again. Routes cover the batch's rows in order."""
        if routes is not None and all(name is None for name, _, _ in routes):
            routes = []  # no route adapts this layer: the base layer alone
        self.row_adapters = routes

    def _lora_input(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's real input: Transformer Engine's LayerNorm-Linear normalises inside (RMSNorm here)."""
        norm_weight = getattr(self.base_layer, "layer_norm_weight", None)
        if norm_weight is None:
            return x
        eps = float(getattr(self.base_layer.config, "layernorm_epsilon", 1e-6))
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        return (normed * norm_weight.float()).to(x.dtype)

    def lora_delta(self, x: torch.Tensor, name: str) -> torch.Tensor:
        from megatron.core import tensor_parallel as tp

        r = self.r[name]  # a multi-LoRA tenant uses the first r ranks of its slot (all of them otherwise)
        a, b = self.lora_A[name][:r], self.lora_B[name][:, :r]
        x = self.lora_dropout[name](self._lora_input(x)).to(a.dtype)
        if self.row:
            hidden = torch.matmul(x, a.t())
            if self.sequence_parallel:
                hidden = tp.reduce_scatter_to_sequence_parallel_region(hidden)
            elif self.tp_size > 1:
                hidden = tp.reduce_from_tensor_model_parallel_region(hidden)
            return torch.matmul(hidden, b.t()) * self.scaling[name]
        if self.sequence_parallel:
            x = tp.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False)
        hidden = torch.matmul(x, a.t())
        if self.tp_size > 1:
            hidden = tp.copy_to_tensor_model_parallel_region(hidden)
        return self.project_up(hidden, b) * self.scaling[name]

    def project_up(self, hidden: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``hidden @ B.T`` of a column layer: this rank's output features."""
        return torch.matmul(hidden, b.t())

    def gathers_output(self, kwargs: dict[str, Any]) -> bool:
        """Whether the base layer returns its output gathered over TP (column layers: ``gather_output``, or
        ``runtime_gather_output=`` as GPTModel passes it to its output layer)."""
        if self.row:
            return False
        runtime = kwargs.get("runtime_gather_output")
        return bool(getattr(self.base_layer, "gather_output", False) if runtime is None else runtime)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = self.base_layer(x, *args, **kwargs)
        name, rows = self.active_adapter, self.row_adapters
        if (name is None and rows is None) or rows == []:
            return out
        result, bias = out if isinstance(out, tuple) else (out, None)
        gather = self.tp_size > 1 and self.gathers_output(kwargs)
        width = result.shape[-1] // self.tp_size if gather else result.shape[-1]  # the delta: this rank's features
        if rows is None:
            delta = self.lora_delta(x, name).to(result.dtype)
        else:  # megatron's activations are [sequence, batch, hidden]: rows are dimension 1
            delta = torch.cat([self.lora_delta(x[:, start:stop], adapter).to(result.dtype) if adapter is not None
                               else result.new_zeros(*result.shape[:-2], stop - start, width)
                               for adapter, start, stop in rows], dim=1)
        if gather:
            from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

            delta = gather_from_tensor_model_parallel_region(delta)
        result = result + delta
        return (result, bias) if isinstance(out, tuple) else result

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> Any:
        """Base layer's shards plus LoRA tensors (split ones along their TP dim), for dist-checkpointing."""
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state = self.base_layer.sharded_state_dict(f"{prefix}{self.base_prefix}", sharded_offsets, metadata)
        lora = {}
        axis = {}
        for name in self.lora_A.keys():
            lora[f"lora_A.{name}"] = self.lora_A[name]
            lora[f"lora_B.{name}"] = self.lora_B[name]
            axis[f"lora_A.{name}" if self.row else f"lora_B.{name}"] = 1 if self.row else 0
        state.update(make_sharded_tensors_for_checkpoint(lora, prefix, axis, sharded_offsets))
        return state


class LoraOutputLayer(LoraParallelLinear):
    """LoRA on GPTModel's ``output_layer`` (HF ``lm_head``): a column-parallel layer whose output is this rank's
    shard of the (padded) vocabulary, kept vocabulary-parallel.

    * GPTModel calls it with its own keywords: ``output_layer(hidden, weight=..., runtime_gather_output=...)``.
      With tied embeddings the base layer has no weight; the shared embedding weight comes in as ``weight=``
      and the LoRA delta applies all the same (peft's LoRA on a tied ``lm_head`` does the same: the input
      embeddings are not adapted).
    * B is split over the vocabulary like the weight (``[padded_vocab / tp, r]`` on each rank). Rows of
      megatron's vocabulary padding (global row ``>= vocab_size``) take no part in the product: their delta
      and gradient are zero, so they stay zero, and the exported adapter cuts them off.
    * ``weight`` and the sharded state dict are the base layer's, under megatron's own names
      (``output_layer.weight``), as GPTModel reads them (``shared_embedding_or_output_weight`` on a last
      pipeline stage, its ``sharded_state_dict``).
    """

    base_prefix = ""

    def __init__(self, base_layer: nn.Module, vocab_size: int | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__(base_layer)
        rows = self.out_features // self.tp_size
        real = rows if vocab_size is None else vocab_size - self.tp_rank * rows
        #: this rank's rows of B that are real vocabulary (the rest is padding)
        self.real_rows = max(0, min(rows, real))
        self._device = device

    @property
    def weight(self) -> torch.Tensor | None:
        return self.base_layer.weight

    @property
    def device(self) -> torch.device:
        """With tied embeddings the base layer holds no weight: the device the model gave at wrapping."""
        weight = self.base_layer.weight
        return weight.device if weight is not None else (self._device or torch.device("cpu"))

    def project_up(self, hidden: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        padding = b.shape[0] - self.real_rows
        if padding == 0:
            return torch.matmul(hidden, b.t())
        return torch.nn.functional.pad(torch.matmul(hidden, b[:self.real_rows].t()), (0, padding))


@contextmanager
def base_only(layers: Iterable[LoraParallelLinear]) -> Iterator[None]:
    """Inside the block ``layers`` run no adapter (the reference policy); their routing is restored afterwards."""
    layers = list(layers)
    saved = [(layer.active_adapter, layer.row_adapters) for layer in layers]
    for layer in layers:
        layer.active_adapter, layer.row_adapters = None, None
    try:
        yield
    finally:
        for layer, (active, rows) in zip(layers, saved, strict=True):
            layer.active_adapter, layer.row_adapters = active, rows
