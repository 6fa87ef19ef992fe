"""Under NCCL every tensor handed to a collective must live on the GPU; gloo would accept a CPU tensor.

One torchrun launch (placement_job.py) uses a platform whose communication device is not the CPU
(fake_accelerator.py) and a spy on torch.distributed. For DDP, FSDP2 LoRA and multi-LoRA it records
what twinkle code hands to a collective during forward_backward, clip_grad_and_step,
calculate_metric, save and resume_from_checkpoint; every tensor must be on that device. The same
launch checks the collective layer's results and the shared atomic directory on two ranks.
"""

from __future__ import annotations

import pytest
from fake_accelerator import DEVICE, misplaced
from launch import torchrun

SCENARIOS = ("ddp_full", "fsdp2_lora", "multi_lora")
PHASES = ("forward_backward", "clip_grad_and_step", "calculate_metric", "save", "resume_from_checkpoint")


@pytest.fixture(scope="module")
def placement(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("placement_job")
    result = torchrun("placement_job.py", [], out, timeout=420)
    assert result.returncode == 0, f"torchrun placement job failed:\n{result.output[-6000:]}"
    return [result.load("placement", rank) for rank in (0, 1)]


def _part(placement: list[dict], rank: int, name: str) -> dict:
    part = placement[rank][name]
    assert "error" not in part, f"{name} failed on rank {rank}:\n{part.get('error')}"
    return part


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_tensor_twinkle_hands_to_a_collective_is_on_the_communication_device(placement, scenario):
    for rank in (0, 1):
        part = _part(placement, rank, scenario)
        for phase in PHASES:
            assert misplaced(part["records"][phase]) == [], f"rank {rank}, {phase}"
        # the spy saw the token count and the metric sums, so the empty lists above are not vacuous
        for phase in ("forward_backward", "calculate_metric"):
            assert [r["devices"] for r in part["records"][phase] if r["fn"] == "all_reduce"], phase
        assert part["progress"] == {"cur_step": 1, "consumed_train_samples": 8, "gradient_accumulation_steps": 2}
    first, second = _part(placement, 0, scenario), _part(placement, 1, scenario)
    assert first["losses"] == second["losses"]  # the global per-token mean: one number on every rank
    assert first["metrics"] == second["metrics"]


@pytest.mark.slow
def test_collective_layer_on_two_ranks(placement):
    assert placement[0]["comm_device"] == f"{DEVICE}:0"
    for rank in (0, 1):
        got = _part(placement, rank, "layer")
        assert misplaced(got["records"]) == [] and any(r["devices"] == [DEVICE] for r in got["records"])
        assert (got["sum"], got["max"], got["min"]) == ([3.0, 30.0], [2.0, 20.0], [1.0, 10.0])
        assert got["input_after"] == [rank + 1.0, 10.0 * (rank + 1)]  # all_reduce returns a new tensor
        values, device, dtype = got["sum_values"]
        assert values == [3.0, 4.0, 1.0, 2.0] and device == "cpu" and str(dtype) == "torch.float64"
        assert got["sum_floats"] == [1.0, 3.0]
        assert got["broadcast"] == [[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]]  # rank 1's non-contiguous tensor
        assert got["all_gather"] == [[0, 0], [1, 2]]
        assert got["gather_object"] == ([{"rank": 0}, {"rank": 1}] if rank == 0 else None)
        assert got["broadcast_object"] == 7 and got["failed"] == [1]
    assert placement[0]["layer"]["agree"] == ("the probe failed on rank(s) [1]; this rank stopped too (see their "
                                              "error).")
    assert placement[1]["layer"]["agree"] is None  # the failing rank raises its own error


@pytest.mark.slow
def test_shared_atomic_directory_on_two_ranks(placement):
    """Both ranks write; rank 0's finish sees both files; a failure on rank 1 leaves nothing behind."""
    first, second = _part(placement, 0, "layer"), _part(placement, 1, "layer")
    assert first["shared_ok"] == second["shared_ok"] == "rank0,rank1"
    assert first["shared_fail"].startswith("CheckpointError: Saving")
    assert "failed on rank(s) [1]" in first["shared_fail"]
    assert second["shared_fail"] == "OSError: disk full on rank 1"
    assert first["left_over"] == second["left_over"] == [] and first["failed_dir_exists"] is False
