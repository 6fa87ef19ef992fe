"""`twinkle train --infra.mode ray`: two CPU actors (dp=2) reproduce the single-process run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rounding import tiny_qwen
from trainer_testing import load_weights, run_train, tiny_job, write_config

from twinkle.trainer import TrainerConfig, store

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

pytest.importorskip("ray", reason="ray is installed by the test environment (twinkle-core[ray])")

#: The run: 4 steps of 4 rows (<= 128 tokens) on the embedded tiny Qwen, SGD lr <= 0.5 (cosine), momentum 0.9,
#: gradients clipped to norm <= 1 (optimizer.max_grad_norm's default).
STEPS, LR, MOMENTUM, MAX_NORM = 4, 0.5, 0.9, 1.0
#: One step's loss or gradient differs by step_bound() relative between the dp=2 and the one-process summation
#: order (tests/rounding.py); step k also carries the k - 1 steps that made its weights, twice each (the
#: argument of tests/distributed/dist_bounds.run_bound): 2 (steps - 1) + 1 step bounds. ~6e-4.
REL = (2 * (STEPS - 1) + 1) * tiny_qwen(128, 4).step_bound()
#: SGD with momentum is linear in the gradients: w_T - w_0 = -sum_t lr_t sum_{k<=t} momentum**(t-k) g_k, each
#: clipped g_k of norm <= MAX_NORM and off by <= 2 REL of it (its own rounding and the clipping norm's), so
#: the trained weights (all of them, by norm) differ by at most this. ~5e-3.
ROOM = 2 * REL * LR * MAX_NORM * sum(MOMENTUM ** (t - k) for t in range(STEPS) for k in range(t + 1))

RAY = ("--infra.mode", "ray", "--infra.dp-size", "2", "--infra.num-cpus", "2", "--infra.timeout-s", "120")


def _losses(work_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (work_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def test_ray_dp2_matches_the_single_process_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # SGD with momentum: the update is linear in the gradient, so the dp=2 reduction order's rounding stays
    # within ROOM in the weights. AdamW divides by sqrt(v): an element whose gradient is near eps turns that
    # noise into up to lr * noise / eps (3.8e-5 on the shipped tiny weights), which says nothing about ray.
    job = tiny_job(tmp_path / "local", total_step=STEPS, dataset={"train_samples": 16, "eval_samples": 4,
                                                              "max_length": 128}, eval_interval=4,
                   optimizer={"name": "SGD", "lr": LR, "kwargs": {"momentum": MOMENTUM}})
    config = write_config(tmp_path / "job.yaml", job)
    local = run_train(config, cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    ray_dir = tmp_path / "ray"
    # the timeout only guards against a hang: Ray start-up plus two workers take minutes on a loaded machine
    ray = run_train(config, *RAY, "--work-dir", str(ray_dir), cwd=tmp_path, timeout=420)
    assert ray.returncode == 0, ray.stderr[-3000:]

    want, got = _losses(tmp_path / "local"), _losses(ray_dir)
    assert len(want) == STEPS and got == pytest.approx(want, rel=REL, abs=0)
    last = ray_dir / "checkpoints" / "step-00000004"
    assert "twinkle train: finished at step 4/4" in ray.stdout and f"checkpoint: {last}" in ray.stdout
    assert [s for s, _ in store.list_checkpoints(ray_dir / "checkpoints")] == [2, 4]
    assert store.verify(last)["step"] == 4  # manifest + trainer state: complete
    model_dir = last / "model"
    local_model = tmp_path / "local" / "checkpoints" / "step-00000004" / "model"
    # the distributed layout torchrun writes: every rank's shards and RNG, all listed in the manifest
    on_disk = {str(p.relative_to(last)) for p in last.rglob("*") if p.is_file()} - {store.MANIFEST}
    assert on_disk == set(json.loads((last / store.MANIFEST).read_text())["files"])
    for name in ("dcp_model", "dcp_optimizer"):
        assert {p.name for p in (model_dir / name).iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert {"rng_state.pt", "rng_state.rank1.pt", "scheduler.pt"} <= {p.name for p in model_dir.iterdir()}
    assert json.loads((model_dir / "trainer_state.json").read_text())["cur_step"] == 4
    trained, reference = load_weights(model_dir), load_weights(local_model)
    assert sorted(trained) == sorted(reference)
    diff = torch.cat([(trained[k] - v).flatten() for k, v in reference.items()]).norm().item()
    assert diff <= ROOM, (diff, ROOM)
    # not vacuous: lora_B starts at zero, so its final norm is (part of) the update: far beyond ROOM
    moved = torch.cat([v.flatten() for k, v in reference.items() if "lora_B" in k]).norm().item()
    assert moved > 10 * ROOM, (moved, ROOM)
    assert (ray_dir / "best-checkpoint" / "adapter_model.safetensors").is_file()  # eval ran in the actors


def test_infra_options_are_validated() -> None:
    cfg = TrainerConfig.from_dict({"total_step": 1, "infra": {"mode": "ray", "dp_size": 2}})
    assert (cfg.infra.mode, cfg.infra.dp_size) == ("ray", 2)
    assert TrainerConfig.from_dict({"total_step": 1, "infra_mode": "ray"}).infra.mode == "ray"  # older spelling
    with pytest.raises(ValueError, match="infra.dp_size / num_cpus / ray_address: only used with infra.mode 'ray'"):
        TrainerConfig.from_dict({"total_step": 1, "infra": {"dp_size": 2}})
    with pytest.raises(ValueError, match="lora.merge_on_export: not available with infra.mode 'ray'"):
        TrainerConfig.from_dict({"total_step": 1, "infra": {"mode": "ray"}, "lora": {"merge_on_export": True}})
