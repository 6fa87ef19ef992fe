"""tests/gpu/first_run.sh on any machine: ``--check``, and dry runs with a fake ``nvidia-smi`` and stand-in stages.

The stand-ins (FIRST_RUN_STANDINS) replace each stage's commands; the script's own logic runs as on a GPU
machine: the order, each stage's budget inside the global deadline, and ``summary.json`` rewritten into the
output folder after every stage, so a stage killed by its budget (or a run cut short) keeps the earlier
stages' results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "first_run.sh"
STAGES = ["setup", "environment", "bench_0_5b", "bench_1_5b", "hf_gpu", "vllm", "megatron"]


def _run(*args: str, path: str | None = None, timeout: float = 400, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **env}
    full.pop("OUT", None)
    if path is not None:
        full["PATH"] = path
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=timeout)


def _fake_driver(tmp_path: Path) -> str:
    """A PATH whose first entry holds an ``nvidia-smi`` that answers like a driver."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI 570.00  Driver Version: 570.00  CUDA Version: 12.8 (fake)'\n")
    fake.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


STANDINS = """
BUDGET[bench_1_5b]=2
stage_setup() { echo "installing (stand-in)"; }
stage_environment() { nvidia-smi; }
stage_bench_0_5b() {
  echo '{"rows": [{"mode": "full", "variant": "twinkle", "tokens_per_s": 1000.0, "mfu": 0.4}]}' \\
    > "$OUT_DIR/bench_0_5b.json"
}
stage_bench_1_5b() { cp "$OUT_DIR/summary.json" "$OUT_DIR/seen_by_bench_1_5b.json"; sleep 60; }
stage_hf_gpu() { echo "1 failed"; return 1; }
stage_vllm() { echo "vllm is not installed"; return 77; }
stage_megatron() { cp "$OUT_DIR/summary.json" "$OUT_DIR/seen_by_megatron.json"; }
"""


def _statuses(out: Path) -> dict[str, str]:
    return {row["stage"]: row["status"] for row in json.loads((out / "summary.json").read_text())["stages"]}


def test_a_dry_run_rewrites_the_summary_after_every_stage_and_a_killed_stage_keeps_the_rest(tmp_path) -> None:
    standins = tmp_path / "standins.sh"
    standins.write_text(STANDINS)
    out = tmp_path / "out"
    proc = _run(str(out), path=_fake_driver(tmp_path), FIRST_RUN_STANDINS=str(standins), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a failed stage fails the verdict
    assert _statuses(out) == {"setup": "passed", "environment": "passed", "bench_0_5b": "passed",
                              "bench_1_5b": "timeout after 2s", "hf_gpu": "failed (rc=1: tests failed)",
                              "vllm": "skipped: prerequisite missing", "megatron": "passed"}
    # what the summary held while a stage ran: every earlier stage, nothing later
    seen = json.loads((out / "seen_by_bench_1_5b.json").read_text())
    assert [row["stage"] for row in seen["stages"]] == STAGES[:3]
    assert seen["bench"]["bench_0_5b"]["rows"][0]["mfu"] == 0.4
    assert [row["stage"] for row in json.loads((out / "seen_by_megatron.json").read_text())["stages"]] == STAGES[:6]
    assert "fake" in (out / "environment.log").read_text()


def test_the_global_deadline_cuts_a_stage_short_and_the_rest_is_not_run(tmp_path) -> None:
    standins = tmp_path / "standins.sh"
    standins.write_text("stage_setup() { sleep 60; }\n")
    out = tmp_path / "out"
    proc = _run(str(out), "--deadline", "8", path=_fake_driver(tmp_path), FIRST_RUN_STANDINS=str(standins),
                timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    statuses = _statuses(out)
    assert statuses["setup"] == "timeout after 3s"  # its 240 s budget clipped to the deadline (8 s - 5 s grace)
    assert {statuses[s] for s in STAGES[1:]} == {"not run: global deadline of 8s reached"}


def test_usage_errors_and_a_machine_without_a_driver() -> None:
    proc = _run("--fast")
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
    proc = _run("--deadline", "soon")
    assert proc.returncode == 2 and "--deadline takes seconds" in proc.stderr
    if shutil.which("nvidia-smi") is None:
        proc = _run()
        assert proc.returncode == 77 and "no NVIDIA driver" in proc.stderr


@pytest.mark.slow
def test_check_collects_the_named_gpu_tests_and_plans_a_pypi_only_setup() -> None:
    proc = _run("--check")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for test in ("tests/gpu/test_hf_gpu.py::test_meta_build_and_sharded_load_on_one_gpu",
                 "tests/gpu/test_hf_gpu.py::test_liger_through_kernelize_trains_like_the_plain_model",
                 "tests/gpu/test_hf_gpu.py::test_fp8_trains_through_torchao_float8_layers",
                 "tests/kernels/test_liger_kernels.py::test_liger_kernels_match_the_model_on_cuda",
                 "tests/gpu/test_megatron_gpu.py::test_tp1_training_through_the_schedule_lowers_the_loss"):
        assert test in proc.stdout, test
    assert '"params": 1543714304' in proc.stdout  # the 1.5B shape's benchmark
    assert "first_run.sh --check: ok" in proc.stdout
