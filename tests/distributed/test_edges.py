"""One 2-rank launch: memory_efficient_init, bad input, and a rank failing mid-step (bounded, reported)."""

from __future__ import annotations

import json

import pytest
from launch import JobResult, torchrun

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)


@pytest.fixture(scope="module")
def edge_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    # rank 1 raises in step 2 while rank 0 waits in a collective: torchrun must end the job (rc != 0)
    # well inside this timeout; a hang would raise subprocess.TimeoutExpired and fail the tests.
    return torchrun("edge_job.py", [], tmp_path_factory.mktemp("edge_job"), timeout=300)


def test_a_rank_failing_mid_step_ends_the_job_with_its_error(edge_job: JobResult) -> None:
    assert edge_job.returncode != 0
    assert "rank 1 injected failure in step 2" in edge_job.output
    assert "[rank1]" in edge_job.output  # torchrun names the rank that failed


@pytest.mark.parametrize("kind", ["meminit_ddp", "meminit_fsdp", "meminit_accel"])
def test_memory_efficient_init_gives_the_plain_weights(edge_job: JobResult, kind: str) -> None:
    for rank in (0, 1):
        got = edge_job.load("edge", rank)[kind]
        assert got["same_keys"]
        assert got["max_weight_diff"] == 0.0 and got["max_buffer_diff"] == 0.0  # rotary inv_freq included
        print(f"{kind} rank {rank}: " + json.dumps({k: round(v, 1) if isinstance(v, float) else v
                                                   for k, v in got.items()}))


@pytest.mark.parametrize("kind", ["meminit_fsdp", "meminit_accel"])
def test_fsdp_memory_efficient_init_saves_host_memory_on_other_ranks(edge_job: JobResult, kind: str) -> None:
    """Rank 1 builds on meta and receives only its shard: its load peak is below the plain load's."""
    got = edge_job.load("edge", 1)[kind]
    assert got["peak_rss_mb_efficient"] < got["peak_rss_mb_plain"]


def test_fsdp_builds_keep_the_model_off_the_device_until_sharded(edge_job: JobResult) -> None:
    """Issue 22, GPU defect 2: a random-init model under FSDP2 is not moved whole to the device before
    ``fully_shard`` (DDP, the control, moves it whole)."""
    for rank in (0, 1):
        moved = edge_job.load("edge", rank)["moved_before_sharding"]
        assert "Qwen2ForCausalLM" in moved["ddp"]
        assert "Qwen2ForCausalLM" not in moved["fsdp2"], moved


EXPECTED = {
    "mesh_size": "ValueError: The DeviceMesh covers dp=4 x fsdp=1 = 4 processes but 2 were launched",
    "fsdp_not_dividing": "ValueError: fsdp_size=3 does not divide the world size 2",
    "from_sizes_fsdp": "ValueError: DeviceMesh: world size 2 is not divisible by fsdp*tp*pp*cp=3",
    # sequence parallelism runs Qwen2-like families; Mistral's sliding window is refused, naming it and the fix
    "cp_mesh": "ValueError: cp_size=2 (sequence parallelism) runs full-attention layers only; the mistral model has "
               "sliding_attention layers, which the head exchange does not split. Use fsdp_size for this family",
    "batch_not_divisible": "DataError: batch_size=3 is global and must divide evenly over the 2 data-parallel ranks",
    "unknown_strategy": "ValueError: strategy='deepspeed' is not one of accelerate, native_fsdp.",
    "adapter_after_wrap": "RuntimeError: add_adapter_to_model('late') after the model was wrapped",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_input_fails_clearly_on_every_rank(edge_job: JobResult, case: str) -> None:
    for rank in (0, 1):
        assert edge_job.load("edge", rank)["bad_inputs"][case].startswith(EXPECTED[case])
