"""`--infra.mode ray`: the model is twinkle's Ray actors (remote_group) and training matches the local server."""

from __future__ import annotations

import pytest
import torch
from server_proc import BASE_MODEL, SHARED_OPTIONS, start_server
from server_testing import adapter_tensors, sft_datums, train_steps
from tinker import types

ADAM = types.AdamParams(learning_rate=2e-2, eps=1e-8)


def _run(server):
    client = server.service_client("alice")
    training = client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=99).result()
    datums = sft_datums(training.get_tokenizer())
    losses = train_steps(training, datums, 3, ADAM)
    weights = adapter_tensors(server.checkpoint_dir(training.save_state("ray-check").result().path))
    client.close("success").result()
    return losses, weights


@pytest.mark.slow
def test_ray_mode_server_trains_like_the_local_one(server, tmp_path):
    ray_server = start_server(tmp_path / "work", server.keys_file, server.keys,
                              [*SHARED_OPTIONS, "--infra.mode", "ray", "--infra.num-cpus", "2"], timeout=400)
    try:
        capabilities = ray_server.rest_client().get_server_capabilities().result()
        assert capabilities.supported_models[0].sampleable is False  # the sampler needs the weights in-process
        ray_losses, ray_weights = _run(ray_server)
    finally:
        ray_server.stop()
    local_losses, local_weights = _run(server)
    assert ray_losses == pytest.approx(local_losses, rel=1e-6)
    for key in local_weights:
        torch.testing.assert_close(ray_weights[key], local_weights[key], rtol=1e-6, atol=1e-7, msg=key)
