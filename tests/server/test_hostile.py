"""Hostile numbers and shapes: refused before they cost anything, named in a 400, the tenant left as it was.

Each test is one case found against the service (issue 23): a tiny body declaring a huge sparse
tensor, non-finite or absurd AdamParams, datum values that overflow the loss, out-of-range token
ids, ids the server cannot store, deeply nested JSON. Fairness under a heavy sampler is in
test_fairness.py, the restart case in test_restart.py.
"""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
import tinker
from server_proc import BASE_MODEL
from server_testing import sft_datums, train_steps
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto

PROTO = {"Content-Type": "application/x-protobuf"}
ADAM = types.AdamParams(learning_rate=1e-2)


def _detail(response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["detail"]


def _peak_rss_kb(server) -> int:
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _sparse_bomb(model_id: str, seq_id: int) -> bytes:
    """~150 bytes declaring target_tokens of shape [1, 250M] with one value (the client's sparse encoding allows it)."""
    message = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray([5, 6, 7], dtype=np.int32).tobytes()
    tensor = datum.loss_fn_inputs["target_tokens"]
    tensor.dtype = pb.DTYPE_INT64
    tensor.shape.extend([1, 250_000_000])
    tensor.sparse_csr.values = np.asarray([6], dtype=np.int64).tobytes()
    tensor.sparse_csr.crow_indices = np.asarray([0, 1], dtype=np.int64).tobytes()
    tensor.sparse_csr.col_indices = np.asarray([249_999_999], dtype=np.int64).tobytes()
    return message.SerializeToString()


def test_a_tiny_body_declaring_a_huge_sparse_tensor_is_refused_unexpanded_and_healthz_keeps_answering(server, alice):
    """Case 1: the declared shape is checked against the datum before anything is built; decoding runs off the
    event loop, so /healthz answers within 1 s (the issue's bound) while bodies are decoded and the worker is busy."""
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    body = _sparse_bomb(training.model_id, 1)
    assert len(body) < 200
    before = _peak_rss_kb(server)
    with server.http("alice") as http:
        response = http.post("/api/v1/forward_backward", content=body, headers=PROTO)
    grown = _peak_rss_kb(server) - before
    assert grown < 200_000, f"peak memory grew by {grown} KB"  # the 2 GB the expansion took is never allocated
    detail = _detail(response, 400)
    assert "shape [1, 250000000]" in detail and "for 3 input tokens" in detail

    # busy: bombs and a long forward arrive together; /healthz is polled meanwhile
    stop = threading.Event()

    def bombard():
        with server.http("alice") as http:
            while not stop.is_set():
                http.post("/api/v1/forward_backward", content=body, headers=PROTO)

    threads = [threading.Thread(target=bombard) for _ in range(3)]
    for thread in threads:
        thread.start()
    forward = training.forward(sft_datums(training.get_tokenizer()) * 8, "cross_entropy")
    latencies = []
    try:
        with httpx.Client(base_url=server.url, timeout=30) as plain:
            for _ in range(10):
                started = time.monotonic()
                assert plain.get("/api/v1/healthz").status_code == 200
                latencies.append(time.monotonic() - started)
                time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    forward.result()
    print(f"healthz while busy: max {max(latencies):.3f}s")
    assert max(latencies) < 1.0


@pytest.mark.parametrize("field,value", [("learning_rate", float("inf")), ("learning_rate", 1e30),
                                         ("eps", float("nan")), ("weight_decay", float("nan")),
                                         ("learning_rate", -1.0), ("beta2", 1.0), ("eps", 0.0)])
def test_adam_params_must_be_finite_and_in_range(server, alice, field, value):
    """Case 2: inf/NaN/absurd AdamParams are a 400 naming the field; the tenant trains and saves normally after."""
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=3).result()
    datums = sft_datums(training.get_tokenizer())[:2]
    training.forward_backward(datums, "cross_entropy").result()
    params = types.AdamParams(learning_rate=1e-2).model_dump()
    params[field] = value
    with server.http("alice") as http:
        response = http.post("/api/v1/optim_step", content=_json({"model_id": training.model_id, "seq_id": 3,
                                                                  "adam_params": params}),
                             headers={"Content-Type": "application/json"})
    detail = _detail(response, 400)
    assert f"AdamParams.{field}=" in detail and "must be finite" in detail
    assert train_steps(training, datums, 1, ADAM)[0] > 0  # unchanged and still training
    training.save_state("after-bad-adam").result()


def _json(value) -> bytes:
    import json

    return json.dumps(value).encode()  # allow_nan: what a careless client sends


def test_datum_values_that_overflow_the_loss_are_refused_and_non_finite_results_stay_encodable(server, alice):
    """Case 5: weights of 3e38 are a 400 naming datum and position; an inf loss reachable with bounded inputs
    comes back encodable (protobuf to the client, strings in JSON), its optim_step is refused and changes nothing."""
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=8).result()
    datums = sft_datums(training.get_tokenizer())[:2]
    bad = types.Datum(model_input=datums[0].model_input, loss_fn_inputs={
        "target_tokens": datums[0].loss_fn_inputs["target_tokens"],
        "weights": [3e38] * datums[0].model_input.length})
    with pytest.raises(tinker.BadRequestError, match=r"data\[0\]\.loss_fn_inputs\['weights'\]: 3e\+38 at position 0"):
        training.forward_backward([bad], "cross_entropy").result()

    reference = training.save_state("before-overflow").result().path
    tokens = datums[0].model_input.to_ints() + [5]
    n = len(tokens) - 1
    overflow = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                           loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [-1e5] * n,
                                           "advantages": [1.0] * n})
    result = training.forward_backward([overflow], "importance_sampling").result()
    assert not np.isfinite(result.metrics["loss:sum"])
    with pytest.raises(tinker.RequestFailedError, match="optim_step refused: the gradient norm is"):
        training.optim_step(ADAM).result()
    # a plain JSON client gets the same result as strict JSON
    proto = forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[overflow], loss_fn="importance_sampling"),
        model_id=training.model_id, seq_id=0))
    proto.forward_only = True
    with server.http("alice") as http:
        request_id = http.post("/api/v1/forward_backward", content=proto.SerializeToString(),
                               headers=PROTO).json()["request_id"]
        answer = http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
        while answer.get("type") == "try_again":
            answer = http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
    assert answer["metrics"]["loss:sum"] in ("Infinity", "-Infinity", "NaN")
    # the refused step left the tenant as it was: it continues exactly like its saved state
    again = alice.create_training_client_from_state_with_optimizer(reference).result()
    assert train_steps(training, datums, 2, ADAM) == train_steps(again, datums, 2, ADAM)


def test_token_ids_out_of_range_are_a_400_naming_datum_and_position(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    vocab = len(training.get_tokenizer())
    good = [5, 6, 7, 8]
    cases = [
        (types.Datum(model_input=types.ModelInput.from_ints([5, vocab + 10, 7]),
                     loss_fn_inputs={"target_tokens": [6, 7, 8]}), r"data\[1\]\.model_input: token \d+ at position 1"),
        (types.Datum(model_input=types.ModelInput.from_ints(good[:3]),
                     loss_fn_inputs={"target_tokens": [6, 7, 10**9]}),
         r"data\[1\]\.loss_fn_inputs\['target_tokens'\]: token 1000000000 at position 2"),
        (types.Datum(model_input=types.ModelInput.from_ints(good[:3]),
                     loss_fn_inputs={"target_tokens": [6, -1, 8]}), r"token -1 at position 1"),
    ]
    ok = types.Datum(model_input=types.ModelInput.from_ints(good[:3]), loss_fn_inputs={"target_tokens": good[1:]})
    for datum, words in cases:
        with pytest.raises(tinker.BadRequestError, match=words):
            training.forward_backward([ok, datum], "cross_entropy").result()
    sampler = alice.create_sampling_client(base_model=BASE_MODEL).result()
    with pytest.raises(tinker.BadRequestError, match="prompt: token .* out of range"):
        sampler.sample(types.ModelInput.from_ints([5, vocab]), 1, types.SamplingParams(max_tokens=2)).result()
    assert training.forward_backward([ok], "cross_entropy").result().metrics["loss:sum"] > 0


def test_bad_ids_nesting_and_caps_are_refused_with_the_option_to_change(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
    session_id = training.model_id.split(":")[0]
    with server.http("alice") as http:
        for seq_id in (-1, 10**10):
            detail = _detail(http.post("/api/v1/create_model", json={
                "session_id": session_id, "model_seq_id": seq_id, "base_model": BASE_MODEL,
                "lora_config": {"rank": 4}}), 400)
            assert f"model_seq_id={seq_id}" in detail
        nested = b'{"model_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        assert "nests deeper than" in _detail(http.post("/api/v1/optim_step", content=nested,
                                                        headers={"Content-Type": "application/json"}), 400)
        unknown = http.post("/api/v1/no_such_route", json={})
        assert "not a route of the Tinker API" in _detail(unknown, 404)
        assert "not supported by this server" in _detail(http.post("/api/v1/copy_weights", json={}), 400)
    sampler = alice.create_sampling_client(base_model=BASE_MODEL).result()
    with pytest.raises(tinker.BadRequestError, match=r"num_samples=4096 .*server\.max_num_samples"):
        sampler.sample(types.ModelInput.from_ints([5, 6]), 4096, types.SamplingParams(max_tokens=120)).result()
    with pytest.raises(tinker.BadRequestError, match=r"server\.max_length"):
        sampler.sample(types.ModelInput.from_ints([5, 6]), 1, types.SamplingParams(max_tokens=10_000)).result()
