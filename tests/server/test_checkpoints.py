"""save_state / load_state round trips continue bit-exactly; listing, deletion and weights info."""

from __future__ import annotations

import pytest
import tinker
from server_proc import BASE_MODEL
from server_testing import sft_datums, train_steps
from tinker import types

ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)


def test_save_and_load_with_optimizer_continue_bit_exactly(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=9).result()
    datums = sft_datums(training.get_tokenizer())
    train_steps(training, datums, 2, ADAM)
    path = training.save_state("after-2", user_metadata={"note": "two steps"}).result().path
    continued = train_steps(training, datums, 3, ADAM)

    training.load_state_with_optimizer(path).result()
    assert train_steps(training, datums, 3, ADAM) == continued  # bitwise: weights, Adam moments and step count restored

    resumed = alice.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.model_id != training.model_id and resumed.get_info().lora_rank == 8
    assert train_steps(resumed, datums, 3, ADAM) == continued

    weights_only = alice.create_training_client_from_state(path).result()
    fresh_adam = train_steps(weights_only, datums, 2, ADAM)
    assert fresh_adam[0] == continued[0]  # same weights ...
    assert fresh_adam[1] != continued[1]  # ... but a new optimizer
    training.load_state(path).result()
    assert train_steps(training, datums, 2, ADAM) == fresh_adam


def test_checkpoints_are_listed_described_and_deleted(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=1, train_mlp=False,
                                                  train_unembed=False).result()
    rest = server.rest_client("alice")
    state = training.save_state("s1", user_metadata={"k": "v"}).result().path
    sampler = training.save_weights_for_sampler("w1").result().path
    listed = {c.tinker_path: c for c in rest.list_checkpoints(training.model_id).result().checkpoints}
    assert set(listed) == {state, sampler}
    assert (listed[state].checkpoint_type, listed[state].user_metadata) == ("training", {"k": "v"})
    assert listed[sampler].checkpoint_type == "sampler" and listed[sampler].size_bytes > 0
    assert (server.checkpoint_dir(state) / "optimizer.pt").is_file()
    assert not (server.checkpoint_dir(sampler) / "optimizer.pt").exists()
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.lora_rank, info.train_attn, info.train_mlp, info.train_unembed) == (4, True, False, False)
    run = rest.get_training_run(training.model_id).result()
    assert run.lora_rank == 4 and run.last_checkpoint.tinker_path == state
    session = rest.get_session(training.model_id.split(":")[0]).result()
    assert training.model_id in session.training_run_ids

    with pytest.raises(tinker.RequestFailedError, match="exists; pick another name or pass overwrite=True"):
        training.save_state("s1").result()
    assert training.save_state("s1", overwrite=True).result().path == state

    rest.delete_checkpoint_from_tinker_path(state).result()
    assert [c.tinker_path for c in rest.list_checkpoints(training.model_id).result().checkpoints] == [sampler]
    assert not server.checkpoint_dir(state).exists()
    with pytest.raises(tinker.NotFoundError, match="not found"):
        training.load_state(state).result()
    with pytest.raises(tinker.NotFoundError):
        rest.delete_checkpoint_from_tinker_path(state).result()
