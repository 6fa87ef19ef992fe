"""Issue 13 items 1-4 on two FSDP2 ranks (one torchrun launch): refused together, unchanged, no pickle runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch import torchrun  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile_dist")
    result = torchrun(str(Path(__file__).resolve().parent / "scripts" / "hostile_dist_job.py"), [], out,
                      timeout=300)
    return [result.load("hostile", rank) for rank in (0, 1)]


def test_crafted_dcp_metadata_runs_nothing_on_any_rank(job) -> None:
    for got in job:
        assert got["pwned"] is False
        assert got["evil_metadata"].startswith("CheckpointError: Refusing"), got["evil_metadata"]


def test_one_ranks_bad_file_stops_every_rank_before_anything_changes(job) -> None:
    assert "rng_state.rank1.pt" in job[1]["bad_rank1_rng"] and "malformed" in job[1]["bad_rank1_rng"]
    assert "failed on rank(s) [1]" in job[0]["bad_rank1_rng"], job[0]["bad_rank1_rng"]


def test_distributed_save_refusals_are_unanimous(job) -> None:
    for got in job:
        assert "Refusing to replace" in got["user_dir"] and got["user_file_kept"]
        assert "non-finite" in got["nan_on_rank1"] and not got["nan_dir_exists"]
    assert "rank(s) [1]" in job[0]["nan_on_rank1"]


def test_the_good_checkpoint_still_resumes_on_both_ranks(job) -> None:
    assert all(got["good_resume_weights"] for got in job)
