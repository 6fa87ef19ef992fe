"""Bad input gets a proper HTTP error with the fix, and the server keeps serving everyone else."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import pytest
import tinker
from server_proc import BASE_MODEL
from server_testing import sft_datums
from tinker import types

PROTO = {"Content-Type": "application/x-protobuf"}


def _detail(response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["detail"]


def test_malformed_bodies_unknown_ids_and_bad_keys(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    with server.http("alice") as http:
        assert "not a valid protobuf" in _detail(http.post("/api/v1/forward_backward", content=b"\x0a\xff\xff\x01",
                                                           headers=PROTO), 400)
        assert "takes a protobuf" in _detail(http.post("/api/v1/forward_backward", json={"model_id": "x"}), 415)
        assert "not valid JSON" in _detail(http.post("/api/v1/optim_step", content=b"{nope",
                                                     headers={"Content-Type": "application/json"}), 400)
        assert "invalid OptimStepRequest" in _detail(http.post("/api/v1/optim_step", json={"seq_id": "x"}), 400)
        assert "not a checkpoint path" in _detail(http.post("/api/v1/load_weights", json={
            "model_id": training.model_id, "path": "/etc/passwd", "optimizer": False}), 400)
        assert "not allowed" in _detail(http.post("/api/v1/save_weights", json={
            "model_id": training.model_id, "path": "../../escape"}), 400)
        assert "not found" in _detail(http.post("/api/v1/retrieve_future", json={"request_id": "nope"}), 404)
        assert "not found" in _detail(http.post("/api/v1/get_info", json={"model_id": "zz:train:9"}), 404)
        assert "ranks 1..16" in _detail(http.post("/api/v1/create_model", json={
            "session_id": training.model_id.split(":")[0], "model_seq_id": 77, "base_model": BASE_MODEL,
            "lora_config": {"rank": 64}}), 400)
        assert "not served here" in _detail(http.post("/api/v1/create_model", json={
            "session_id": training.model_id.split(":")[0], "model_seq_id": 78, "base_model": "Qwen/Qwen3-8B",
            "lora_config": {"rank": 4}}), 400)
    for headers in ({}, {"X-API-Key": "tml-not-a-key"}, {"Authorization": "Bearer tml-wrong"}):
        response = server.http(None).post("/api/v1/client/config", json={"sdk_version": "0"}, headers=headers)
        assert "missing or unknown API key" in _detail(response, 401)
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=server.url, api_key="tml-wrong").create_lora_training_client(
            base_model=BASE_MODEL).result()
    assert server.http(None).get("/api/v1/healthz").json() == {"status": "ok"}  # health needs no key
    assert f"export TINKER_BASE_URL={server.url}" in server.log.read_text()  # how to point the client at it


def test_unloading_a_model_frees_it(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    with server.http("alice") as http:
        request = http.post("/api/v1/unload_model", json={"model_id": training.model_id}).json()["request_id"]
        answer = http.post("/api/v1/retrieve_future", json={"request_id": request}).json()
        while answer.get("type") == "try_again":
            answer = http.post("/api/v1/retrieve_future", json={"request_id": request}).json()
        assert answer == {"type": "unload_model", "model_id": training.model_id}
        assert "not found" in _detail(http.post("/api/v1/get_info", json={"model_id": training.model_id}), 404)


def test_unsupported_losses_are_refused_clearly_through_the_client(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    datums = sft_datums(training.get_tokenizer())[:1]
    with pytest.raises(tinker.BadRequestError, match="loss_fn='custom'.*not supported"):
        training.forward_backward(datums, "custom", {"loss_id": "x"}).result()
    with pytest.raises(tinker.BadRequestError, match="stable_reinforce.*not supported"):
        training.forward_backward(datums, "stable_reinforce").result()
    with pytest.raises(tinker.BadRequestError, match="clip_low_threshold"):
        training.forward_backward(datums, "ppo", {"clip_low_threshold": 2.0}).result()
    with pytest.raises(tinker.BadRequestError, match="loss_fn_config .* for 'dro'"):
        training.forward_backward(datums, "dro", {"no_such_option": 1.0}).result()
    # the model is fine afterwards
    assert training.forward_backward(datums, "cross_entropy").result().metrics["loss:sum"] > 0


def test_oversized_payloads_are_refused_while_streaming(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    big = b"\x00" * (2 * 1024 * 1024)  # the shared server takes 0.25 MiB
    with server.http("alice") as http:
        assert "over this server's limit" in _detail(http.post("/api/v1/forward_backward", content=big,
                                                               headers=PROTO), 413)

        def chunks():  # no Content-Length: the limit applies as the bytes arrive
            for _ in range(8):
                yield b"\x00" * 65536

        assert "over this server's limit" in _detail(http.post("/api/v1/forward_backward", content=chunks(),
                                                               headers=PROTO), 413)
        assert "not supported" in _detail(http.post("/api/v1/forward_backward", content=b"x", headers={
            **PROTO, "Content-Encoding": "zstd"}), 415)
    datum = types.Datum(model_input=types.ModelInput.from_ints([5] * 200),
                        loss_fn_inputs={"target_tokens": [6] * 200, "weights": [1.0] * 200})
    # ~190 KB: the client splits it into chunks under the limit, sent at once and run in order
    result = training.forward_backward([datum] * 60, "cross_entropy").result()
    assert len(result.loss_fn_outputs) == 60


def test_clients_disconnecting_mid_request_do_not_disturb_the_others(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    url = urlparse(server.url)
    key = server.keys["alice"]
    for _ in range(3):  # half a body, then gone
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(f"POST /api/v1/forward_backward HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
                         "Content-Type: application/x-protobuf\r\nContent-Length: 100000\r\n\r\n".encode()
                         + b"\x0a" * 1000)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:  # gone during a long poll
        body = b'{"request_id": "nope"}'
        sock.sendall(f"POST /api/v1/retrieve_future HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(0.5)
    assert server.alive()
    datums = sft_datums(training.get_tokenizer())[:2]
    assert training.forward_backward(datums, "cross_entropy").result().metrics["loss:sum"] > 0
    assert server.http(None).get("/api/v1/healthz").status_code == 200
