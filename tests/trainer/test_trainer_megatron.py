"""The Trainer drives any registered TwinkleModel: MegatronModel (CPU, tp=1) resumes exactly, too."""

from __future__ import annotations

import shutil
from pathlib import Path

from trainer_testing import assert_bitwise_equal, load_weights, tiny_job

from twinkle.trainer import Trainer, store

MEGATRON = {
    "model": {"type": "MegatronModel"},
    "optimizer": {"name": "default", "lr": 1e-2},
    "lr": {"scheduler": "default", "kwargs": {"lr_warmup_steps": 1, "lr_decay_steps": 4, "lr_decay_style": "cosine"}},
    "lora": {"target_modules": "all-linear"},
    "dataloader": {"gradient_accumulation_steps": 1},
}


def test_megatron_model_through_the_trainer_resumes_bitwise(tmp_path: Path) -> None:
    reference = Trainer(**tiny_job(tmp_path / "ref", total_step=4, **MEGATRON)).fit()
    assert reference.step == 4 and reference.final_loss is not None

    resumed_dir = tmp_path / "resumed"
    Trainer(**tiny_job(resumed_dir, total_step=4, **MEGATRON)).fit()
    shutil.rmtree(resumed_dir / "checkpoints" / "step-00000004")  # as if killed after step 2's checkpoint
    result = Trainer(**tiny_job(resumed_dir, total_step=4, auto_resume=True, **MEGATRON)).fit()
    assert result.resumed_from == str(resumed_dir / "checkpoints" / "step-00000002")

    ref_last = store.list_checkpoints(tmp_path / "ref" / "checkpoints")[-1][1]
    assert_bitwise_equal(load_weights(resumed_dir / "checkpoints" / "step-00000004" / "model"),
                         load_weights(ref_last / "model"))
