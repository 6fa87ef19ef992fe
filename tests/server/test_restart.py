"""SIGKILL and restart: saved state continues exactly, lost work answers an error, never hangs."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import tinker
from conftest import BASE_MODEL, make_keys, start_server
from server_testing import sft_datums
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)
OPTIONS = ["--server.max-tenants", "3", "--server.max-rank", "8", "--server.seed", "3", "--server.max-length", "512"]


def _steps(training, datums, n):
    losses = []
    for _ in range(n):
        fwd = training.forward_backward(datums, "cross_entropy")
        training.optim_step(ADAM).result()
        losses.append(fwd.result().metrics["loss:sum"])
    return losses


def _big_step(model_id: str, seq_id: int) -> bytes:
    """A forward_backward heavy enough (~48k tokens) to keep the worker busy for a while."""
    rng = np.random.default_rng(0)
    data = [types.Datum(model_input=types.ModelInput.from_ints(rng.integers(3, 2000, 500).tolist()),
                        loss_fn_inputs={"target_tokens": rng.integers(3, 2000, 500).tolist(),
                                        "weights": [1.0] * 500}) for _ in range(96)]
    return forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
        model_id=model_id, seq_id=seq_id)).SerializeToString()


def test_sigkill_restart_continues_from_the_saved_state(tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys = make_keys(keys_file)
    server = start_server(tmp_path / "work", keys_file, keys, OPTIONS)
    try:
        client = server.service_client("alice")
        training = client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=21).result()
        datums = sft_datums(training.get_tokenizer())
        _steps(training, datums, 2)
        path = training.save_state("before-crash").result().path
        expected = _steps(training, datums, 2)  # what continuing from the checkpoint must give

        # work in flight at the kill: a long step of another model, then this client's own step behind it
        other = client.create_lora_training_client(base_model=BASE_MODEL, rank=2).result()
        with server.http("alice") as http:
            busy = http.post("/api/v1/forward_backward", content=_big_step(other.model_id, 1),
                             headers={"Content-Type": "application/x-protobuf"}).json()["request_id"]
        pending = training.forward_backward(datums, "cross_entropy")
        time.sleep(1.0)
        server.stop(signal.SIGKILL)

        server = start_server(server.work_dir, keys_file, keys, OPTIONS)
        started = time.monotonic()
        with pytest.raises(tinker.RequestFailedError, match="lost"):
            pending.result(timeout=120)  # the client's own future: an error after the restart, not a hang
        print(f"lost future answered {time.monotonic() - started:.1f}s after the restart")
        with server.http("alice") as http:
            answer = http.post("/api/v1/retrieve_future", json={"request_id": busy}).json()
            assert answer["category"] == "server" and "lost" in answer["error"]

        # the old training client's model is back in a slot but must be loaded first
        with pytest.raises(tinker.BadRequestError, match="load_state"):
            training.forward_backward(datums, "cross_entropy").result()
        training.load_state_with_optimizer(path).result()
        assert _steps(training, datums, 2) == expected

        fresh = server.service_client("alice")
        resumed = fresh.create_training_client_from_state_with_optimizer(path).result()
        assert _steps(resumed, datums, 2) == expected
        listed = server.rest_client("alice").list_checkpoints(training.model_id).result().checkpoints
        assert path in [c.tinker_path for c in listed]
        fresh.close("success").result()
        client.close("success").result()
    finally:
        server.stop()
