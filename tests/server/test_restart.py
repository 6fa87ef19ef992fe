"""SIGKILL and restart: saved state continues exactly, lost work answers an error, never hangs, and a sampling
snapshot taken before the kill samples its own weights after it (weights versions are persisted, issue 23 case 4).

Runs on the shared server: it is killed mid-work and restarted on the same work dir and port.
"""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import tinker
from server_proc import BASE_MODEL
from server_testing import sft_datums, train_steps
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)


def _busy_forward(model_id: str, seq_id: int) -> bytes:
    """A forward of ~14k tokens (just under the shared server's 0.25 MiB), to keep the worker busy a while."""
    rng = np.random.default_rng(seq_id)
    data = [types.Datum(model_input=types.ModelInput.from_ints(rng.integers(3, 2000, 250).tolist()),
                        loss_fn_inputs={"target_tokens": rng.integers(3, 2000, 250).tolist(),
                                        "weights": [1.0] * 250}) for _ in range(56)]
    message = forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
        model_id=model_id, seq_id=seq_id))
    message.forward_only = True
    return message.SerializeToString()


def _queued(server, kind: str) -> int:
    text = server.http("alice").get("/metrics").text
    return next((int(line.split()[1]) for line in text.splitlines()
                 if line.startswith(f'twinkle_queue_depth{{kind="{kind}"}}')), 0)


def test_sigkill_restart_continues_from_the_saved_state(server):
    client = server.service_client("alice")
    training = client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=21).result()
    datums = sft_datums(training.get_tokenizer())
    train_steps(training, datums, 2, ADAM)
    path = training.save_state("before-crash").result().path
    expected = train_steps(training, datums, 2, ADAM)  # what continuing from the checkpoint must give
    # a sampling snapshot of the weights at the kill: it must keep sampling exactly those after the restart
    snapshot = training.save_weights_and_get_sampling_client().result()
    probe = types.ModelInput.from_ints(training.get_tokenizer().encode("I am twinkle, a training workbench."))
    snapshot_logprobs = snapshot.compute_logprobs(probe).result()

    # work in flight at the kill: long forwards of another model, and this client's own step queued behind them
    other = client.create_lora_training_client(base_model=BASE_MODEL, rank=2).result()
    with server.http("alice") as http:
        busy = [http.post("/api/v1/forward_backward", content=_busy_forward(other.model_id, seq),
                          headers={"Content-Type": "application/x-protobuf"}).json()["request_id"]
                for seq in (1, 2, 3)]
    pending = training.forward_backward(datums, "cross_entropy")
    deadline = time.monotonic() + 60
    while _queued(server, "forward_backward") < 1:  # the client's step waits behind the forwards
        assert _queued(server, "forward") > 0 and time.monotonic() < deadline, "the forwards ended too soon"
        time.sleep(0.02)
    server.stop(signal.SIGKILL)

    server.restart()
    started = time.monotonic()
    with pytest.raises(tinker.RequestFailedError, match="lost"):
        pending.result(timeout=120)  # the client's own future: an error after the restart, not a hang
    print(f"the lost future answered {time.monotonic() - started:.1f}s after the restart")
    with server.http("alice") as http:
        answer = http.post("/api/v1/retrieve_future", json={"request_id": busy[-1]}).json()
        assert answer["category"] == "server" and "lost" in answer["error"]

    # the old training client's model is back in a slot, but must load its state first
    with pytest.raises(tinker.BadRequestError, match="load_state"):
        training.forward_backward(datums, "cross_entropy").result()
    training.load_state_with_optimizer(path).result()
    assert train_steps(training, datums, 2, ADAM) == expected

    # further steps after the restart (other data, another lr): the old snapshot still samples its own weights,
    # loaded from its saved files, though the live model has taken as many steps as before the kill
    train_steps(training, datums[:1], 1, types.AdamParams(learning_rate=5e-2, eps=1e-8))
    # exact: the same saved weights scored by the same operations on this machine (as the losses above)
    assert snapshot.compute_logprobs(probe).result()[1:] == snapshot_logprobs[1:]

    fresh = server.service_client("alice")
    resumed = fresh.create_training_client_from_state_with_optimizer(path).result()
    assert train_steps(resumed, datums, 2, ADAM) == expected
    listed = server.rest_client("alice").list_checkpoints(training.model_id).result().checkpoints
    assert path in [c.tinker_path for c in listed]
    fresh.close("success").result()
    client.close("success").result()
