"""The Trainer's data options: packed rows (``--dataset.packing``), a stream (``dataset.streaming``) with its
shuffle buffer, and the combinations refused before anything is loaded."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trainer_testing import REPO, assert_bitwise_equal, cli_env, load_weights, write_config

sys.path.insert(0, str(REPO / "tests"))
from rounding import tiny_qwen  # noqa: E402

ROWS, MAX_LENGTH = 16, 128


def _losses(work_dir: Path) -> dict[int, float]:
    lines = (work_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twinkle.cli.main", "train", "--no-progress-bar", *args],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("options", "named"), [
    ({"total_step": 2, "dataloader": {"shuffle_buffer": 10}}, "dataloader.shuffle_buffer: 10 applies to a stream"),
    ({"total_step": 2, "dataloader": {"pack_max_length": 100}}, "dataloader.pack_max_length: 100 tokens per pack"),
    ({"total_step": 2, "dataset": {"packing": True}, "loss": {"loss_reduction": "square"}},
     "loss.loss_reduction: 'square'"),
    ({"total_step": 2, "dataset": {"packing_interval": 8, "packing": True}}, "dataset.packing_interval: 8"),
    ({"total_step": 2, "dataset": {"streaming": True, "sample_ratio": 2.0}}, "dataset.sample_ratio: 2.0"),
])
def test_bad_combinations_are_refused_before_anything_loads(tmp_path: Path, options: dict[str, Any],
                                                            named: str) -> None:
    from twinkle.config import ConfigError
    from twinkle.trainer import Trainer

    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(".", r"\.")):
        Trainer(work_dir=str(tmp_path / "w"), **options)
    assert not (tmp_path / "w").exists()  # refused while the config was built: nothing was created


class StopAt:
    """An after_train_step hook that asks its Trainer to stop (as Ctrl-C does: a checkpoint, then the end)."""

    def __init__(self, step: int) -> None:
        self.step, self.trainer = step, None

    def connect_trainer(self, trainer: Any) -> None:
        self.trainer = trainer

    def __call__(self, step: int, **_: Any) -> None:
        if step == self.step:
            self.trainer.request_stop()


def test_epochs_of_a_stream_train_and_resume_across_the_epoch_boundary(tmp_path: Path) -> None:
    """total_epoch over a stream: its batches per epoch are counted (here by one pass of map + encode, since
    encode may drop rows), each epoch reshuffles its buffer, and a run stopped in the second epoch and
    auto-resumed from its saved stream position ends with bitwise the weights of the uninterrupted run."""
    from twinkle.trainer import Trainer

    job = {"total_epoch": 2, "global_batch_size": 4, "progress_bar": False, "checkpoint_interval": 100,
           "dataset": {"train_samples": 13, "max_length": MAX_LENGTH, "streaming": True},
           "dataloader": {"shuffle_buffer": 6}, "optimizer": {"name": "SGD", "lr": 0.5}, "lr": {"scheduler": None}}
    whole = Trainer(work_dir=str(tmp_path / "whole"), **job).fit()
    assert whole.step == whole.total_step == 2 * (13 // 4)  # 3 full batches an epoch; the last row is left
    parts = tmp_path / "parts"
    first = Trainer(work_dir=str(parts), hooks={"after_train_step": StopAt(4)}, **job).fit()
    assert first.step == 4 and first.interrupted
    state = json.loads((parts / "checkpoints" / "step-00000004" / "trainer.json").read_text())
    assert state["stream_position"][0] == 1 and state["consumed_train_samples"] == 16  # inside epoch 2
    second = Trainer(work_dir=str(parts), auto_resume=True, **job).fit()
    assert second.step == 6 and second.resumed_from.endswith("step-00000004")
    name = "checkpoints/step-00000006/model"
    assert_bitwise_equal(load_weights(parts / name), load_weights(tmp_path / "whole" / name))
    whole_losses = _losses(tmp_path / "whole")
    assert _losses(parts) == whole_losses and len(set(whole_losses.values())) == 6


def test_packed_cli_run_has_the_loss_per_token_and_update_of_the_unpacked_run(tmp_path: Path) -> None:
    """One SGD step over all ``ROWS`` rows: as packs (``twinkle train --dataset.packing true``) and padded.

    Both steps see the same rows and the same weights; per token the loss is the same sum divided by the
    same count, so they differ only in the order of their float32 sums: rounding.py's step bound (rows of at
    most MAX_LENGTH tokens; a pack's attention spans at most MAX_LENGTH too) bounds the loss and each
    weight-update norm. The zero-initialised LoRA A matrices get exactly zero gradient in both.
    """
    import torch

    from twinkle.launch import TINY_MODEL
    from twinkle.trainer import Trainer, TrainerConfig
    from twinkle.trainer.data_options import build_datasets

    common = {"total_step": 1, "dataset": {"train_samples": ROWS, "max_length": MAX_LENGTH},
              "optimizer": {"name": "SGD", "lr": 0.5}, "lr": {"scheduler": None}, "progress_bar": False}
    packed_cfg = TrainerConfig.from_dict({**common, "dataset": {**common["dataset"], "packing": True}})
    packs = len(build_datasets(packed_cfg, TINY_MODEL)[0])
    assert 1 < packs < ROWS  # rows were really packed together, into more than one pack

    proc = _cli(tmp_path, "--dataset.packing", "true", "--total-step", "1", "--global-batch-size", str(packs),
                "--dataset.train-samples", str(ROWS), "--dataset.max-length", str(MAX_LENGTH),
                "--optimizer.name", "SGD", "--optimizer.lr", "0.5", "--lr.scheduler", "none",
                "--work-dir", "packed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"packed {ROWS} rows into {packs} packs" in proc.stderr + proc.stdout
    Trainer(work_dir=str(tmp_path / "padded"), global_batch_size=ROWS, **common).fit()

    # the packs of a micro-batch are concatenated into one row: its softmax sums run over up to that many
    # positions (the masked ones add exact zeros), the loss over the same ROWS x MAX_LENGTH tokens at most
    bound = dataclasses.replace(tiny_qwen(packs * MAX_LENGTH, 1), tokens=ROWS * MAX_LENGTH).step_bound()
    packed_loss, padded_loss = _losses(tmp_path / "packed")[1], _losses(tmp_path / "padded")[1]
    assert packed_loss == pytest.approx(padded_loss, rel=bound, abs=0)
    packed = load_weights(tmp_path / "packed" / "checkpoints" / "step-00000001" / "model")
    padded = load_weights(tmp_path / "padded" / "checkpoints" / "step-00000001" / "model")
    assert sorted(packed) == sorted(padded)
    moved = 0
    for key in packed:
        if "lora_A" in key:  # the seeded init; its gradient is exactly zero while B is zero
            assert torch.equal(packed[key], padded[key]), key
            continue
        # B starts at zero, so after one SGD step it is the update itself: -lr * gradient
        a, b = packed[key].norm().item(), padded[key].norm().item()
        assert b > 0, key
        moved += 1
        assert a == pytest.approx(b, rel=bound, abs=0), key
    assert moved >= 8  # the B matrices of every adapted layer moved


def test_packed_stream_from_yaml_auto_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    """A YAML job streaming the rows through a seeded shuffle buffer into packs: stopped after 2 steps and
    auto-resumed, it ends with bitwise the weights (and step losses) of one uninterrupted run of 5 steps
    (same machine, same process layout: the same float operations). 5 steps cross an epoch of the stream."""
    from twinkle.trainer import Trainer, TrainerConfig

    job = {"total_step": 5, "global_batch_size": 1, "progress_bar": False, "checkpoint_interval": 1,
           "dataset": {"train_samples": ROWS, "max_length": MAX_LENGTH, "streaming": True, "packing": True,
                       "packing_interval": 8},
           "dataloader": {"shuffle_buffer": 8}, "optimizer": {"name": "SGD", "lr": 0.5}, "lr": {"scheduler": None}}
    config = write_config(tmp_path / "job.yaml", job)
    whole = Trainer.from_config(TrainerConfig.from_file(config, {"work_dir": str(tmp_path / "whole")})).fit()
    assert whole.step == 5
    parts = tmp_path / "parts"
    first = Trainer.from_config(TrainerConfig.from_file(config, {"work_dir": str(parts), "total_step": "2"})).fit()
    assert first.step == 2
    second = Trainer.from_config(TrainerConfig.from_file(config, {"work_dir": str(parts), "auto_resume": "true"})).fit()
    assert second.step == 5 and second.resumed_from.endswith("step-00000002")
    name = "checkpoints/step-00000005/model"
    assert_bitwise_equal(load_weights(parts / name), load_weights(tmp_path / "whole" / name))
    whole_losses, part_losses = _losses(tmp_path / "whole"), _losses(parts)
    assert part_losses == whole_losses and len(set(whole_losses.values())) == 5


def test_toml_and_xtuner_dataloader_cfg_spell_the_same_options(tmp_path: Path) -> None:
    from twinkle.trainer import Trainer, TrainerConfig
    from twinkle.trainer.config import DataloaderConfig
    from twinkle.trainer.data_options import pack_budget

    toml = tmp_path / "job.toml"
    toml.write_text('total_step = 3\n[dataset]\nstreaming = true\npacking_interval = 16\n'
                    '[dataloader_cfg]\npack_max_length = 512\nshuffle_buffer = 64\n')
    cfg = TrainerConfig.from_file(toml)
    assert (cfg.dataset.streaming, cfg.dataset.packing_interval, pack_budget(cfg), cfg.dataloader.shuffle_buffer) == \
        (True, 16, 512, 64)
    # xtuner's keyword: pack_max_length alone packs, to its budget
    trainer = Trainer(work_dir=str(tmp_path / "w"), total_step=1,
                      dataloader_cfg=DataloaderConfig(pack_max_length=1024))
    assert pack_budget(trainer.config) == 1024 and pack_budget(TrainerConfig.from_dict({"total_step": 1})) is None
    assert pack_budget(TrainerConfig.from_dict({"total_step": 1, "dataset": {"packing": True, "max_length": 96}})) == 96


def test_a_stream_of_several_sources_gives_the_rows_the_map_style_build_gives(tmp_path: Path) -> None:
    """dataset_cfg's sources streamed (their first train_samples rows, concatenated, encoded as read) equal the
    up-front build of the same sources, row for row."""
    from twinkle.launch import TINY_MODEL
    from twinkle.trainer import TrainerConfig
    from twinkle.trainer.data_options import build_datasets

    sources = [{"dataset": {"train_samples": 5, "name": "a"}}, {"dataset": {"train_samples": 7, "name": "b"}}]
    eager = build_datasets(TrainerConfig.from_dict({"total_step": 1, "dataset_cfg": sources}), TINY_MODEL)[0]
    stream, evals = build_datasets(TrainerConfig.from_dict(
        {"total_step": 1, "dataset_cfg": sources, "dataset": {"streaming": True}}), TINY_MODEL)
    assert getattr(stream, "is_stream", False) and evals is None
    streamed = list(stream)
    assert len(streamed) == len(eager) == 12
    assert [r["input_ids"] for r in streamed] == [list(eager[i]["input_ids"]) for i in range(12)]
    assert [r["labels"] for r in streamed] == [list(eager[i]["labels"]) for i in range(12)]


def test_a_stream_runs_on_into_its_next_epoch_and_hooks_are_told_which(tmp_path: Path) -> None:
    """16 streamed rows in batches of 4: steps 1-4 are epoch 1, steps 5-6 epoch 2 (the stream reopened).

    Each step's hook runs once. The stream's end is found only by reading on, so step 5's hook, run before
    its batches are read, still sees epoch 1; step 6's sees epoch 2."""
    from twinkle.trainer import Trainer

    seen: list[tuple[int, int]] = []
    result = Trainer(work_dir=str(tmp_path / "w"), total_step=6, global_batch_size=4, progress_bar=False,
                     dataset={"train_samples": ROWS, "max_length": MAX_LENGTH, "streaming": True},
                     hooks={"before_train_step": lambda step, epoch, **_: seen.append((step, epoch))}).fit()
    assert result.step == 6
    assert seen == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2)]


def test_evaluation_rows_beside_a_stream_are_streamed_too_and_equal_the_map_style_ones() -> None:
    """The eval rows after the training rows are read through the stream (a hub dataset is never downloaded
    whole for them) and are the up-front build's eval rows, token for token."""
    from twinkle.launch import TINY_MODEL
    from twinkle.trainer import TrainerConfig
    from twinkle.trainer.data_options import build_datasets

    base = {"total_step": 1, "dataset": {"train_samples": 8, "eval_samples": 4, "max_length": MAX_LENGTH}}
    eager = build_datasets(TrainerConfig.from_dict(base), TINY_MODEL)[1]
    streamed = build_datasets(TrainerConfig.from_dict({**base, "dataset": {**base["dataset"], "streaming": True}}),
                              TINY_MODEL)[1]
    assert len(streamed) == len(eager) == 4
    for key in ("input_ids", "labels"):
        assert [list(r[key]) for r in streamed] == [list(r[key]) for r in eager]
