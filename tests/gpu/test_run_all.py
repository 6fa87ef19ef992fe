"""tests/gpu/run_all.sh --check on any machine: the GPU tier's scripts parse, its tests collect and import,
and the benchmark and run_megatron.sh accept their arguments (the tier itself needs a CUDA GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "run_all.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)


@pytest.mark.slow
def test_check_collects_every_gpu_test_and_parses_the_benchmark() -> None:
    proc = _run("--check")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = proc.stdout
    assert "run_all.sh --check: ok" in out
    for test in ("tests/gpu/test_hf_gpu.py::test_meta_build_and_sharded_load_on_one_gpu",
                 "tests/gpu/test_hf_gpu.py::test_fused_linear_ce_never_holds_the_logits_on_cuda",
                 "tests/hf/test_precision.py::test_bf16_and_fp16_train_on_gpu",
                 "tests/kernels/test_liger_kernels.py::test_liger_kernels_match_the_model_on_cuda",
                 "tests/gpu/test_megatron_gpu.py::test_fp8_training_step"):
        assert test in out, test
    assert '"check": "ok"' in out and '"params": 494032768' in out  # the benchmark's 0.5B config


def test_unknown_arguments_and_a_missing_gpu_are_reported() -> None:
    proc = _run("--fast")
    assert proc.returncode == 2 and "unknown argument '--fast' (takes --check and --out DIR)" in proc.stderr
    if not _cuda():
        proc = _run()
        assert proc.returncode == 2 and "no CUDA device visible" in proc.stderr


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
