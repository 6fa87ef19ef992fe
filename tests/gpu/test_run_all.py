"""The GPU tier's scripts on any machine (the tier itself needs a CUDA GPU).

* ``run_all.sh --check``: the scripts parse, the tier's tests collect and import, the benchmark, every
  ``run_*.sh`` and ``setup.sh --dry-run`` accept their arguments.
* The stage logic (``stages.sh``) driven with stand-in stages: each stage has its own budget, and an exit
  status is read for what it is (77 prerequisite missing -> skipped; pytest's 3, internal error -> failed).
* ``run_all.sh --plan``: the stages in order with their budgets; every ``run_*.sh`` says 77 without a GPU.
* ``setup.sh --dry-run``: the install plan of a fresh GPU machine.
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
GPU = REPO / "tests" / "gpu"
SCRIPT = GPU / "run_all.sh"
ENV = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def _bash(*args: str, script: Path = SCRIPT, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.slow
def test_check_collects_every_gpu_test_and_parses_the_benchmark() -> None:
    proc = _bash("--check")
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
    proc = _bash("--fast")
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
    proc = _bash("--plan", "--budget", "nope=5")
    assert proc.returncode == 2 and "no stage 'nope'" in proc.stderr
    if not _cuda():
        proc = _bash()
        assert proc.returncode == 77 and "no CUDA device visible" in proc.stderr  # a missing prerequisite


def test_every_stage_has_its_own_budget_and_megatron_runs_last() -> None:
    proc = _bash("--plan")
    assert proc.returncode == 0, proc.stderr
    plan = [(name, int(seconds)) for name, seconds in (line.split() for line in proc.stdout.splitlines())]
    assert [name for name, _ in plan] == ["gpu_tests", "bench", "vllm", "megatron"]
    budgets = dict(plan)
    # a stage script's budget is its own BUDGET= line plus time to start; megatron keeps its whole 600 s
    assert budgets["megatron"] == 630 and budgets["vllm"] == 270 and budgets["gpu_tests"] == 300
    proc = _bash("--plan", "--budget", "megatron=900")
    assert dict(line.split() for line in proc.stdout.splitlines())["megatron"] == "900"


STAND_INS = """
source tests/gpu/stages.sh
stage ok 5 bash -c 'exit 0'
stage busy 2 sleep 1          # uses half its budget ...
stage busy_too 2 sleep 1      # ... and the next stage still has all of its own
stage no_vllm 5 bash -c 'echo "vllm is not installed"; exit 77'
stage crashed 30 "$PY" -m pytest -q -p no:cacheprovider "$CRASHING"
stage empty 5 bash -c 'exit 5'
stage hung 1 sleep 10
write_summary
"""


def _stages(tmp_path: Path, script: str, **env: str) -> tuple[int, dict]:
    """Run ``script`` (bash, stages.sh sourced) with OUT_DIR=tmp_path; returns (exit status, summary.json)."""
    crashing = tmp_path / "crashing"
    crashing.mkdir(exist_ok=True)  # a conftest whose hook raises: pytest exits 3 (INTERNALERROR)
    (crashing / "conftest.py").write_text("def pytest_collection_modifyitems(items):\n    raise RuntimeError('x')\n")
    (crashing / "test_one.py").write_text("def test_one():\n    pass\n")
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "stages.tsv").write_text("")
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**ENV, "OUT_DIR": str(out), "PY": sys.executable,
                                            "CRASHING": str(crashing), **env})
    assert (out / "summary.json").is_file(), proc.stdout + proc.stderr
    return proc.returncode, json.loads((out / "summary.json").read_text())


def test_exit_statuses_are_read_for_what_they_are(tmp_path) -> None:
    code, summary = _stages(tmp_path, STAND_INS)
    status = {row["stage"]: row["status"] for row in summary["stages"]}
    assert status == {"ok": "passed", "busy": "passed", "busy_too": "passed",
                      "no_vllm": "skipped: prerequisite missing",
                      "crashed": "failed (rc=3: pytest internal error)",  # never "skipped"
                      "empty": "failed (rc=5: no tests collected)",
                      "hung": "timeout after 1s"}
    assert {row["stage"]: row["rc"] for row in summary["stages"]}["crashed"] == 3
    assert code == 1
    assert (tmp_path / "out" / "no_vllm.log").read_text().strip() == "vllm is not installed"


def test_skipped_stages_pass_the_run_unless_strict(tmp_path) -> None:
    script = "source tests/gpu/stages.sh\nstage ok 5 true\nstage no_vllm 5 bash -c 'exit 77'\nwrite_summary\n"
    assert _stages(tmp_path, script)[0] == 0
    assert _stages(tmp_path, script, STRICT="1")[0] == 1


@pytest.mark.skipif(_cuda(), reason="checks the no-GPU answer")
@pytest.mark.parametrize("script", ["run_vllm.sh", "run_megatron.sh"])
def test_a_stage_script_without_a_gpu_says_prerequisite_missing(script) -> None:
    proc = _bash(script=GPU / script, timeout=120)
    assert proc.returncode == 77 and "no CUDA device" in proc.stderr


def _plan(*args: str) -> str:
    proc = _bash("--dry-run", *args, script=GPU / "setup.sh", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_setup_installs_what_the_gpu_tier_needs() -> None:
    plan = _plan()
    commands = [line for line in plan.splitlines() if line.startswith("+ ")]
    installs = "\n".join(commands)
    vllm, torch = (next(i for i, c in enumerate(commands) if c.endswith(key)) for key in ("vllm>=0.10 torch>=2.9",
                                                                                         "install torch>=2.9"))
    assert vllm < torch  # vLLM first: it pins its torch; a CUDA torch from PyPI only if it brought none
    assert "index-url" not in installs and "download.pytorch.org" not in installs  # PyPI only
    for package in ("-e packages/twinkle-core", "-e packages/twinkle-hf[liger]", "-e packages/twinkle-megatron",
                    "-e packages/twinkle-server"):
        assert package in installs, package
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    liger = next(d for d in pyproject["tool"]["hatch"]["envs"]["test"]["dependencies"] if d.startswith("liger"))
    assert liger in installs  # the same liger as the hatch test environment
    assert "transformer-engine" not in installs  # a 10-20 minute build: only when asked for
    assert "megatron.core" in installs and "liger_kernel" in installs  # the closing import check
    table = {line[:40].strip(): line[40:].strip() for line in plan[plan.index("\n\n"):].splitlines() if line}
    assert table["vLLM (extra)"] == "planned (optional)"
    assert table["CUDA torch"] == table["twinkle packages (editable)"] == "planned (required)"
    bare = _plan("--no-vllm", "--no-te")
    assert "vllm" not in bare.lower() and "transformer-engine" not in bare
    te = _plan("--with-te", "--torch-index", "https://example.invalid/whl")
    assert "--no-build-isolation transformer-engine[pytorch]>=2.0" in te  # built against the installed torch
    assert "torch>=2.9 --index-url https://example.invalid/whl" in te


def test_setup_refuses_unknown_arguments_and_a_machine_without_a_driver() -> None:
    proc = _bash("--bogus", script=GPU / "setup.sh", timeout=60)
    assert proc.returncode == 2 and "unknown argument '--bogus'" in proc.stderr
    if shutil.which("nvidia-smi") is None:
        proc = _bash(script=GPU / "setup.sh", timeout=60)
        assert proc.returncode == 77 and "no NVIDIA driver" in proc.stderr
