"""`--infra.mode ray`: the model is twinkle's Ray actors (remote_group) and training matches the local server."""

from __future__ import annotations

import pytest
import torch
from rounding import U, tiny_qwen
from server_proc import BASE_MODEL, SHARED_OPTIONS, start_server
from server_testing import adapter_tensors, sft_datums, train_steps
from tinker import types

#: Adam with ``eps = 1``: the update ``lr * m / (sqrt(v) + eps)`` is Lipschitz in the gradient with constant
#: at most ``2 lr / eps`` (``d/dg [g / (|g| + eps)] = eps / (|g| + eps)**2 <= 1 / eps``, and as much again
#: through ``v``), so rounding of a gradient moves an update by at most twice what it moves SGD's. With the
#: protocol's default ``eps = 1e-8`` the update of a near-zero gradient is ``lr * sign(g)``, which the other
#: process's reduction order can flip: no bound holds (the reason the parity tests run SGD).
ADAM = types.AdamParams(learning_rate=5e-2, eps=1.0)
STEPS = 3

#: One step's loss or gradient differs between two float32 summation orders (the actors run one intra-op
#: thread, the local server two) by at most ``tiny_qwen(...).step_bound()`` relative (tests/rounding.py: 4
#: rows of at most 20 tokens, ~8e-5). Step k carries the rounding of the k - 1 steps that made its weights,
#: twice each (the Lipschitz constant above), and its own: the last step's ``2 (STEPS - 1) + 1`` times the
#: step's bound covers every value of the run.
BOUND = (2 * (STEPS - 1) + 1) * tiny_qwen(seq=20, rows=4).step_bound()


def _run(server):
    client = server.service_client("alice")
    training = client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=99).result()
    initial = adapter_tensors(server.checkpoint_dir(training.save_state("ray-init").result().path))
    datums = sft_datums(training.get_tokenizer())
    losses = train_steps(training, datums, STEPS, ADAM)
    weights = adapter_tensors(server.checkpoint_dir(training.save_state("ray-check").result().path))
    client.close("success").result()
    return losses, initial, weights


@pytest.mark.slow
def test_ray_mode_server_trains_like_the_local_one(server, tmp_path):
    ray_server = start_server(tmp_path / "work", server.keys_file, server.keys,
                              [*SHARED_OPTIONS, "--infra.mode", "ray", "--infra.num-cpus", "2"], timeout=400)
    try:
        capabilities = ray_server.rest_client().get_server_capabilities().result()
        assert capabilities.supported_models[0].sampleable is False  # the sampler needs the weights in-process
        ray_losses, ray_initial, ray_weights = _run(ray_server)
    finally:
        ray_server.stop()
    local_losses, initial, local_weights = _run(server)
    # the same data every step: a step's change of the loss is what the bound must stay far below
    step_change = min(abs(a - b) for a, b in zip(local_losses, local_losses[1:]))
    assert BOUND * max(local_losses) < step_change / 10, (BOUND, local_losses)
    assert ray_losses == pytest.approx(local_losses, rel=BOUND)
    assert ray_initial.keys() == initial.keys() == local_weights.keys()
    for key in local_weights:
        assert torch.equal(ray_initial[key], initial[key]), key  # one seed, one initial adapter
        update = (local_weights[key] - initial[key]).norm().item()
        # per tensor: the update's relative bound, plus the float32 storage of each step's weight (which way
        # it rounds can differ once the update differs: u * |w| per step)
        room = BOUND * update + STEPS * U * local_weights[key].norm().item()
        assert (ray_weights[key] - local_weights[key]).norm().item() <= room, key
        if "lora_B" in key:  # lora_A's share of the first steps is second order (lora_B starts at zero)
            assert update > 10 * STEPS * room, (key, update, room)  # one step moved it far beyond the bound
