"""Sequence parallelism for TransformersModel: the mesh's ``cp`` ranks each hold ``seq / cp`` tokens.

The ranks of one ``cp`` group read the same rows (the DataLoader splits rows over dp x fsdp only). Before
the forward every row is padded to a multiple of ``cp`` and each rank keeps its contiguous part of every
per-token tensor (``input_ids``, ``position_ids``, masks...), so embeddings, MLPs, norms, the LM head and
their saved activations exist for ``seq / cp`` tokens per rank. Attention exchanges heads for tokens
(:mod:`twinkle_hf.distributed.ulysses`) and masks with the layout of the whole rows, so padded rows and
packed rows (``position_ids`` restarting at 0) attend exactly as on one process, never across a boundary.

The loss: the labels are shifted for the whole row *before* the split (position t's target is token
t + 1, which may live on the next rank) and handed to the loss as ``shift_labels`` (the name transformers'
own losses take for pre-shifted labels); each rank sums its positions' losses and counts its targets, and
the engine sums both over the data group, which includes the ``cp`` ranks: the token-weighted mean of
one process. For the gradients the ``cp`` ranks are data ranks (:func:`wrap_mesh`): DDP or FSDP2 over
them sums the parts of every gradient each rank's tokens produced.

Why our own and not a library's: torch's ``context_parallel`` runs only SDPA's CUDA kernels (on CPU:
"aten._scaled_dot_product_flash_attention_for_cpu does not have a sharding strategy") and takes no
attention mask, so neither padded nor packed rows; accelerate's sequence parallelism (``sp_backend``) is
DeepSpeed's Ulysses and needs the DeepSpeed engine; transformers has none of its own.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.constants import IGNORE_INDEX, SHIFT_LABELS
from twinkle.mesh import DeviceMesh
from twinkle_hf.distributed import ulysses

#: the mesh dimension the sequence is split over
DIM = "cp"
#: the tasks whose outputs are per token (the pooled embedding task needs whole rows)
TASKS = ("causal_lm", "fused_lm_ce")


def wrap_mesh(mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The mesh the wrapping plan sees: the ``cp`` ranks folded into the data ranks that share the weights.

    ``cp`` ranks hold the same weights and each computes part of every gradient, exactly like data ranks:
    with ``fsdp_size > 1`` they join the fsdp dimension (FSDP2 shards over fsdp x cp, torchtitan's
    choice), otherwise the dp dimension (DDP). Ranks keep their row-major places, so the folded mesh is a
    reshape of the original one.
    """
    if mesh is None or mesh.cp_size == 1:
        return mesh
    others = {d: mesh.size(d) for d in ("tp", "pp", "ep") if mesh.size(d) > 1}
    if others:
        raise ValueError(f"TransformersModel splits sequences (cp_size={mesh.cp_size}) over data and fsdp ranks "
                         f"only; the mesh also has {others}, which sequence parallelism does not compose with yet. "
                         f"Use cp_size={mesh.cp_size} with dp/fsdp alone, or set cp_size=1.")
    if mesh.sequence_parallel:
        raise ValueError("sequence_parallel=True is Megatron's split of activations along tensor-parallel ranks; "
                         f"with cp_size={mesh.cp_size} set it to False.")
    fold = {"fsdp_size": mesh.fsdp_size * mesh.cp_size, "dp_size": mesh.dp_size} if mesh.fsdp_size > 1 \
        else {"fsdp_size": 1, "dp_size": mesh.dp_size * mesh.cp_size}
    return DeviceMesh(**fold, device_type=mesh.device_type, extra=mesh.extra, ranks=mesh.ranks)


def check_model(hf_model: torch.nn.Module, size: int) -> str:
    """The attention implementation the exchange wraps; refusals name the family, ``cp`` and what to use.

    Returns:
        ``'sdpa'`` or ``'eager'``.
    """
    config = hf_model.config
    family = getattr(config, "model_type", None) or type(hf_model).__name__
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    where = f"cp_size={size} (sequence parallelism)"
    if getattr(config, "vision_config", None) is not None:
        raise ValueError(f"{where} does not split the rows of the vision-language family {family}: its image "
                         "tokens are placed by position into whole rows. Use fsdp_size for it, with cp_size=1.")
    kinds = sorted(set(getattr(text, "layer_types", None) or ()) - {"full_attention"})
    if not kinds and getattr(text, "sliding_window", None) is not None:  # Mistral: one window for every layer
        kinds = ["sliding_attention"]
    if kinds:
        named = ", ".join(kinds)
        detail = " (Gated DeltaNet: a recurrence along the sequence)" if "linear_attention" in kinds else ""
        raise ValueError(f"{where} runs full-attention layers only; the {family} model has {named} layers{detail}, "
                         "which the head exchange does not split. Use fsdp_size for this family, with cp_size=1.")
    heads = getattr(text, "num_attention_heads", None)
    if isinstance(heads, int) and heads % size:
        raise ValueError(f"{where}: cp_size does not divide {family}'s num_attention_heads={heads} (each rank "
                         f"attends with whole heads). Pick a cp_size dividing {heads}, or use fsdp_size.")
    inner = getattr(config, "_attn_implementation", None) or "eager"
    if inner not in ulysses.INNER_IMPLEMENTATIONS:
        raise ValueError(f"{where} wraps attn_implementation {' or '.join(ulysses.INNER_IMPLEMENTATIONS)}; the "
                         f"{family} model was loaded with {inner!r}. Load it with attn_implementation='sdpa'.")
    return inner


def check_loss(loss: Any, task: str, size: int) -> None:
    """Only losses that sum over tokens can be added up over the ranks' parts of a sequence."""
    from twinkle.loss import CrossEntropyLoss

    where = f"cp_size={size} (sequence parallelism) gives each rank 1/{size} of every row"
    if task not in TASKS:
        raise ValueError(f"{where}; task={task!r} needs whole rows. Use task='causal_lm' or 'fused_lm_ce', or "
                         "cp_size=1 with fsdp_size.")
    if loss is None or getattr(loss, "task", None) == "fused_lm_ce":
        return
    if not isinstance(loss, CrossEntropyLoss) or loss.loss_reduction != "token" \
            or getattr(loss, "ignore_index", IGNORE_INDEX) != IGNORE_INDEX:
        raise ValueError(f"{where}; {type(loss).__name__} needs whole rows or sequences. Use CrossEntropyLoss "
                         "(loss_reduction='token'), ChunkedCrossEntropyLoss or the fused CE, or cp_size=1.")


@dataclass(frozen=True)
class Layout:
    """The whole (padded) rows of the current batch: what attention's mask is built from."""

    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    rows: int
    length: int


class SequenceParallel:
    """The split of one model's sequences over the ``cp`` ranks of its mesh (see the module docstring).

    Args:
        hf_model: the transformers model; its attention implementation becomes the exchange.
        mesh: twinkle's mesh, with ``cp_size > 1``.
        device_type: the torch device type of the process group's mesh.
    """

    def __init__(self, hf_model: torch.nn.Module, mesh: DeviceMesh, device_type: str) -> None:
        self.size = mesh.cp_size
        self.inner = check_model(hf_model, self.size)
        torch_mesh = mesh.to_torch(device_type, dims=("pp", "dp", "fsdp", "cp", "tp"))[DIM]
        self.group = torch_mesh.get_group()
        self.rank = torch_mesh.get_local_rank()
        self.config = hf_model.config
        self.layout: Layout | None = None
        self._masks: dict[tuple[torch.dtype, torch.device], Any] = {}
        ulysses.register()
        hf_model.set_attn_implementation(ulysses.ATTENTION_NAME)
        owner = weakref.ref(self)  # a weak reference: deep copies of the model share it instead of copying a group
        tagged = 0
        for module in hf_model.modules():
            if hasattr(module, "num_key_value_groups") or type(module).__name__.endswith("Attention"):
                setattr(module, ulysses.STATE_ATTRIBUTE, owner)
                tagged += 1
        if not tagged:
            family = getattr(self.config, "model_type", type(hf_model).__name__)
            raise ValueError(f"cp_size={self.size}: no attention module found in the {family} model; use fsdp_size.")

    # ------------------------------------------------------------ the batch
    def split(self, batch: Mapping[str, Any], loss: Any, task: str) -> dict[str, Any]:
        """This rank's part of every row of ``batch``; the labels become ``shift_labels`` (see the module docstring).

        Returns:
            A new dict; ``batch`` is unchanged.
        """
        check_loss(loss, task, self.size)
        ids = batch.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError(f"cp_size={self.size} splits input_ids of shape (rows, tokens); got "
                             f"{type(ids).__name__ if not isinstance(ids, torch.Tensor) else tuple(ids.shape)}.")
        rows, length = ids.shape
        padded = math.ceil(length / self.size) * self.size
        pad = padded - length
        per_rank = padded // self.size
        part = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        positions = batch.get("position_ids")
        if not isinstance(positions, torch.Tensor):  # what the model computes itself without them
            positions = torch.arange(length, device=ids.device).expand(rows, length)
        # the padding continues the last sequence's positions: it comes after every real token, so the
        # causal mask keeps it out of their attention, and it starts no new packed sequence
        positions = torch.cat([positions, positions[:, -1:] + torch.arange(1, pad + 1, device=ids.device)], dim=1)
        mask = batch.get("attention_mask")
        full_mask = F.pad(mask, (0, pad), value=0) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        self.layout = Layout(full_mask, positions, rows, padded)
        self._masks.clear()
        out: dict[str, Any] = {}
        for key, value in batch.items():
            if key in ("labels", "position_ids", "attention_mask"):
                continue
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == (rows, length):
                value = F.pad(value, (0, 0) * (value.dim() - 2) + (0, pad), value=0)[:, part]
            out[key] = value
        out["position_ids"] = positions[:, part]
        if full_mask is not None:
            out["attention_mask"] = full_mask[:, part]
        else:  # counts this rank's real tokens (tokens/s); attention never reads it (the layout has none)
            out["attention_mask"] = (torch.arange(padded, device=ids.device) < length).long().expand(rows, -1)[:, part]
        labels = batch.get("labels")
        if isinstance(labels, torch.Tensor):
            shifted = F.pad(labels, (0, 1 + pad), value=IGNORE_INDEX)[:, 1:]
            out[SHIFT_LABELS] = shifted[:, part]
        return out

    # ------------------------------------------------------------ attention
    def full_mask(self, like: torch.Tensor) -> Any:
        """The mask transformers builds for the whole rows under the inner implementation (cached per batch)."""
        from transformers.masking_utils import create_causal_mask

        layout = self.layout
        if layout is None or like.shape[2] != layout.length:
            raise RuntimeError(f"sequence-parallel attention got {like.shape[2]} tokens per row, but the batch split "
                               f"last was {None if layout is None else layout.length}; every forward of a "
                               "sequence-parallel model goes through TransformersModel (its batch is split there).")
        key = (like.dtype, like.device)
        if key not in self._masks:
            shape_only = torch.empty((layout.rows, layout.length, 0), dtype=like.dtype, device=like.device)
            mask = None if layout.attention_mask is None else layout.attention_mask.to(like.device)
            self._masks[key] = create_causal_mask(_ConfigView(self.config, self.inner), shape_only, mask, None,
                                                  position_ids=layout.position_ids.to(like.device))
        return self._masks[key]


class _ConfigView:
    """The model's config with the inner attention implementation (the one whose mask is built)."""

    def __init__(self, config: Any, implementation: str) -> None:
        self._config = config
        self._attn_implementation = implementation

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)
