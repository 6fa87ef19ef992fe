"""Dataset: one or more sources (HF ``datasets`` underneath), preprocessed, mixed and encoded in place.

Every operation builds the new Arrow table first and swaps it in only when it succeeded, so a
failing ``map``/``encode`` leaves the Dataset as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from twinkle.dataset import transforms
from twinkle.dataset.batched import PROBE_ROWS, BatchCall
from twinkle.dataset.errors import DataError
from twinkle.dataset.loading import load_source
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packing import GROUP_COLUMN
from twinkle.dataset.save import save_rows
from twinkle.dataset.steps import map_step
from twinkle.registry import resolve

if TYPE_CHECKING:
    import datasets

    from twinkle.template import Template


class Dataset:
    """Rows for training. See docs/data.md for the whole data path.

    ``Dataset(DatasetMeta('twinkle://self-cognition', data_slice=range(100)))`` loads one source;
    :meth:`add_dataset` adds more, :meth:`mix_dataset` says how they combine (concatenated until
    it is called; ``mix_dataset()`` interleaves, as upstream Twinkle's). :meth:`map`, :meth:`filter` and
    :meth:`encode` act on every source, or on the one named by ``dataset_meta=``. ``load_kwargs`` go to
    ``datasets.load_dataset``.
    """

    def __init__(self, dataset_meta: DatasetMeta | str | None = None, **load_kwargs: Any) -> None:
        self._parts: dict[str, datasets.Dataset] = {}
        self._metas: dict[str, DatasetMeta] = {}
        self._mix: dict[str, Any] = {"interleave": False}
        self._combined: datasets.Dataset | None = None
        self._load_kwargs = load_kwargs
        self.template: Template | None = None
        if dataset_meta is not None:
            self.add_dataset(dataset_meta)

    # ------------------------------------------------------------- sources
    def add_dataset(self, dataset_meta: DatasetMeta | str, **load_kwargs: Any) -> Dataset:
        """Load another source; it joins the others as :meth:`mix_dataset` says."""
        meta = DatasetMeta(dataset_meta) if isinstance(dataset_meta, str) else dataset_meta
        if not isinstance(meta, DatasetMeta):
            raise TypeError(f"add_dataset expects a DatasetMeta (or an id string), got {type(meta).__name__}.")
        key = meta.get_id()
        if key in self._parts:
            raise DataError(f"{meta.describe()} (subset {meta.subset_name!r}, split {meta.split!r}) was already added.")
        self._parts[key] = load_source(meta, **{**self._load_kwargs, **load_kwargs})
        self._metas[key] = meta
        self._combined = None
        return self

    def mix_dataset(
        self,
        interleave: bool = True,
        weights: Sequence[float] | None = None,
        seed: int = 42,
        stopping_strategy: str = "first_exhausted",
    ) -> Dataset:
        """Combine the sources: interleaved (``weights`` = sampling probabilities), or concatenated in order.

        Interleaving follows ``datasets.interleave_datasets``: ``stopping_strategy='first_exhausted'``
        stops when one source runs out, ``'all_exhausted'`` oversamples until all have been seen.
        Without a call the sources are concatenated (upstream Twinkle reads only the first then).

        Args:
            interleave: ``True`` (upstream Twinkle's default): round robin, or drawn with ``weights``;
                ``False``: every row of each source in turn.
            weights: one sampling weight per source (interleaving only).
            seed: seeds the weighted draws.
            stopping_strategy: ``'first_exhausted'`` or ``'all_exhausted'``.
        """
        streamed = [m.describe() for k, m in self._metas.items() if not hasattr(self._parts[k], "__len__")]
        if streamed:
            raise DataError(f"All datasets must be all streaming or all map-style: {', '.join(streamed)} was loaded "
                            "with streaming=True. A Dataset holds whole tables; stream every source with "
                            "twinkle.dataset.IterableDataset instead.")
        if weights is not None:
            weights = [float(w) for w in weights]
            if len(weights) != len(self._parts):
                raise DataError(f"mix_dataset got {len(weights)} weights for {len(self._parts)} sources.")
            if any(w < 0 for w in weights) or sum(weights) <= 0:
                raise DataError(f"mix_dataset weights must be >= 0 with a positive sum, got {weights}.")
            if not interleave:
                raise DataError("weights only apply when interleave=True; concatenation takes every row once.")
        self._mix = {"interleave": bool(interleave), "weights": weights, "seed": seed,
                     "stopping_strategy": stopping_strategy}
        self._combined = None
        return self

    @property
    def hf_dataset(self) -> datasets.Dataset:
        """The combined rows as one ``datasets.Dataset``."""
        if self._combined is None:
            self._combined = self._combine()
        return self._combined

    def _combine(self) -> datasets.Dataset:
        import datasets

        from twinkle.multimodal.media import with_media_columns

        parts = list(self._parts.values())
        if not parts:
            raise DataError("This Dataset has no source; pass Dataset(DatasetMeta(...)) or call add_dataset().")
        if len(parts) == 1:
            return parts[0]
        parts = with_media_columns(parts)  # text-only sources mix with image/video ones
        columns = {f"source {n} ({meta.describe()})": sorted(p.column_names)
                   for n, (meta, p) in enumerate(zip(self._metas.values(), parts))}
        hint = ("Map each source to the standard format first (dataset.map(processor, dataset_meta=meta)) and encode "
                "them the same way.")
        # sources with different columns combine over the union (a column a source lacks reads None), as
        # datasets and upstream Twinkle combine them; encode() still requires 'messages' of every source
        if self._mix["interleave"] and any(GROUP_COLUMN in part.column_names for part in parts):
            raise DataError(f"Cannot interleave sources whose rows carry {GROUP_COLUMN!r} (preference pairs, groups): "
                            "interleaving row by row would separate a group's rows. Concatenate them "
                            "(mix_dataset(interleave=False)), or interleave an IterableDataset, which mixes the raw "
                            "rows before encoding them.")
        try:
            if self._mix["interleave"]:
                weights = self._mix["weights"]
                probs = [w / sum(weights) for w in weights] if weights else None
                return datasets.interleave_datasets(parts, probabilities=probs, seed=self._mix["seed"],
                                                    stopping_strategy=self._mix["stopping_strategy"])
            return datasets.concatenate_datasets(parts)
        except ValueError as exc:
            raise DataError(f"Cannot combine the sources: {exc}. Their columns: {columns}. {hint}") from exc

    # ---------------------------------------------------------- transforms
    def map(
        self,
        preprocessor: Any,
        dataset_meta: DatasetMeta | None = None,
        *,
        init_args: dict[str, Any] | None = None,
        strict: bool = True,
        num_proc: int | None = None,
        batch_size: int = 1000,
        batched: bool | None = None,
        remove_columns: Sequence[str] = (),
        **map_kwargs: Any,
    ) -> Dataset:
        """Apply a preprocessor (instance, class, registered name) or a plain function to every row.

        A :class:`~twinkle.preprocessor.Preprocessor` replaces each row with the standard
        conversation; a bad row raises naming the row, or with ``strict=False`` is skipped and
        counted in a warning. A plain function ``fn(row) -> dict`` updates columns like
        ``datasets.map``. ``map_kwargs`` go to ``datasets.Dataset.map``; results are recomputed unless
        ``load_from_cache_file=True`` (a cached result could predate a code change).

        Args:
            batched: ``True``: ``fn`` takes a dict of columns and returns one (upstream Twinkle's and
                ``datasets``' batched convention); it may return fewer or more rows than it got, and
                then must return every column to keep (others go with ``remove_columns``).
                ``False``: ``fn`` takes one row. ``None`` (default): probed on the first rows; a
                function that reads both ways differently is refused with a message naming it.
            remove_columns: input columns a batched function's output drops.
        """
        proc = _instantiate(resolve("preprocessor", preprocessor), init_args or {}, "preprocessor")
        if not callable(proc):
            raise TypeError(f"map() needs a callable preprocessor, got {type(proc).__name__}.")
        name = type(proc).__name__ if hasattr(proc, "output_features") else getattr(proc, "__name__", "function")
        updated = {}
        for key in self._keys(dataset_meta):
            ds = self._parts[key]
            if hasattr(proc, "output_features"):
                import datasets

                features = datasets.Features({**transforms.preprocess_features(proc, ds.features),
                                              transforms.DROP_COLUMN: datasets.Value("string")})
                fn = transforms.PreprocessBatch(proc, [c for c in features if c != transforms.DROP_COLUMN], strict)
                out = ds.map(fn, batched=True, with_indices=True, batch_size=batch_size, remove_columns=ds.column_names,
                             features=features, num_proc=num_proc, desc=f"twinkle map {name}",
                             **{"load_from_cache_file": False, **map_kwargs})
                out = transforms.drop_marked(out, f"map({name}) on {self._metas[key].describe()}", num_proc)
            else:
                step = map_step(proc, batched, self._probe_rows(ds), source=None, strict=strict,
                                remove_columns=remove_columns)
                if step.kind == "batched":
                    out = ds.map(BatchCall(proc, remove_columns), batched=True, with_indices=True,
                                 batch_size=batch_size, remove_columns=ds.column_names, num_proc=num_proc,
                                 **{"load_from_cache_file": False, **map_kwargs})
                else:
                    out = ds.map(transforms.RowCall(proc, "map"), with_indices=True, num_proc=num_proc,
                                 **{"load_from_cache_file": False, **map_kwargs})
            updated[key] = out
        self._replace(updated)
        return self

    @staticmethod
    def _probe_rows(ds: Any) -> list[dict[str, Any]]:
        return transforms.to_rows(ds[:PROBE_ROWS]) if len(ds) else []

    def filter(self, fn: Callable[[dict[str, Any]], bool], dataset_meta: DatasetMeta | None = None, *,
               num_proc: int | None = None, **filter_kwargs: Any) -> Dataset:
        """Keep the rows for which ``fn(row)`` is true."""
        if not callable(fn):
            raise TypeError(f"filter() needs a callable fn(row) -> bool, got {type(fn).__name__}.")
        kwargs = {"load_from_cache_file": False, **filter_kwargs}
        self._replace({key: self._parts[key].filter(transforms.RowCall(fn, "filter"), with_indices=True,
                                                     num_proc=num_proc, **kwargs)
                       for key in self._keys(dataset_meta)})
        return self

    def set_template(
        self,
        template_cls: Any,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str | None = "raise",
        **kwargs: Any,
    ) -> Template:
        """Choose how :meth:`encode` renders and labels rows (a Template class, instance or registered name).

        Only records the choice (and checks the arguments); the tokenizer loads at :meth:`encode`.
        """
        self.template = build_template(template_cls, model_id, max_length, truncation_strategy, **kwargs)
        return self.template

    def encode(self, num_proc: int | None = None, batch_size: int = 1000, **map_kwargs: Any) -> Dataset:
        """Tokenize every conversation with the template set by :meth:`set_template`.

        The result holds only ``input_ids``, ``labels``, ``attention_mask``, ``position_ids`` and
        ``length`` (a VL template keeps the rows' ``images``/``videos`` too, as paths/bytes). Rows
        dropped by ``truncation_strategy='delete'`` (or left with no trained token) are counted in a
        warning. Pass ``load_from_cache_file=True`` to reuse a cached encoding (keyed by the source,
        the tokenizer, the chat template and the template settings).

        Preference rows (``chosen`` and ``rejected`` columns beside ``messages`` or ``prompt``) encode to
        two rows each, chosen then rejected (``Template.encode_preference``), sharing a ``group_id``; a
        ``group_id`` column of the rows is kept. Packing keeps a group's rows together.
        """
        from datasets.fingerprint import Hasher

        if self.template is None:
            raise DataError(
                "encode() needs a template: call dataset.set_template('Qwen3Template', model_id=...) first."
            )
        template = self.template
        template_fp = template.fingerprint()  # also loads the tokenizer once, before any worker forks
        updated = {}
        for key, ds in self._parts.items():
            preference = transforms.is_preference(ds.column_names)
            if "messages" not in ds.column_names and not (preference and "prompt" in ds.column_names):
                raise DataError(
                    f"{self._metas[key].describe()} has columns {ds.column_names}, not 'messages'. Map it to the "
                    "standard format first, e.g. dataset.map(MessagesProcessor()) or dataset.map(AlpacaProcessor())."
                )
            out = ds.map(transforms.EncodeBatch(template), batched=True, with_indices=True, batch_size=batch_size,
                         remove_columns=ds.column_names, features=transforms.encoded_features(template, ds.features),
                         num_proc=num_proc,
                         new_fingerprint=Hasher.hash([ds._fingerprint, template_fp, "twinkle-encode"]),
                         desc="twinkle encode", **{"load_from_cache_file": False, **map_kwargs})
            out = transforms.drop_marked(out, f"encode() of {self._metas[key].describe()}", num_proc)
            if len(out) == 0:
                raise DataError(f"encode() dropped every row of {self._metas[key].describe()} (see the warning above); "
                                "raise max_length or change truncation_strategy.")
            updated[key] = out
        self._replace(updated)
        return self

    def _keys(self, dataset_meta: DatasetMeta | None) -> list[str]:
        if not self._parts:
            raise DataError("This Dataset has no source; pass Dataset(DatasetMeta(...)) or call add_dataset().")
        if dataset_meta is None:
            return list(self._parts)
        key = dataset_meta.get_id()
        if key not in self._parts:
            raise DataError(f"{dataset_meta.describe()} is not a source of this Dataset; sources: "
                            f"{[m.describe() for m in self._metas.values()]}.")
        return [key]

    def _replace(self, updated: dict[str, datasets.Dataset]) -> None:
        self._parts.update(updated)
        self._combined = None

    # -------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.hf_dataset)

    def __getitem__(self, index: int | slice | Sequence[int]) -> dict[str, Any] | list[dict[str, Any]]:
        """One row (a dict) for an int; a list of row dicts for a slice or a list of indices."""
        if isinstance(index, slice):
            return self.get_rows(range(*index.indices(len(self))))
        if isinstance(index, Sequence) and not isinstance(index, str):
            return self.get_rows(index)
        return self.hf_dataset[int(index)]

    def get_rows(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Rows at ``indices`` in that order (one Arrow gather)."""
        indices = list(indices)
        if not indices:
            return []
        return transforms.to_rows(self.hf_dataset[indices])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.hf_dataset)

    def save_as(self, output_path: str, format: str | None = None, batch_size: int = 1000) -> str:
        """Write the rows as they are now (raw, mapped or encoded) to a jsonl / parquet / csv file.

        Args:
            output_path: the file; its suffix gives the format unless ``format`` is given.
            format: ``'jsonl'`` (``'json'``), ``'parquet'`` or ``'csv'`` (flat columns only).
            batch_size: rows held in memory per write.

        Returns:
            The path written. Load it back with ``Dataset(DatasetMeta(path))``.
        """
        return save_rows(iter(self), output_path, format, batch_size)

    @property
    def column_names(self) -> list[str]:
        return self.hf_dataset.column_names

    @property
    def dataset(self) -> datasets.Dataset:
        """The combined rows (upstream Twinkle's name for :attr:`hf_dataset`)."""
        return self.hf_dataset

    @property
    def datasets(self) -> dict[str, datasets.Dataset]:
        """Each source's rows as it is now (mapped, encoded), by the source's id (a copy of the mapping)."""
        return dict(self._parts)

    def __repr__(self) -> str:
        sources = ", ".join(m.describe() for m in self._metas.values()) or "no source"
        size = len(self._combined) if self._combined is not None else sum(len(p) for p in self._parts.values())
        return f"Dataset({sources}; {size} rows; template={self.template!r})"


def _instantiate(obj: Any, init_args: dict[str, Any], kind: str) -> Any:
    """A class becomes an instance (with ``init_args``); an instance or function is used as is."""
    if isinstance(obj, type):
        return obj(**init_args)
    if init_args:
        raise ValueError(f"init_args were given but the {kind} is already an instance: {obj!r}.")
    return obj


def build_template(template_cls: Any, model_id: str | None = None, max_length: int | None = None,
                   truncation_strategy: str | None = "raise", **kwargs: Any) -> Template:
    """A Template from a class, instance or registered name (what every dataset's ``set_template`` takes)."""
    template = resolve("template", template_cls)
    if isinstance(template, type):
        template = template(model_id=model_id, max_length=max_length,
                            truncation_strategy=truncation_strategy or "raise", **kwargs)
    elif model_id is not None or max_length is not None or kwargs:
        raise ValueError("set_template got a Template instance and settings; set them on the instance instead.")
    if not hasattr(template, "batch_encode"):
        raise TypeError(f"{type(template).__name__} is not a Template (it has no batch_encode).")
    return template
