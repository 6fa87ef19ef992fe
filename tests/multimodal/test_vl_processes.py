"""VL training across processes: bitwise resume in a fresh process, and 2-rank FSDP2 against one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "vl_job.py"
ENV = {**os.environ, "TWINKLE_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
       "OMP_NUM_THREADS": "1"}


def _run(args: list[str], timeout: int = 300) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]


def test_resume_in_a_fresh_process_is_bitwise(tmp_path: Path) -> None:
    _run([sys.executable, str(SCRIPT), str(tmp_path), "uninterrupted"])
    _run([sys.executable, str(SCRIPT), str(tmp_path), "resume"])
    full = json.loads((tmp_path / "uninterrupted.json").read_text())
    resumed = json.loads((tmp_path / "resume.json").read_text())
    tail = full["losses"][full["saved_after"]:]
    assert len(tail) == 3 and resumed["losses"] == tail
    assert resumed["progress"]["cur_step"] == 3 and resumed["progress"]["consumed_train_samples"] == 12
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"adapter_model.safetensors", "optimizer.pt", "rng_state.pt", "processor_config.json"} <= names


@pytest.mark.slow
def test_two_rank_fsdp2_matches_one_process(tmp_path: Path) -> None:
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29741", str(SCRIPT),
          str(tmp_path), "fsdp"], timeout=420)
    sys.path.insert(0, str(SCRIPT.parent))
    from vl_job import fsdp_run

    want = fsdp_run()
    ranks = [torch.load(tmp_path / f"fsdp.rank{r}.pt", weights_only=False) for r in (0, 1)]
    for got in ranks:
        assert got["layers"] == ["Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"]  # vision blocks sharded too
        assert got["losses"] == pytest.approx(want["losses"], abs=5e-6, rel=0)
        assert sorted(got["params"]) == sorted(want["params"])
        assert any(".merger." in name for name in got["params"])
        for name, value in want["params"].items():
            torch.testing.assert_close(got["params"][name], value, atol=3e-5, rtol=1e-5, msg=name)
    assert want["losses"][-1] < want["losses"][0]
