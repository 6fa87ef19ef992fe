"""Issue 13 item 1: a crafted DCP checkpoint never runs code on resume (metadata pickle, byte values)."""

from __future__ import annotations

import pytest
import torch
from hf_testing import model_state_hash
from hostile_testing import Payload, lora_model, train_step, write_payload

from twinkle.checkpoint import CheckpointError


@pytest.fixture
def sharded(tmp_path):
    """A LoRA model one step in and its sharded (DCP) checkpoint, written the way a torchrun save writes it."""
    from twinkle_hf.distributed import checkpoint as dist_ckpt

    model = lora_model()
    train_step(model, 0)
    directory = tmp_path / "ckpt"
    directory.mkdir()
    group = model.optimizer_group["sft"]
    dist_ckpt.save_sharded(model.backend, group, directory, save_optimizer=True)
    train_step(model, 1)  # the live model now differs from the checkpoint
    return model, group, directory


def test_malicious_model_metadata_is_refused_and_runs_nothing(sharded, tmp_path) -> None:
    from twinkle_hf.distributed import checkpoint as dist_ckpt

    model, group, directory = sharded
    marker = tmp_path / "pwned"
    write_payload(directory / "dcp_model" / ".metadata", marker)
    before = model_state_hash(model)
    with pytest.raises(CheckpointError, match=r"Refusing .*dcp_model/\.metadata.*never executes pickled code"):
        dist_ckpt.read_sharded(model.backend, group, directory, with_optimizer=True)
    assert not marker.exists()
    assert model_state_hash(model) == before


def test_malicious_byte_value_in_optimizer_shards_is_refused(sharded, tmp_path) -> None:
    """DCP loads non-tensor values (lr, betas) with weights_only=False; a payload there must not run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from twinkle_hf.distributed import checkpoint as dist_ckpt

    model, group, directory = sharded
    marker = tmp_path / "pwned"
    state = get_optimizer_state_dict(model.model, [group.optimizer])
    state["param_groups"][0]["lr"] = Payload(marker)
    dcp.save(state, checkpoint_id=str(directory / "dcp_optimizer"))
    before = model_state_hash(model)
    with pytest.raises(CheckpointError, match="not a plain value"):
        dist_ckpt.read_sharded(model.backend, group, directory, with_optimizer=True)
    assert not marker.exists()
    assert model_state_hash(model) == before


def test_metadata_pointing_outside_the_checkpoint_is_refused(sharded) -> None:
    import pickle

    from twinkle.checkpoint.dcp_safe import read_dcp_metadata

    _, _, directory = sharded
    path = directory / "dcp_model" / ".metadata"
    metadata = read_dcp_metadata(directory / "dcp_model")
    for info in metadata.storage_data.values():
        info.relative_path = "../../etc/passwd"
    path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="points outside the checkpoint"):
        read_dcp_metadata(directory / "dcp_model")


def test_a_clean_sharded_checkpoint_still_resumes_exactly(sharded) -> None:
    from twinkle_hf.distributed import checkpoint as dist_ckpt
    from twinkle_hf.model.weights import adapter_state_dict

    model, group, directory = sharded
    reference = lora_model()
    train_step(reference, 0)  # the state the checkpoint holds
    staged = dist_ckpt.read_sharded(model.backend, group, directory, with_optimizer=True)
    dist_ckpt.apply_sharded(model.backend, group, directory, staged)
    got, want = adapter_state_dict(model.model, "sft"), adapter_state_dict(reference.model, "sft")
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert group.optimizer.state_dict()["state"].keys() == reference.optimizer_group["sft"].optimizer.state_dict()[
        "state"].keys()


def test_megatron_optimizer_dist_checkpoint_is_checked_before_megatron_reads_it(tmp_path) -> None:
    pytest.importorskip("megatron.core")
    from twinkle_megatron.model import dist_ckpt

    target = tmp_path / dist_ckpt.OPTIMIZER_DIR
    target.mkdir()
    marker = tmp_path / "pwned"
    write_payload(target / ".metadata", marker)

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the model/driver was used ({name}) before the checkpoint was checked")

    with pytest.raises(CheckpointError, match="never executes pickled code"):
        dist_ckpt.load_optimizer(Untouchable(), tmp_path)
    assert not marker.exists()
