"""Unlimited models on bounded slots: idle models are paged out and back bit-exactly.

The shared server has 4 LoRA slots (server.max_tenants); 12 models train interleaved, so nearly
every step pages one model out and another in. Each must equal the same model trained alone:
the same losses and the same weights and Adam moments, bit for bit.
"""

from __future__ import annotations

import pytest
from server_proc import BASE_MODEL
from server_testing import TEXTS, adapter_tensors, sft_datums, tensors_hash, train_steps
from tinker import types

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)
STEPS = 2
#: rank, seed and texts of three kinds of model; the 12 models are 4 of each.
KINDS = [(4, 101, TEXTS[:2]), (8, 202, TEXTS[2:]), (2, 303, TEXTS[1:3])]


def _pages(server) -> dict[str, float]:
    text = server.http("alice").get("/metrics").text
    return {line.split('"')[1]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("twinkle_pages_total{")}


def _state(server, training, name: str) -> tuple[str, str]:
    from twinkle.checkpoint import safe_torch_load

    directory = server.checkpoint_dir(training.save_state(name).result().path)
    optimizer = safe_torch_load(directory / "optimizer.pt")
    moments = {f"{i}.{k}": v for i, s in optimizer["state"].items() for k, v in s.items()}
    return tensors_hash(adapter_tensors(directory)), tensors_hash(moments)


def test_twelve_models_on_four_slots_train_interleaved_exactly_as_each_alone(server, alice, bob):
    clients = []
    for i in range(12):
        owner = alice if i % 2 == 0 else bob
        rank, seed, _ = KINDS[i % 3]
        clients.append(owner.create_lora_training_client(base_model=BASE_MODEL, rank=rank, seed=seed).result())
    tokenizer = clients[0].get_tokenizer()
    data = [sft_datums(tokenizer, texts) for _, _, texts in KINDS]
    before = _pages(server)

    losses: dict[int, list[float]] = {i: [] for i in range(12)}
    for _ in range(STEPS):
        for i, training in enumerate(clients):  # round robin over 12 models on 4 slots
            losses[i] += train_steps(training, data[i % 3], 1, ADAM)
    states = [_state(server, training, "interleaved") for training in clients]
    after = _pages(server)
    assert after["out"] - before.get("out", 0) >= 12 and after["in"] - before.get("in", 0) >= 12

    for kind, (rank, seed, _) in enumerate(KINDS):
        alone = alice.create_lora_training_client(base_model=BASE_MODEL, rank=rank, seed=seed).result()
        alone_losses = train_steps(alone, data[kind], STEPS, ADAM)
        alone_state = _state(server, alone, "alone")
        for i in range(kind, 12, 3):
            assert losses[i] == alone_losses, i  # bitwise
            assert states[i] == alone_state, i
