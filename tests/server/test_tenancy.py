"""Two API keys train at once: batched steps, untouched neighbours, and every cross-key access refused."""

from __future__ import annotations

import threading

import pytest
from rounding import U, tiny_qwen
from server_proc import BASE_MODEL
from server_testing import TEXTS, adapter_tensors, sft_datums, tensors_hash, train_steps
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

STEPS = 4
#: eps = 1: the update is Lipschitz in the gradient (tests/server/test_ray_mode.py derives it); with the default
#: 1e-8 the batched and the lone step's reduction orders flip lr * sign(g) of near-zero gradients
ADAM = types.AdamParams(learning_rate=1e-2, eps=1.0)
#: a tenant batched with another against training alone: the same rows summed in another order (a step of at
#: most 4 rows of at most 20 tokens), step k carrying the earlier steps' rounding twice (tests/rounding.py, as
#: test_ray_mode and test_sft)
BOUND = (2 * (STEPS - 1) + 1) * tiny_qwen(seq=20, rows=4).step_bound()


def _state(server, training, name):
    """Weights and Adam moments of a tenant, read back from a save_state checkpoint."""
    from twinkle.checkpoint import safe_torch_load

    directory = server.checkpoint_dir(training.save_state(name).result().path)
    optimizer = safe_torch_load(directory / "optimizer.pt")
    moments = {f"{i}.{k}": v for i, s in optimizer["state"].items() for k, v in s.items()}
    return tensors_hash(adapter_tensors(directory)), tensors_hash(moments)


def test_concurrent_tenants_are_batched_and_match_training_alone(server, alice, bob):
    a = alice.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=11).result()
    b = bob.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=22).result()
    tokenizer = a.get_tokenizer()
    data_a, data_b = sft_datums(tokenizer, TEXTS[:2]), sft_datums(tokenizer, TEXTS[2:])

    def batched_steps() -> float:
        text = server.http("alice").get("/metrics").text
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith("twinkle_batched_steps")))

    before = batched_steps()
    losses: dict[str, list[float]] = {"a": [], "b": []}
    in_step = threading.Barrier(2, timeout=120)  # both clients send each step together (as busy tenants do)

    def loop(name, training, datums):
        for _ in range(STEPS):
            in_step.wait()
            losses[name] += train_steps(training, datums, 1, ADAM)

    threads = [threading.Thread(target=loop, args=("a", a, data_a)),
               threading.Thread(target=loop, args=("b", b, data_b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert batched_steps() > before  # the two tenants' steps ran as multi-tenant batches
    metrics = server.http("alice").get("/metrics").text  # alice sees her tenant's throughput and latencies
    rate = next(line for line in metrics.splitlines() if line.startswith("twinkle_tenant_tokens_per_second")
                and a.model_id in line)
    assert float(rate.split()[1]) > 0 and b.model_id not in metrics
    assert 'twinkle_request_latency_seconds{kind="forward_backward",quantile="0.95"}' in metrics
    together = adapter_tensors(server.checkpoint_dir(a.save_weights_for_sampler("together").result().path))

    alone = alice.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=11).result()
    initial = adapter_tensors(server.checkpoint_dir(alone.save_weights_for_sampler("initial").result().path))
    losses_alone = train_steps(alone, data_a, STEPS, ADAM)
    solo = adapter_tensors(server.checkpoint_dir(alone.save_weights_for_sampler("alone").result().path))
    assert losses["a"] == pytest.approx(losses_alone, rel=BOUND, abs=0)
    assert together.keys() == solo.keys()
    for key in solo:  # per tensor: the bound of the update, plus u |w| per stored step (as test_ray_mode)
        update = (solo[key] - initial[key]).norm().item()
        room = BOUND * update + STEPS * U * solo[key].norm().item()
        assert (together[key] - solo[key]).norm().item() <= room, key
        if "lora_B" in key:  # lora_A's share of the first steps is second order (lora_B starts at zero)
            assert update > 10 * room, (key, update, room)


def test_one_tenants_work_leaves_the_others_tensors_unchanged(server, alice, bob):
    a = alice.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=3).result()
    b = bob.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=4).result()
    datums = sft_datums(a.get_tokenizer())
    train_steps(a, datums, 1, ADAM)
    first = _state(server, a, "h0")
    path = b.save_state("b0").result().path
    train_steps(b, datums, 2, ADAM)  # b trains, saves, reloads its state and trains again: a must not notice
    b.load_state_with_optimizer(path).result()
    train_steps(b, datums, 1, ADAM)
    assert _state(server, a, "h1") == first


def _not_found(response) -> str:
    assert response.status_code == 404, response.text
    detail = response.json()["detail"]
    assert "not found (it does not exist or belongs to another API key)" in detail
    return detail


def test_every_cross_key_access_is_refused_like_a_missing_id(server, alice, bob):
    a = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=5).result()
    b = bob.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=6).result()
    datums = sft_datums(a.get_tokenizer())[:1]
    checkpoint = a.save_state("mine").result().path
    request_id = server.http("alice").post("/api/v1/save_weights", json={
        "model_id": a.model_id, "path": "other"}).json()["request_id"]
    session_id = a.model_id.split(":")[0]
    missing_model = f"{'0' * 16}:train:0"
    proto = forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn="cross_entropy"),
        model_id=a.model_id, seq_id=50)).SerializeToString()

    with server.http("bob") as http:
        for model_id in (a.model_id, missing_model):  # foreign and missing read the same
            _not_found(http.post("/api/v1/get_info", json={"model_id": model_id}))
            _not_found(http.post("/api/v1/optim_step", json={"model_id": model_id, "seq_id": 1,
                                                             "adam_params": {"learning_rate": 1e-3}}))
            _not_found(http.post("/api/v1/save_weights", json={"model_id": model_id, "path": "x", "seq_id": 1}))
            _not_found(http.post("/api/v1/unload_model", json={"model_id": model_id}))
            _not_found(http.get(f"/api/v1/training_runs/{model_id}/checkpoints"))
            _not_found(http.get(f"/api/v1/training_runs/{model_id}"))
        _not_found(http.post("/api/v1/forward_backward", content=proto,
                             headers={"Content-Type": "application/x-protobuf"}))
        for path in (checkpoint, checkpoint.replace("/mine", "/absent")):
            _not_found(http.post("/api/v1/load_weights", json={"model_id": b.model_id, "path": path, "seq_id": 1,
                                                               "optimizer": True}))
            _not_found(http.post("/api/v1/weights_info", json={"tinker_path": path}))
            _not_found(http.delete(f"/api/v1/training_runs/{a.model_id}/checkpoints/" + path.split("/", 3)[3]))
            _not_found(http.post("/api/v1/create_sampling_session", json={
                "session_id": b.model_id.split(":")[0], "sampling_session_seq_id": 9, "model_path": path}))
        _not_found(http.post("/api/v1/retrieve_future", json={"request_id": request_id}))
        _not_found(http.post("/api/v1/retrieve_future", json={"request_id": "save_weights-00"}))
        _not_found(http.post("/api/v1/session_heartbeat", json={"session_id": session_id}))
        _not_found(http.get(f"/api/v1/sessions/{session_id}"))
        assert a.model_id not in http.get("/metrics").text
        runs = http.get("/api/v1/training_runs").json()["training_runs"]
        assert {r["training_run_id"] for r in runs} >= {b.model_id} and a.model_id not in str(runs)
        assert checkpoint not in http.get("/api/v1/checkpoints").text

    # alice still has everything bob was refused
    listing = server.rest_client("alice").list_checkpoints(a.model_id).result()
    assert checkpoint in [c.tinker_path for c in listing.checkpoints]
    with server.http("alice") as http:
        assert http.post("/api/v1/retrieve_future", json={"request_id": request_id}).status_code == 200
        assert http.post("/api/v1/get_info", json={"model_id": a.model_id}).json()["model_id"] == a.model_id
