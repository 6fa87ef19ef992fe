"""The Trainer's data options turned into the training set it iterates: a :class:`~twinkle.dataset.Dataset`,
a :class:`~twinkle.dataset.PackingDataset`, an :class:`~twinkle.dataset.IterableDataset` or an
:class:`~twinkle.dataset.IterablePackingDataset` (:func:`build_datasets`), and its DataLoader
(:func:`make_loader`). The options' checks are :mod:`twinkle.trainer.data_checks`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from twinkle.trainer.data_checks import DEFAULT_SHUFFLE_BUFFER, pack_budget

if TYPE_CHECKING:
    from twinkle.trainer.config import TrainerConfig


def build_datasets(cfg: TrainerConfig, model_id: str) -> tuple[Any, Any]:
    """The training set the data options ask for, and the evaluation set (a map-style Dataset, or None)."""
    from twinkle.dataset import PackingDataset
    from twinkle.trainer import setup

    budget = pack_budget(cfg)
    if not cfg.dataset.streaming:
        train, evals = setup.build_datasets(cfg, model_id, train_type=PackingDataset if budget else None)
        if budget is not None:
            train.pack_dataset(budget)
        return train, evals
    return build_stream(cfg, model_id, budget), build_stream_eval(cfg, model_id)


def build_stream(cfg: TrainerConfig, model_id: str, budget: int | None) -> Any:
    """The training stream: the sources concatenated (``train_samples`` each: their first rows), mapped and
    encoded as they are read, packed to ``budget`` tokens when given."""
    from twinkle.dataset import IterableDataset, IterablePackingDataset
    from twinkle.trainer import setup

    data = cfg.dataset
    if data.combine:
        sources = [(s, range(s.train_samples) if s.train_samples else None) for s in data.sources()]
    else:
        sources = [(data, setup.split_rows(cfg)[0])]
    kind = IterableDataset if budget is None else functools.partial(IterablePackingDataset,
                                                                   packing_interval=data.packing_interval)
    stream = setup.build_dataset(cfg, model_id, sources, dataset_type=kind)
    if budget is not None:
        stream.pack_dataset(budget)
    return stream


def build_stream_eval(cfg: TrainerConfig, model_id: str) -> Any:
    """Evaluation rows beside a stream: streamed as well (so a hub dataset is never downloaded whole), then held
    as a map-style Dataset (they are few, and read at every evaluation)."""
    from twinkle.dataset import DataError, Dataset, DatasetMeta, IterableDataset
    from twinkle.trainer import setup

    data = cfg.dataset
    if data.combine:
        if not (data.eval_dataset_id and data.eval_samples):
            return None
        rows = range(data.eval_samples)
    else:
        rows = setup.split_rows(cfg)[1]
        if rows is None:
            return None
    stream = setup.build_dataset(cfg, model_id, [(data, rows)], data.eval_dataset_id, dataset_type=IterableDataset)
    encoded = list(stream)
    if not encoded:
        raise DataError(f"every evaluation row ({len(rows)} asked for) was dropped while encoding; raise "
                        "dataset.max_length or change dataset.truncation_strategy.")
    return Dataset(DatasetMeta(data=encoded))


def make_loader(cfg: TrainerConfig, train_set: Any, batch_size: int) -> Any:
    """The training DataLoader; over a stream ``shuffle`` is its shuffle buffer of ``dataloader.shuffle_buffer``."""
    from twinkle.dataloader import DataLoader

    extra: dict[str, Any] = {}
    if getattr(train_set, "is_stream", False):
        buffer = cfg.dataloader.shuffle_buffer
        extra["shuffle_buffer"] = DEFAULT_SHUFFLE_BUFFER if buffer is None else buffer
    return DataLoader(train_set, batch_size=batch_size, shuffle=cfg.dataloader.shuffle, seed=cfg.seed, **extra)


def epoch_of(loader: Any, train_set: Any, hooks: Any = None) -> int | None:
    """The 1-based epoch the loader's next batch belongs to (hooks get it).

    Over a stream it is known without reading ahead while the stream is open; right after a resume
    placing the count may read the stream once to its end, so that is done only when ``hooks`` (the
    Trainer's HooksConfig) has a hook to tell it to (None then: no hook is called).
    """
    if loader.stream is not None:
        from twinkle.trainer.groups import HOOK_EVENTS

        if hooks is not None and not any(hooks.get_hooks(event) for event in HOOK_EVENTS):
            return None
        return loader.epoch + 1
    return loader.get_state()["consumed_train_samples"] // max(len(train_set), 1) + 1
