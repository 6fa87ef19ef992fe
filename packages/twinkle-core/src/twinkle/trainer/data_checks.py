"""Checks of the Trainer's data options: a stream (``dataset.streaming``), packs (``dataset.packing`` /
``dataloader.pack_max_length``) and the stream's shuffle buffer (``dataloader.shuffle_buffer``).

:func:`check_data_options` runs with the config's own checks (before anything is loaded);
:mod:`twinkle.trainer.data_options` builds what the options ask for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


