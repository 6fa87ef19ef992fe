"""FSDP2 runtime on 2 (and 4) CPU ranks: fp16 skips agreed by every rank, gradients that stay sharded
between micro-batches, loading that reads only each rank's shards, accelerate's mixed precision and
process-wide state, and seed 000/001's dp x fsdp mesh with the default strategy (issue 12 §2-§5).

References are independent of the code under test where it matters: the single-process run of the same
scenario (a plain ``from_pretrained`` load, no sharding), and the ranks compared with each other.
"""

from __future__ import annotations

import pytest
import torch
from dist_bounds import assert_trained_alike, run_bound
from scenarios import reference

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)


@pytest.fixture
def at_job(training_job, monkeypatch):
    """The single-process reference reads the same saved checkpoint as the torchrun job."""
    monkeypatch.setenv("DIST_TEST_OUT", str(training_job.out_dir))
    return training_job


def _equal(a: dict, b: dict) -> list[str]:
    assert sorted(a) == sorted(b)
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("name,world", [("fsdp_fp16_skip", 2), ("hsdp_fp16_skip", 4)])
def test_an_fp16_overflow_in_one_ranks_shard_skips_the_step_on_every_rank(name: str, world: int, request) -> None:
    job = request.getfixturevalue("training_job" if world == 2 else "hsdp_job")
    ranks = [job.load(name, r) for r in range(world)]
    for got in ranks:  # the last rank alone held the inf; all skipped step 2 (scale halved, no step, no lr change)
        assert got["scales"] == [256.0, 128.0, 128.0]
        assert got["steps"] == [1, 1, 2] and got["lrs"] == [0.005, 0.005, 0.0025]
        assert got["skipped_steps"] == 1
        assert _equal(got["before"], got["after_skip"]) == []  # full weights untouched by the skipped step
        assert _equal(got["local_before"], got["local_after_skip"]) == []  # this rank's own shards too
    for key in ("before", "after_skip", "final"):  # bit-identical across ranks, and the next step trained
        for other in ranks[1:]:
            assert _equal(ranks[0][key], other[key]) == []
    # AdamW with eps=1 (scripts/scenarios.py) at lr 5e-3 moves a weight by less than lr: 1e-4 is far beyond rounding
    assert max((ranks[0]["final"][k] - ranks[0]["before"][k]).abs().max() for k in ranks[0]["final"]) > 1e-4


def test_fsdp_gradients_stay_sharded_between_micro_batches_with_the_same_losses(training_job) -> None:
    """Default: reduce-scatter every micro-batch, a rank holds ~1/2 of the model's gradient bytes; the
    no-sync opt-in holds the whole (unsharded) gradient. Both train like one process."""
    default = [training_job.load("fsdp_grad_memory", r) for r in (0, 1)]
    nosync = [training_job.load("fsdp_grad_memory_nosync", r) for r in (0, 1)]
    want = reference("fsdp_grad_memory")
    for got in default:
        assert got["grad_bytes_between"] / got["model_bytes"] == pytest.approx(0.5, abs=0.02)
    for got in nosync:
        assert got["grad_bytes_between"] / got["model_bytes"] == pytest.approx(1.0, abs=0.02)
    for got in default + nosync:  # the probe step and 3 more, initial weights taken before the probe
        assert_trained_alike(got, want, steps=4)


@pytest.mark.parametrize("name", ["load_fsdp_full", "load_accel_full", "load_fsdp_lora_bf16",
                                  "load_accel_lora_bf16", "load_fsdp_tied"])
def test_sharded_load_gives_the_weights_of_a_plain_load(name: str, at_job) -> None:
    """Built on meta and filled shard by shard from the files: bit-identical to one process's plain load
    (LoRA's initial weights included: same seed, same values); frozen base weights in bf16 under LoRA+bf16."""
    want = reference(name)
    assert not want["built_on_meta"]
    for rank in (0, 1):
        got = at_job.load(name, rank)
        assert got["built_on_meta"] and got["wrapped"] in ("fsdp2", "accelerate_fsdp2")
        assert _equal(got["initial"], want["initial"]) == []
        assert _equal(got["buffers"], want["buffers"]) == []  # rotary inv_freq survived to_empty
        assert got["dtypes"] == want["dtypes"] and got["tied"] == want["tied"] == name.endswith("tied")
        if "bf16" in name:  # bf16 compute, FSDP2 casts where one process autocasts: measured, ~1 bf16 ulp of 4.8
            assert got["losses"] == pytest.approx(want["losses"], abs=2e-2, rel=0)
        else:  # float32: the derived bound of a 2-step run (dist_bounds.py)
            assert got["losses"] == pytest.approx(want["losses"], rel=run_bound(2), abs=0)
    if "bf16" in name:
        assert want["dtypes"] == [("torch.bfloat16", False), ("torch.float32", True)]


def test_accelerate_all_gathers_in_bf16_and_leaves_its_global_state_alone(training_job) -> None:
    got = training_job.load("accel_state", 0)
    assert got["policies"] == [("torch.bfloat16", "torch.bfloat16")]  # accelerate's own bf16 policy
    assert got["after"] == got["before"]
    assert all("distributed_type" not in state for state in got["after"]["shared"])
    assert "ACCELERATE_USE_FSDP" not in got["after"]["env"]


@pytest.mark.parametrize("name", ["hsdp_default_strategy", "hsdp_accum"])
def test_seed_mesh_dp2_fsdp2_trains_like_one_process(name: str, hsdp_job) -> None:
    """DeviceMesh.from_sizes(dp_size=2, fsdp_size=2) with the default strategy runs HSDP (native FSDP2);
    accumulation reduce-scatters each micro-batch and all-reduces across replicas at the boundary."""
    want = reference(name)
    for rank in range(4):
        got = hsdp_job.load(name, rank)
        assert got["layout"] == ((2, 2), ["R", "S(0)"]) and got["wrapped"] == "fsdp2"
        assert_trained_alike(got, want, len(want["metrics"]), rows=8 if name == "hsdp_accum" else 4)


def test_hsdp_sharded_load_gives_the_plain_weights(hsdp_job, monkeypatch) -> None:
    monkeypatch.setenv("DIST_TEST_OUT", str(hsdp_job.out_dir))
    want = reference("hsdp_load_lora_bf16")
    for rank in range(4):
        got = hsdp_job.load("hsdp_load_lora_bf16", rank)
        assert got["built_on_meta"]
        assert _equal(got["initial"], want["initial"]) == []
        assert got["losses"] == pytest.approx(want["losses"], abs=2e-2, rel=0)  # bf16: measured, as above
