"""Checkpoint lifecycle: TTLs set expires_at and the server deletes what expired; sampling snapshots are sampler
checkpoints (listed, deletable, expiring); publishing answers a 400 saying it is not supported."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
import tinker
from server_proc import BASE_MODEL
from tinker import types


def _listed(server, training) -> dict[str, object]:
    listed = server.rest_client("alice").list_checkpoints(training.model_id).result().checkpoints
    return {c.tinker_path: c for c in listed}


def test_ttls_set_expiry_and_expired_checkpoints_are_deleted(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=4).result()
    rest = server.rest_client("alice")
    kept = training.save_state("kept").result().path
    short = training.save_state("short", ttl_seconds=3600).result().path
    listed = _listed(server, training)
    assert listed[kept].expires_at is None
    left = (listed[short].expires_at - datetime.now(timezone.utc)).total_seconds()
    assert 3500 < left <= 3600

    rest.set_checkpoint_ttl_from_tinker_path(kept, 7200).result()
    assert _listed(server, training)[kept].expires_at is not None
    rest.set_checkpoint_ttl_from_tinker_path(kept, None).result()
    assert _listed(server, training)[kept].expires_at is None

    rest.set_checkpoint_ttl_from_tinker_path(short, 1).result()
    time.sleep(1.5)
    assert short not in _listed(server, training)  # expired: no longer listed or loadable
    with pytest.raises(tinker.NotFoundError):
        training.load_state(short).result()
    deadline = time.monotonic() + 30  # the housekeeping pass (every 5 s) deletes its files
    while server.checkpoint_dir(short).exists():
        assert time.monotonic() < deadline, "the expired checkpoint's files were not deleted"
        time.sleep(0.5)
    assert server.checkpoint_dir(kept).exists()

    with pytest.raises(tinker.BadRequestError, match="publishing checkpoints is not supported"):
        rest.publish_checkpoint_from_tinker_path(kept).result()
    with pytest.raises(tinker.BadRequestError, match="publishing checkpoints is not supported"):
        rest.unpublish_checkpoint_from_tinker_path(kept).result()


def test_sampling_snapshots_are_listed_deletable_and_expire(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=6).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints([5, 6, 7])
    assert len(sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result().sequences) == 1
    snapshots = {p: c for p, c in _listed(server, training).items() if "/sampler_weights/snapshot-" in p}
    assert len(snapshots) == 1
    (path, snapshot), = snapshots.items()
    assert snapshot.checkpoint_type == "sampler" and snapshot.expires_at is not None  # server.snapshot_ttl_s
    server.rest_client("alice").delete_checkpoint_from_tinker_path(path).result()
    assert not server.checkpoint_dir(path).exists()
    with pytest.raises(tinker.NotFoundError, match="were deleted or expired"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
