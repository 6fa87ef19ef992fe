"""`twinkle train` under torchrun (2 CPU processes, DDP): checkpoints, eval/best and HF exports from every
rank without deadlock, and auto_resume continuing the 2-process run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trainer_testing import cli_env, load_weights, tiny_job, write_config

from twinkle.trainer import store


def _torchrun(config: Path, *overrides: str) -> subprocess.CompletedProcess:
    # --standalone: a free port of torchrun's choosing (a fixed one collides with any other run on the machine)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "twinkle.cli.main", "train", str(config), *overrides]
    return subprocess.run(cmd, cwd=config.parent, env=cli_env(OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=240)


@pytest.mark.slow
def test_two_process_run_checkpoints_evaluates_exports_and_resumes(tmp_path: Path) -> None:
    work_dir = tmp_path / "wd"
    job = tiny_job(work_dir, total_step=3, eval_interval=2, hf_interval=2, checkpoint_maxkeep=1,
                   dataset={"train_samples": 16, "eval_samples": 4, "max_length": 128})
    config = write_config(tmp_path / "job.yaml", job)
    first = _torchrun(config)
    assert first.returncode == 0, first.stderr[-4000:]
    assert first.stdout.count("twinkle train: finished at step 3/3") == 1  # the summary is rank 0's
    (step, last), = store.list_checkpoints(work_dir / "checkpoints")
    assert step == 3 and store.verify(last)["consumed_train_samples"] == 12
    assert (work_dir / "best-checkpoint" / "adapter_model.safetensors").is_file()
    assert load_weights(work_dir / "hf" / "step-00000002")

    resumed = _torchrun(config, "--total-step", "5", "--auto-resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"auto_resume: resumed from {last}" in resumed.stderr
    (step, last), = store.list_checkpoints(work_dir / "checkpoints")
    assert step == 5 and store.verify(last)["consumed_train_samples"] == 20


#: Plain SGD at a constant lr, clipped to max_grad_norm: the update is linear in the gradient (see below).
SGD_JOB = {"optimizer": {"name": "SGD", "lr": 5e-3, "max_grad_norm": 1.0}, "lr": {"scheduler": None}}
#: Sums between the loss and a LoRA weight's gradient (forward and backward, 2 layers) and the longest of them
#: (the log-softmax over the 2590-token vocabulary; the weight gradient's sum over tokens has at most 512 terms).
SUMS, LONGEST = 50, 2590
#: Two fp32 evaluations of the same sums in different orders differ, to first order, by at most
#: 2 * gamma_n * sum|terms| per sum (gamma_n = n * 2**-24), relative to the gradient's scale.
RHO = 2 * SUMS * LONGEST * 2.0**-24  # 7.7e-3


@pytest.mark.slow
def test_fsdp_size_shards_the_model_and_async_checkpoints_complete_on_every_rank(tmp_path: Path) -> None:
    """infra.fsdp_size=2 under two processes (local mode built only a DP mesh before), with async checkpoints,
    trains as one process does.

    The two ranks each sum their rows' gradients and then add the two; the one process sums the whole
    batch: the same real sums in another order, so each gradient element may differ by its rounding.
    With AdamW no machine-independent tolerance exists: it divides by sqrt(v) + 1e-8, so an element
    whose gradient is near 1e-8 turns that rounding into up to ~lr of weight (measured: one element of
    down_proj.lora_A, 3.1e-5 with ATEN_CPU_CAPABILITY=avx2, 2.1e-5 with avx512; 1e-6 elsewhere).
    SGD's update is lr * g, and clipping keeps |g| <= max_grad_norm, so after T steps
    |w_2rank - w_1proc| <= T * lr * RHO * max_grad_norm (measured: 1e-10 on avx2, avx512 and default).
    AdamW's two-rank parity has its own tests (tests/distributed/test_training_parity.py).
    """
    import torch

    from twinkle.trainer import Trainer

    steps = 2
    job = tiny_job(tmp_path / "wd", total_step=steps, checkpoint_interval=1, async_checkpoint=True,
                   infra={"fsdp_size": 2}, **SGD_JOB)
    proc = _torchrun(write_config(tmp_path / "job.yaml", job))
    assert proc.returncode == 0, proc.stderr[-4000:]
    root = tmp_path / "wd" / "checkpoints"
    assert [s for s, _ in store.list_checkpoints(root)] == [1, 2]
    state = (root / "step-00000002" / "model" / "trainer_state.json").read_text()
    assert '"world_size": 2' in state and "fsdp" in state
    assert (root / "step-00000002" / "model" / "dcp_state").is_dir()

    reference = Trainer(**tiny_job(tmp_path / "ref", total_step=steps, checkpoint_interval=1, **SGD_JOB))
    reference.fit()
    want = load_weights(tmp_path / "ref" / "checkpoints" / "step-00000002" / "model")
    got = load_weights(root / "step-00000002" / "model")
    bound = steps * SGD_JOB["optimizer"]["lr"] * RHO * SGD_JOB["optimizer"]["max_grad_norm"]  # 7.7e-5
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=bound, msg=key)
    # not vacuous: training moved the weights well past the bound (a gradient off by 2x would show)
    first = load_weights(tmp_path / "ref" / "checkpoints" / "step-00000001" / "model")
    assert max(float((want[k] - first[k]).abs().max()) for k in want) > 4 * bound


@pytest.mark.slow
def test_infra_tp_size_two_trains_as_one_process(tmp_path: Path) -> None:
    """``twinkle train --infra.tp-size 2`` under two processes: the LoRA job runs tensor-parallel (both ranks read
    the same rows) and its weights equal one process's within the bound above (the same sums, split over the two
    ranks' shards and added in another order)."""
    import torch

    from twinkle.trainer import Trainer

    steps = 2
    job = tiny_job(tmp_path / "wd", total_step=steps, checkpoint_interval=1, **SGD_JOB)
    proc = _torchrun(write_config(tmp_path / "job.yaml", job), "--infra.tp-size", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    root = tmp_path / "wd" / "checkpoints"
    state = (root / "step-00000002" / "model" / "trainer_state.json").read_text()
    assert '"world_size": 2' in state and '"tp"' in state
    reference = Trainer(**tiny_job(tmp_path / "ref", total_step=steps, checkpoint_interval=1, **SGD_JOB))
    reference.fit()
    want = load_weights(tmp_path / "ref" / "checkpoints" / "step-00000002" / "model")
    got = load_weights(root / "step-00000002" / "model")
    bound = steps * SGD_JOB["optimizer"]["lr"] * RHO * SGD_JOB["optimizer"]["max_grad_norm"]
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=bound, msg=key)
    first = load_weights(tmp_path / "ref" / "checkpoints" / "step-00000001" / "model")
    assert max(float((want[k] - first[k]).abs().max()) for k in want) > 4 * bound
