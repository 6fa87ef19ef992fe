"""Golden runs (issue 22): every run of ``make_golden.py`` equals its recording in ``recordings/``, bit for bit.

The runs (HF LoRA / full / accumulation 4x2 / fp32 resume, multi-LoRA batched, GRPO, DPO, VL LoRA,
Megatron tp=1 and tp=2, DDP / FSDP2 / accelerate-FSDP2 on 2 ranks, ``twinkle train`` and the service
through the ``tinker`` client) were recorded before the model layer's rewrite; ``make_golden.py --check``
runs them again in child processes (one for the single-process runs, one ``torchrun`` launch for the
2-rank runs, ``twinkle train``, ``twinkle serve``) and this test compares.

What is pinned in the children (``make_golden.PINNED_ENV``), and why: a CPU result depends on code
that libraries choose at run time for the CPU they find, and on how many threads split a reduction.
Each choice is pinned to a path every x86-64 CPU runs, so the bits are the same on any x86 machine:

- ``OMP_NUM_THREADS=1`` / ``MKL_NUM_THREADS=1`` (and ``torch.set_num_threads(1)``): reductions are not
  split by the core count.
- ``ATEN_CPU_CAPABILITY=default``: ATen's baseline kernels, not the AVX2 / AVX-512 ones.
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility, one GEMM code path on every CPU.
- oneDNN off in the children (``torch.backends.mkldnn.enabled = False``: the VL patch-embedding
  convolution goes through im2col + MKL GEMM; oneDNN blocks by the cache sizes it detects), and
  ``ONEDNN_MAX_CPU_ISA=SSE41`` for ``twinkle train`` / ``twinkle serve``, where it cannot be turned off.
- ``GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA,-FMA4``: glibc picks FMA variants of libm's double
  ``exp``/``log``/``pow``/``sin``/``cos`` on CPUs that have FMA, and they round differently from the SSE2
  code (300k random inputs: different digests). Python's ``math`` (lr schedules) calls them.
- fp32 everywhere (``mixed_precision='no'``), ``PYTHONHASHSEED=0``, ``CUDA_VISIBLE_DEVICES=''``.

Shown on the machine that recorded them (AMD EPYC with AVX-512, 2 cores): ``--check`` from a parent
with ``ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 MKL_CBWR=AUTO`` gives the recorded
bits for every run (this test always runs from such a parent, :data:`HOSTILE_PARENT`). Each pin
matters: ``make_golden.py --check --env VAR=VALUE`` changes one pinned variable in the children, and
``ATEN_CPU_CAPABILITY=avx2`` or ``=avx512``, ``MKL_CBWR=`` (unset) each change all 15 runs (~1e-7 relative
at the first differing step), ``OMP_NUM_THREADS=2 MKL_NUM_THREADS=2`` changes 14 (``hf_full``'s tensors
are too small to split), ``GOLDEN_MKLDNN=1`` (oneDNN on) changes ``vl_lora``. ``PYTHONHASHSEED=123``
changes none; the FMA libm variants (``GLIBC_TUNABLES=``) change none of today's runs, but they do
change torch's float64 ``exp``/``cos``/``log`` under the default kernels, so they are pinned too.
An older CPU as MKL and glibc see it (``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` and glibc hwcaps without
AVX / AVX-512) gives the recorded bits; the same MKL limit without ``MKL_CBWR`` changes all 15.
Not pinned: numpy's SIMD dispatch (``NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4 AVX512_ICL AVX512_SPR"``
changes none of the runs, no recorded number goes through numpy arithmetic, and the feature names
differ between numpy versions, so a pin could break numpy's import elsewhere).

Tolerance: none; every run is bitwise stable under these pins (checked repeatedly, under a load
average up to ~15 on 2 cores and with the runs in parallel). After the rewrite, a run whose reduction
order changes on purpose goes into :data:`TOLERANCES` with its relative tolerance and the reason;
its floats are then compared within it (``|got - recorded| <= rel * max(|recorded|, 1)``) and its
weight digests are not compared.

The recordings hold for the library versions in ``recordings/environment.json`` (torch, transformers,
peft, accelerate, megatron-core, tokenizers, pillow, glibc): another version may change a kernel,
so with other versions the test is skipped and says which differ (re-record there with ``--write``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "make_golden.py"

pytestmark = pytest.mark.slow

#: The parent's environment for the check: what the children must not inherit.
HOSTILE_PARENT = {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "MKL_CBWR": "AUTO"}

#: run name -> (relative tolerance, why its bits may differ from the recording). Empty: all bitwise.
TOLERANCES: dict[str, tuple[float, str]] = {}


def _load_golden() -> Any:
    spec = importlib.util.spec_from_file_location("make_golden", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _load_golden()
RUN_NAMES = list(golden.RUNS)


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``make_golden.py --check`` once for the module; its report ({'records', 'diffs', 'seconds'})."""
    mismatch = golden.environment_mismatch()
    if mismatch:
        pytest.skip(f"the golden recordings were made with other library versions ({mismatch}); bitwise "
                    "equality holds only for those: re-record with `make_golden.py --write` on them")
    report = tmp_path_factory.mktemp("golden") / "report.json"
    env = {**os.environ, **HOSTILE_PARENT}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check", "--report", str(report)], env=env,
                          capture_output=True, text=True, timeout=420)
    assert report.is_file(), f"make_golden.py --check wrote no report:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(report.read_text())
    print(f"golden runs: seconds per job {result['seconds']}")
    return result


def test_every_run_has_a_recording() -> None:
    recorded = {p.stem for p in golden.RECORDINGS.glob("*.json")} - {golden.ENVIRONMENT_FILE.stem}
    assert recorded == set(RUN_NAMES)


@pytest.mark.parametrize("name", RUN_NAMES)
def test_run_equals_its_recording(name: str, checked: dict[str, Any]) -> None:
    record = checked["records"][name]
    assert "error" not in record, f"{name} failed:\n{record['error']}"
    if name in TOLERANCES:
        rel, _reason = TOLERANCES[name]
        lines = golden.diff(golden.load_recording(name), record, rel=rel)
    else:
        lines = checked["diffs"][name]
    lines = golden.fold_tensor_lines(lines)
    assert not lines, (f"{name} differs from tests/golden/recordings/{name}.json:\n" + "\n".join(lines[:40]))
