"""The Trainer's data options: a stream (``dataset.streaming``), packs (``dataset.packing`` /
``dataloader.pack_max_length``) and the stream's shuffle buffer (``dataloader.shuffle_buffer``).

:func:`check_data_options` runs with the config's own checks (before anything is loaded);
:func:`build_datasets` and :func:`make_loader` turn the options into the training set the Trainer
iterates: a :class:`~twinkle.dataset.Dataset`, a :class:`~twinkle.dataset.PackingDataset`, an
:class:`~twinkle.dataset.IterableDataset` or an :class:`~twinkle.dataset.IterablePackingDataset`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from twinkle.config import ConfigError

if TYPE_CHECKING:
    from twinkle.trainer.config import TrainerConfig

#: rows in a stream's shuffle buffer when dataloader.shuffle_buffer is unset (the DataLoader's default)
DEFAULT_SHUFFLE_BUFFER = 1000
#: DatasetConfig.packing_interval's default (IterablePackingDataset's)
DATASET_PACKING_INTERVAL = 128


def pack_budget(cfg: TrainerConfig) -> int | None:
    """Tokens per pack, or None when the rows are not packed.

    ``dataloader.pack_max_length`` (xtuner's spelling) packs to that budget; ``dataset.packing`` alone
    packs to ``dataset.max_length`` (the longest a row can be).
    """
    if cfg.dataloader.pack_max_length is not None:
        return cfg.dataloader.pack_max_length
    return cfg.dataset.encoding()[1] if cfg.dataset.packing else None


def check_data_options(cfg: TrainerConfig) -> None:
    """Refuse combinations of the data options that cannot work, naming the option and the fix."""
    data, budget = cfg.dataset, pack_budget(cfg)
    for source in data.sources():
        if source is not data and (source.streaming or source.packing):
            raise ConfigError(f"dataset.combine ({source.name or source.dataset_id}): streaming / packing apply to "
                              "all sources together; set them on the dataset group, not on one source.")
    if data.streaming and cfg.total_epoch is not None:
        raise ConfigError(f"total_epoch: {cfg.total_epoch} epochs of a stream (dataset.streaming) give no step "
                          "count, since a stream has no length; set total_step instead (e.g. --total-step 1000).",
                          option="total_epoch")
    if data.streaming:
        for source in data.sources():
            if source.sample_ratio != 1.0 or source.enable_sequential_sampler:
                raise ConfigError(f"dataset.sample_ratio: {source.sample_ratio} for "
                                  f"{source.name or source.dataset_id} needs its rows counted up front, which a "
                                  "stream (dataset.streaming) does not do; use sample_ratio 1, or turn streaming off.")
    if cfg.dataloader.shuffle_buffer is not None and not data.streaming:
        raise ConfigError(f"dataloader.shuffle_buffer: {cfg.dataloader.shuffle_buffer} applies to a stream; set "
                          "dataset.streaming true, or leave it unset (a map-style dataset is shuffled whole, see "
                          "dataloader.shuffle).")
    if data.packing_interval != DATASET_PACKING_INTERVAL and not (data.streaming and budget is not None):
        raise ConfigError(f"dataset.packing_interval: {data.packing_interval} is the buffer of a packed stream; set "
                          "dataset.streaming and dataset.packing true, or leave it unset.")
    if budget is None:
        return
    max_length = data.encoding()[1]
    if budget < max_length:
        raise ConfigError(f"dataloader.pack_max_length: {budget} tokens per pack is below dataset.max_length="
                          f"{max_length}, so a row of max_length tokens would fit in no pack; raise pack_max_length "
                          "or lower dataset.max_length.")
    if cfg.loss.loss_reduction != "token":
        raise ConfigError(f"loss.loss_reduction: {cfg.loss.loss_reduction!r} weights each row of a padded batch; the "
                          "rows of a pack (dataset.packing / dataloader.pack_max_length) cannot be told apart: use "
                          "loss_reduction token, or turn packing off.")


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
    """Evaluation rows beside a stream: read into a map-style Dataset (they are few and read every eval)."""
    from twinkle.trainer import setup

    data = cfg.dataset
    if data.combine:
        if not (data.eval_dataset_id and data.eval_samples):
            return None
        return setup.build_dataset(cfg, model_id, [(data, range(data.eval_samples))], data.eval_dataset_id)
    rows = setup.split_rows(cfg)[1]
    return setup.build_dataset(cfg, model_id, [(data, rows)], data.eval_dataset_id) if rows is not None else None


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
