"""Trainer.fit() in process: what it writes (checkpoints, tracker records, traces, exports, best) and
how auto_resume handles a damaged newest checkpoint, checked against independent references."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from rounding import LORA_TERMS, tiny_qwen, within
from trainer_testing import assert_bitwise_equal, load_weights, tiny_job

from twinkle.trainer import Trainer, store


def test_fit_writes_rotated_checkpoints_records_traces_exports_and_best(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    job = tiny_job(tmp_path / "wd", total_step=4, checkpoint_interval=1, checkpoint_maxkeep=2, eval_interval=2,
                   hf_interval=2, hf_max_keep=1, profile_step=2, lora={"merge_on_export": True},
                   dataset={"train_samples": 16, "eval_samples": 4, "max_length": 128})
    trainer = Trainer(**job)
    result = trainer.fit()
    wd = tmp_path / "wd"
    assert (result.step, result.total_step, result.interrupted) == (4, 4, False)
    assert [p.name for _, p in store.list_checkpoints(wd / "checkpoints")] == ["step-00000003", "step-00000004"]
    assert result.checkpoint == str(wd / "checkpoints" / "step-00000004")
    assert json.loads((wd / "checkpoints/step-00000004/model/trainer_state.json").read_text())["cur_step"] == 4

    records = [json.loads(line) for line in (wd / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for record in train:
        assert {"loss", "lr", "grad_norm", "tokens_per_second", "memory_mb", "step_time_s"} <= set(record)
    assert result.final_loss == train[-1]["loss"]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert len(evals) == 2 and result.best_eval_loss == min(evals)
    assert (wd / "best-checkpoint" / "adapter_model.safetensors").is_file()

    trace = json.loads((wd / "logs" / "profile" / "trace-step-2.json").read_text())
    assert trace["traceEvents"]

    # hf_max_keep=1: only the newest export; merged: a plain HF model computing what base+LoRA computes
    assert sorted(p.name for p in (wd / "hf").iterdir()) == ["step-00000004"]
    merged = AutoModelForCausalLM.from_pretrained(wd / "hf" / "step-00000004", torch_dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    peft_model = trainer.model.model
    peft_model.eval()
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits
        with peft_model.disable_adapter():
            base = peft_model(input_ids=ids).logits
        got = merged(ids).logits
    # W + s * B @ A merged vs W x + s * B (A x): the same real sums in another order, a forward of the tiny model
    # on 6 tokens, the merge adding <= r terms to each adapted weight (tests/rounding.py), elementwise by within()
    room = within(replace(tiny_qwen(6, 1), extra=LORA_TERMS).forward_bound(), want)
    torch.testing.assert_close(got, want, **room)
    print(f"merged vs peft {float((got - want).abs().max()):.2e}, adapter moved {float((want - base).abs().max()):.2e}"
          f", atol {room['atol']:.2e}")
    assert float((want - base).abs().max()) > 100 * room["atol"]  # a lost adapter fails it


def test_damaged_newest_checkpoint_falls_back_and_still_matches(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    wd = tmp_path / "wd"
    Trainer(**tiny_job(wd, total_step=4)).fit()
    newest = wd / "checkpoints" / "step-00000004"
    reference = load_weights(newest / "model")
    saved = tmp_path / "newest-copy"
    shutil.copytree(newest, saved)
    optimizer = newest / "model" / "optimizer.pt"
    optimizer.write_bytes(b"\0" * optimizer.stat().st_size)  # same size: only loading it finds the damage

    caplog.set_level(logging.INFO, logger="twinkle")
    result = Trainer(**tiny_job(wd, total_step=4, auto_resume=True, exp_tracker="tensorboard")).fit()
    assert "checkpoint step-00000004 is damaged" in caplog.text and "falling back" in caplog.text
    assert result.resumed_from == str(wd / "checkpoints" / "step-00000002") and result.step == 4
    assert_bitwise_equal(load_weights(newest / "model"), reference)  # steps 3-4 redone exactly

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(wd / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [3, 4]
    assert {"lr", "grad_norm", "tokens_per_second", "memory_mb"} <= set(events.Tags()["scalars"])
