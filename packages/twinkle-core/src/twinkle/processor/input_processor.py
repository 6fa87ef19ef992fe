"""InputProcessor: a list of encoded rows -> the tensor dict a causal LM's forward takes.

Padded (default): ``input_ids``/``labels``/``attention_mask``/``position_ids`` of shape
``(batch, longest)``; pads are ``pad_token_id``, label -100, mask 0, position 0.

Packed (``padding_free=True``): every row concatenated into one row of shape ``(1, total)``;
``position_ids`` restart at 0 for each sequence (a row that is already a pack, from
``PackingDataset``, keeps its own restarts) and there is no ``attention_mask`` — the
convention of HF's ``DataCollatorWithFlattening``, which transformers turns into per-sequence
attention (varlen FlashAttention, or a block-diagonal mask for sdpa/eager). The first label of
every sequence is -100 so no position learns to predict across a sequence boundary.

Rows with images/videos (from a VL template) are padded and get their vision inputs from a
media collator (``InputProcessor.for_template(vl_template)``); families that cannot pack refuse
``padding_free`` with the reason.

Per-token fields of RL rows (:data:`TOKEN_FIELDS`: ``target_tokens``, ``weights``, sampling
``logprobs``, ``advantages``, ``ref_logprobs``, ``completion_mask``, one value per input token) are
padded with 0 or concatenated the same way, so rollouts batch like SFT rows. Rows that already carry
their vision tensors (``pixel_values``, ``image_grid_thw``, and the video pair) have them
concatenated along the first dimension.

:meth:`InputProcessor.collate_fn` is upstream Twinkle's form: a list of micro-batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.constants import IGNORE_INDEX
from twinkle.dataset.errors import DataError
from twinkle.multimodal.media import has_media

PADDING_SIDES = ("right", "left")
#: per-token fields carried along input_ids (padding value 0); the others are floats
TOKEN_FIELDS = ("target_tokens", "weights", "logprobs", "advantages", "ref_logprobs", "completion_mask")
_INT_FIELDS = ("target_tokens", "completion_mask")
#: vision inputs a row may already carry (from a model's own processor): concatenated, not padded
VISION_TENSORS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


class InputProcessor:
    """Collate encoded rows (``Template`` output) into tensors, padded or packed, optionally on ``device``.

    ``pad_token_id`` defaults to 0 (the embedded tokenizer's pad); the pad value never matters for
    the loss since pads are masked and labelled -100. ``InputProcessor.for_template(t)`` takes it
    from a template's tokenizer.
    """

    def __init__(
        self,
        padding_free: bool = False,
        pad_token_id: int | None = None,
        padding_side: str = "right",
        device: Any = None,
        pad_to_multiple_of: int | None = None,
        media_collator: Any = None,
    ) -> None:
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side={padding_side!r}; choose 'right' or 'left'.")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}.")
        self.padding_free = padding_free
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.padding_side = padding_side
        self.device = device
        self.pad_to_multiple_of = pad_to_multiple_of
        self.media_collator = media_collator

    @classmethod
    def for_template(cls, template: Any, **kwargs: Any) -> InputProcessor:
        """Padding id from the template's tokenizer; a VL template also gives the media collator."""
        collator = getattr(template, "media_collator", None)
        if callable(collator) and "media_collator" not in kwargs:
            kwargs["media_collator"] = collator()
        return cls(pad_token_id=template.pad_token_id, **kwargs)

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return self._collate(rows)

    def collate_fn(self, rows: Sequence[Mapping[str, Any]], micro_batch_size: int | None = None,
                   variable_seq_lengths: bool = False) -> list[dict[str, Any]]:
        """The rows as a list of collated micro-batches (upstream Twinkle's form).

        Args:
            rows: encoded rows (lists, numpy arrays or tensors).
            micro_batch_size: rows per micro-batch; ``None``: one batch of every row.
            variable_seq_lengths: each micro-batch padded to its own longest row; ``False``: every
                micro-batch padded to the longest row of all (packed micro-batches are always their own
                length).

        Returns:
            The micro-batches in row order (the last one holds the remainder).
        """
        if micro_batch_size is None:
            return [self._collate(rows)]
        if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be a positive int or None, got {micro_batch_size!r}.")
        seqs = self._check(rows)
        width = None if variable_seq_lengths or self.padding_free else max(len(ids) for ids, _ in seqs)
        return [self._collate(rows[i:i + micro_batch_size], width) for i in range(0, len(rows), micro_batch_size)]

    def _collate(self, rows: Sequence[Mapping[str, Any]], width: int | None = None) -> dict[str, Any]:
        seqs = self._check(rows)
        positions = self._positions(rows, seqs)
        width = max([len(ids) for ids, _ in seqs] + [width or 0])
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        if self.media_collator is not None or _has_media(rows):
            batch = self._multimodal(rows, seqs, width)
        else:
            batch = self._pack(seqs, positions) if self.padding_free else self._pad(seqs, width)
            batch.update(_vision_tensors(rows))
        batch.update(self._token_fields(rows, [len(ids) for ids, _ in seqs], width))
        if self.device is not None:
            batch = {k: v.to(self.device) for k, v in batch.items()}
        return batch

    def _check(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[list[int], list[int] | None]]:
        if isinstance(rows, Mapping) or not isinstance(rows, Sequence) or len(rows) == 0:
            raise DataError(f"InputProcessor needs a non-empty list of encoded rows, got {type(rows).__name__}.")
        seqs = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping) or "input_ids" not in row:
                fields = list(row) if isinstance(row, Mapping) else type(row).__name__
                raise DataError(f"row {i} of the batch has no 'input_ids' (got {fields}); encode the dataset with a "
                                "template first (dataset.set_template(...); dataset.encode()).")
            ids = [int(x) for x in row["input_ids"]]
            if not ids:
                raise DataError(f"row {i} of the batch has empty input_ids.")
            labels = row.get("labels")
            if labels is not None:
                labels = [int(x) for x in labels]
                if len(labels) != len(ids):
                    raise DataError(f"row {i}: {len(labels)} labels for {len(ids)} input_ids.")
            seqs.append((ids, labels))
        if len({labels is None for _, labels in seqs}) > 1:
            raise DataError("some rows of the batch have labels and some do not; encode them the same way.")
        return seqs

    def _positions(self, rows: Sequence[Mapping[str, Any]], seqs: list[tuple[list[int], list[int] | None]]
                   ) -> list[list[int]]:
        """Each row's position ids: its own ``position_ids`` (a pack's restart at every packed row), else 0..n-1."""
        out = []
        for i, (row, (ids, _)) in enumerate(zip(rows, seqs)):
            given = row.get("position_ids") if isinstance(row, Mapping) else None
            if given is None:
                out.append(list(range(len(ids))))
                continue
            pos = [int(p) for p in given]
            if len(pos) != len(ids) or pos[0] != 0:
                raise DataError(f"row {i}: position_ids must start at 0 and give one value per input_id "
                                f"({len(pos)} for {len(ids)}).")
            if not self.padding_free and 0 in pos[1:]:
                raise DataError(f"row {i} is a pack (its position_ids restart at 0 inside the row); packs need "
                                "InputProcessor(padding_free=True), which keeps attention and labels within each "
                                "packed sequence.")
            out.append(pos)
        return out

    def _token_fields(self, rows: Sequence[Mapping[str, Any]], lengths: list[int], width: int) -> dict[str, Any]:
        """The rows' per-token fields, padded like input_ids (0) to ``width`` or concatenated when packing."""
        import torch

        present = [tuple(k for k in TOKEN_FIELDS if k in row) for row in rows]
        if len(set(present)) > 1:
            raise DataError(f"rows of the batch carry different per-token fields ({sorted(set(present))}); give every "
                            "row the same ones.")
        out = {}
        for key in present[0]:
            cols = []
            for i, (row, n) in enumerate(zip(rows, lengths)):
                values = row[key].tolist() if hasattr(row[key], "tolist") else list(row[key])
                if len(values) != n:
                    raise DataError(f"row {i}: {len(values)} values of {key!r} for {n} input_ids (one per token).")
                pad = [0] * (0 if self.padding_free else width - n)
                cols.append(values + pad if self.padding_side == "right" else pad + values)
            if self.padding_free:
                cols = [[v for col in cols for v in col]]
            out[key] = torch.tensor(cols, dtype=torch.long if key in _INT_FIELDS else torch.float32)
        return out

    def _pad(self, seqs: list[tuple[list[int], list[int] | None]], width: int) -> dict[str, Any]:
        import torch

        with_labels = seqs[0][1] is not None
        cols: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "position_ids": []}
        if with_labels:
            cols["labels"] = []
        for ids, labels in seqs:
            n, pad = len(ids), width - len(ids)
            parts = {"input_ids": (ids, self.pad_token_id), "attention_mask": ([1] * n, 0),
                     "position_ids": (list(range(n)), 0)}
            if with_labels:
                parts["labels"] = (labels, IGNORE_INDEX)
            for key, (values, fill) in parts.items():
                cols[key].append(values + [fill] * pad if self.padding_side == "right" else [fill] * pad + values)
        return {k: torch.tensor(v, dtype=torch.long) for k, v in cols.items()}

    def _pack(self, seqs: list[tuple[list[int], list[int] | None]], positions: list[list[int]]) -> dict[str, Any]:
        import torch

        ids_all: list[int] = []
        pos_all: list[int] = []
        labels_all: list[int] = []
        for (ids, labels), pos in zip(seqs, positions):
            ids_all += ids
            pos_all += pos
            if labels is not None:
                # a sequence's first label would be predicted from the previous sequence's last token
                labels_all += [IGNORE_INDEX if p == 0 else label for p, label in zip(pos, labels)]
        batch = {"input_ids": torch.tensor([ids_all], dtype=torch.long),
                 "position_ids": torch.tensor([pos_all], dtype=torch.long)}
        if seqs[0][1] is not None:
            batch["labels"] = torch.tensor([labels_all], dtype=torch.long)
        return batch

    def _multimodal(self, rows: Sequence[Mapping[str, Any]], seqs: list[tuple[list[int], list[int] | None]],
                    width: int) -> dict[str, Any]:
        """Padded token rows plus the vision inputs of their images/videos (see twinkle.multimodal.collate).

        No ``position_ids``: vision-language models derive their (multimodal rotary) positions from
        the tokens and the image grids themselves.
        """
        if self.media_collator is None:
            raise DataError("the batch has rows with images or videos, but this InputProcessor has no media "
                            "collator: build it with InputProcessor.for_template(<a VL template>) (the model "
                            "does this when its group has the template: model.set_template('Qwen2_5VLTemplate', "
                            "model_id=...)).")
        if self.padding_free:
            raise DataError(self.media_collator.packing_refusal or "this model family cannot pack multimodal rows; "
                            "use padding_free=False.")
        batch = self._pad(seqs, width)
        batch.pop("position_ids")
        batch.update(self.media_collator(rows, batch["input_ids"]))
        return batch

    def __repr__(self) -> str:
        return (f"InputProcessor(padding_free={self.padding_free}, pad_token_id={self.pad_token_id}, "
                f"padding_side={self.padding_side!r}, device={self.device!r})")


def _vision_tensors(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The rows' ready-made vision inputs, concatenated along the first dimension.

    A row's tensor with a leading dimension of 1 (a batch of one, as a model's processor returns it)
    loses it first, and a 1-D grid becomes one row, as upstream Twinkle collates them.
    """
    import torch

    out = {}
    for key in VISION_TENSORS:
        values = [torch.as_tensor(row[key]) for row in rows if row.get(key) is not None]
        if not values:
            continue
        values = [v.squeeze(0) if v.dim() > 1 and v.shape[0] == 1 else v for v in values]
        out[key] = torch.cat([v.unsqueeze(0) if v.dim() == 1 else v for v in values], dim=0)
    return out


def _has_media(rows: Sequence[Mapping[str, Any]]) -> bool:
    return any(isinstance(row, Mapping) and has_media(row) for row in rows)
