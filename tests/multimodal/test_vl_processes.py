"""VL training across processes: bitwise resume in a fresh process, 2-rank FSDP2 against one process, and
ranks whose micro-batches disagree on images (DDP, FSDP2, accelerate FSDP2) against one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rounding import U, within

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from golden_bounds import VL  # noqa: E402

#: The ranks sum the one process's float32 terms in another order: a step of the tiny Qwen2.5-VL (images, 4 rows)
#: within VL.step_bound() (tests/rounding.py via golden_bounds); Adam with eps = 1 (scripts/vl_job.py) and SGD
#: (scripts/vl_mixed_job.py) are Lipschitz in the gradient, so step k carries the earlier steps' rounding twice.
FSDP_STEPS = 4
BOUND = (2 * (FSDP_STEPS - 1) + 1) * VL.step_bound()

SCRIPT = Path(__file__).parent / "scripts" / "vl_job.py"
MIXED = Path(__file__).parent / "scripts" / "vl_mixed_job.py"
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
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
          str(tmp_path), "fsdp"], timeout=420)
    sys.path.insert(0, str(SCRIPT.parent))
    from vl_job import fsdp_run

    want = fsdp_run()
    ranks = [torch.load(tmp_path / f"fsdp.rank{r}.pt", weights_only=False) for r in (0, 1)]
    for got in ranks:
        assert got["layers"] == ["Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"]  # vision blocks sharded too
        assert got["losses"] == pytest.approx(want["losses"], rel=BOUND, abs=0)
        assert sorted(got["params"]) == sorted(want["params"])
        assert any(".merger." in name for name in got["params"])
        for name, value in want["params"].items():  # per tensor: the bound of the update, u |w| per stored step
            update = float((value - want["initial"][name]).norm())
            room = BOUND * update + FSDP_STEPS * U * float(value.norm())
            assert float((got["params"][name] - value).norm()) <= room, name
            assert update > 10 * room or value.ndim == 1, (name, update, room)  # matrices moved far beyond it
    assert want["losses"][-1] < want["losses"][0]


@pytest.mark.slow
def test_ranks_with_and_without_images_stay_in_step_and_match_one_process(tmp_path: Path) -> None:
    # before the blank vision passes: FSDP2 ranks all-gathered different modules (a hang on NCCL, a gloo
    # size mismatch here) and DDP failed on the parameters a text-only rank left without gradient
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(MIXED),
          str(tmp_path)], timeout=420)
    sys.path.insert(0, str(MIXED.parent))
    from vl_mixed_job import STRATEGIES, mixed_run

    want = mixed_run()
    assert want["images"] == [2, 2, 0, 4]
    kinds = {"ddp": "ddp", "native_fsdp": "fsdp2", "accelerate": "accelerate_fsdp2"}
    for strategy in STRATEGIES:
        for rank, images in ((0, [2, 0, 0, 2]), (1, [0, 2, 0, 2])):
            got = torch.load(tmp_path / f"{strategy}.rank{rank}.pt", weights_only=True)
            assert got["kind"] == kinds[strategy] and got["images"] == images
            assert got["losses"] == pytest.approx(want["losses"], rel=BOUND, abs=0), strategy
            for step, (grads, wanted) in enumerate(zip(got["grads"], want["grads"])):
                assert grads.keys() == wanted.keys()
                assert any(".visual.blocks." in n and g is not None and g.any() for n, g in grads.items()) == \
                    (step != 2)  # the vision blocks train (LoRA) except on the step without images
                for name, value in wanted.items():
                    if value is None:  # no rank had an image: no gradient at all, as on one process
                        assert grads[name] is None, (strategy, step, name)
                    else:
                        torch.testing.assert_close(grads[name], value, **within(BOUND, value),
                                                   msg=f"{strategy} step {step} {name}")

