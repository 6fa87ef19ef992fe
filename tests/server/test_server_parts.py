"""The service's parts without a model: paths, keys, wire format, ordering/batching, registry, metrics."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from twinkle.config import ConfigError
from twinkle_server.auth import KeyStore, add_key, hash_key, key_from_headers
from twinkle_server.futures import FutureTable, Result
from twinkle_server.metrics import Metrics, percentile
from twinkle_server.paths import CheckpointDirs, PathError, parse_checkpoint_id, parse_tinker_path
from twinkle_server.scheduler import Scheduler, Work
from twinkle_server.store import Store
from twinkle_server.wire import (
    Limits,
    Sampled,
    WireError,
    decode_step_request,
    forward_backward_output,
    sample_response,
)

MODEL = "abc123:train:0"


# ------------------------------------------------------------------------------ paths
@pytest.mark.parametrize("path", [
    "tinker://abc123:train:0/weights/../../etc", "tinker://abc123:train:0/weights/a/b", "tinker://../weights/x",
    "tinker://abc123:train:0/optimizer/x", "/etc/passwd", "tinker://abc123:train:0/weights/.hidden",
    "tinker://abc123:train:0/weights/", "tinker://abc/123:train:0/weights/x", "file:///tmp/x",
])
def test_checkpoint_paths_that_could_escape_are_refused(path):
    with pytest.raises(PathError):
        parse_tinker_path(path)


def test_checkpoint_paths_map_inside_the_work_dir_only(tmp_path):
    dirs = CheckpointDirs(tmp_path / "work")
    ref = parse_tinker_path(f"tinker://{MODEL}/sampler_weights/step-1")
    assert (ref.kind, ref.name, ref.checkpoint_id, ref.checkpoint_type) == ("sampler_weights", "step-1",
                                                                           "sampler_weights/step-1", "sampler")
    assert ref.tinker_path == f"tinker://{MODEL}/sampler_weights/step-1"
    directory = dirs.directory(ref)
    assert dirs.root in directory.parents and directory.name == "step-1"
    assert parse_checkpoint_id(MODEL, "weights/a.b-c_1").name == "a.b-c_1"
    with pytest.raises(PathError):
        parse_checkpoint_id(MODEL, "weights/../../x")
    # a symlink planted inside the work dir must not lead outside it
    outside = tmp_path / "outside"
    outside.mkdir()
    dirs.kind_dir(MODEL, "weights").mkdir(parents=True)
    os.symlink(outside, dirs.kind_dir(MODEL, "weights") / "link")
    with pytest.raises(PathError, match="outside"):
        dirs.directory(parse_tinker_path(f"tinker://{MODEL}/weights/link"))


# ------------------------------------------------------------------------------- keys
def test_keys_are_stored_hashed_and_map_to_their_owner(tmp_path):
    path = tmp_path / "keys.txt"
    alice, bob = add_key(path, "alice"), add_key(path, "bob")
    text = path.read_text()
    assert alice.startswith("tml-") and alice not in text and bob not in text
    assert hash_key(alice) in text and oct(path.stat().st_mode)[-3:] == "600"
    keys = KeyStore.from_file(path)
    assert keys.owner(alice) == "alice" and keys.owner(bob) == "bob"
    assert keys.owner(alice + "x") is None and keys.owner("") is None and keys.owner(None) is None
    assert key_from_headers(None, f"Bearer {bob}") == bob and key_from_headers(alice, "Bearer x") == alice
    with pytest.raises(ConfigError, match="already has a key"):
        add_key(path, "alice")


@pytest.mark.parametrize("text,words", [("alice tml-rawkeyinthefile\n", "not a raw key"), ("", "holds no keys"),
                                        (f"a {'0' * 64}\na {'1' * 64}\n", "appears twice")])
def test_bad_keys_files_are_refused_with_the_fix(tmp_path, text, words):
    path = tmp_path / "keys.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        KeyStore.from_file(path)
    with pytest.raises(ConfigError, match="twinkle serve keygen"):
        KeyStore.from_file(tmp_path / "missing.txt")


# ------------------------------------------------------------------------------- wire
def _request(data, loss_fn="ppo", config=None):
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id=MODEL, seq_id=7)
    return forward_backward_request_to_proto(request)


def test_forward_backward_requests_decode_from_the_clients_own_encoding():
    dense = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0.0, 1.0, 0.5],
                                        "logprobs": [-1.0, -2.0, -3.0], "advantages": [0.5, 0.5, 0.5]})
    sparse = types.Datum(model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[9, 10]),
                                                              types.EncodedTextChunk(tokens=[11])]),
                         loss_fn_inputs={"target_tokens": [10, 11, 12],
                                         "weights": types.TensorData(data=[2.0], dtype="float32", shape=[1, 3],
                                                                     sparse_crow_indices=[0, 1],
                                                                     sparse_col_indices=[2])})
    message = _request([dense, sparse], config={"clip_low_threshold": 0.7, "clip_high_threshold": 1.3})
    message.forward_only = True
    step = decode_step_request(message.SerializeToString(), Limits(max_length=16, max_tokens=64))
    assert (step.model_id, step.seq_id, step.loss_fn, step.forward_only) == (MODEL, 7, "ppo", True)
    # the config travels as float32: within u = 6e-8 relative of the Python float, inside approx's 1e-6
    assert step.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7), "clip_high_threshold": pytest.approx(1.3)}
    assert step.rows[0] == {"input_ids": [5, 6, 7], "target_tokens": [6, 7, 8], "weights": [0.0, 1.0, 0.5],
                            "logprobs": [-1.0, -2.0, -3.0], "advantages": [0.5, 0.5, 0.5]}
    assert step.rows[1] == {"input_ids": [9, 10, 11], "target_tokens": [10, 11, 12], "weights": [0.0, 0.0, 2.0]}
    assert step.num_tokens == 6


@pytest.mark.parametrize("body,words", [
    (b"\xff\xff\xff", "not a valid protobuf"),
    ("too_long", "at most 4 per datum"),
    ("bad_length", r"2 values\) for 3 input tokens"),
    ("unknown_input", "built-in losses read"),
    ("nan", "NaN or infinite"),
    ("empty", "no data"),
])
def test_bad_forward_backward_bodies_are_clear_errors(body, words):
    datum = {"too_long": types.Datum(model_input=types.ModelInput.from_ints([1] * 5), loss_fn_inputs={}),
             "bad_length": types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                                       loss_fn_inputs={"target_tokens": [1, 2]}),
             "unknown_input": types.Datum(model_input=types.ModelInput.from_ints([1]),
                                          loss_fn_inputs={"mask": types.TensorData(data=[1.0], dtype="float32")}),
             "nan": types.Datum(model_input=types.ModelInput.from_ints([1]),
                                loss_fn_inputs={"weights": [float("nan")]})}
    if isinstance(body, str) and body in datum:
        body = _request([datum[body]]).SerializeToString()
    elif body == "empty":
        message = _request([datum["nan"]])
        del message.data[:]
        body = message.SerializeToString()
    with pytest.raises(WireError, match=words):
        decode_step_request(body, Limits(max_length=4, max_tokens=64))


def test_outputs_decode_with_the_clients_own_decoders():
    outputs = [{"logprobs": np.array([-0.5, -1.5], dtype=np.float32)}, {"logprobs": np.array([-2.0], np.float32)}]
    decoded = deserialize_forward_backward_output(forward_backward_output(outputs, {"loss:sum": 3.5}))
    assert decoded.metrics == {"loss:sum": 3.5}
    assert [o["logprobs"].tolist() for o in decoded.loss_fn_outputs] == [[-0.5, -1.5], [-2.0]]
    sampled = deserialize_sample_response(sample_response(
        [Sampled([4, 5], [-0.25, -0.5], "length"), Sampled([6], None, "stop")], [None, -1.0, -2.0]))
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in sampled.sequences] == [
        ([4, 5], [-0.25, -0.5], "length"), ([6], None, "stop")]
    assert sampled.prompt_logprobs == [None, -1.0, -2.0]


# --------------------------------------------------------------- ordering and batching
class _Recorder:
    """A fake step runner: records what ran together; fails for requests marked 'bad'."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()

    def __call__(self, batch):
        self.gate.wait(10)
        self.batches.append([w.model_id for w in batch])
        if any(w.step == "bad" for w in batch):
            raise ValueError("bad request")
        return {w.future.id: Result({"ok": w.model_id}) for w in batch}


@pytest.fixture
def table(tmp_path):
    store = Store(tmp_path / "registry.sqlite")
    yield FutureTable(store)
    store.close()


def _work(table, kind, model_id, seq_id, step=None, run=None):
    return Work(table.create("alice", model_id, kind), kind, model_id, seq_id, run=run, step=step)


def _wait(records, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not all(r.finished for r in records):
        assert time.monotonic() < deadline, [r.state for r in records]
        time.sleep(0.01)


def test_requests_of_a_model_run_in_seq_id_order_and_tenants_batch(table):
    recorder = _Recorder()
    order: list[int] = []
    scheduler = Scheduler(table, Metrics(), recorder, batching=True)
    scheduler.expect("m1", 1)  # as for a newly created model
    scheduler.start()
    works = [_work(table, "optim_step", "m1", 3, run=lambda: order.append(3) or Result({})),
             _work(table, "optim_step", "m1", 2, run=lambda: order.append(2) or Result({})),
             _work(table, "forward_backward", "m2", 1), _work(table, "forward_backward", "m3", 1)]
    for work in works:
        scheduler.submit(work)
    time.sleep(0.2)
    assert order == [] and recorder.batches == []  # m1 waits for seq 1; the steps wait at the gate
    first = _work(table, "forward_backward", "m1", 1)
    scheduler.submit(first)
    recorder.gate.set()
    _wait([w.future for w in works] + [first.future])
    assert order == [2, 3]
    assert sorted(map(sorted, recorder.batches)) in ([["m1", "m2", "m3"]], [["m1"], ["m2", "m3"]],
                                                     [["m1", "m2"], ["m3"]], [["m1", "m3"], ["m2"]])
    assert scheduler.duplicate("m1", 2) is works[1].future  # a client retry gets the same future
    scheduler.stop()


def test_a_failing_request_in_a_batch_fails_alone(table):
    recorder = _Recorder()
    scheduler = Scheduler(table, Metrics(), recorder, batching=True)
    good, bad = _work(table, "forward_backward", "m1", 1), _work(table, "forward_backward", "m2", 1, step="bad")
    scheduler.submit(good)
    scheduler.submit(bad)
    scheduler.start()
    recorder.gate.set()
    _wait([good.future, bad.future])
    assert recorder.batches[0] == ["m1", "m2"] and sorted(recorder.batches[1:]) == [["m1"], ["m2"]]
    assert good.future.state == "done" and good.future.result.json == {"ok": "m1"}
    assert bad.future.state == "failed" and bad.future.category == "user" and bad.future.error == "bad request"
    scheduler.stop()


def test_lost_futures_answer_an_error_after_a_restart(tmp_path):
    store = Store(tmp_path / "registry.sqlite")
    first = FutureTable(store)
    queued, done, kept = (first.create("alice", MODEL, k) for k in ("forward_backward", "forward_backward", "save"))
    first.complete(done.id, Result({"big": 1}, proto=b"\x00", persist=False))
    first.complete(kept.id, Result({"path": "tinker://x"}))
    store.close()
    store = Store(tmp_path / "registry.sqlite")  # the restarted server
    assert store.fail_unfinished_futures("lost in a restart") == 1
    again = FutureTable(store)
    assert again.get(queued.id, "alice").error == "lost in a restart"
    assert "held in memory" in again.get(done.id, "alice").error
    assert again.get(kept.id, "alice").result.json == {"path": "tinker://x"}
    assert again.get(kept.id, "bob") is None  # another key: not found
    store.close()


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    values = rng.exponential(size=101).tolist()
    for q in (0.5, 0.95):
        # float64 linear interpolation between the same two order statistics: a few ulps (1e-16), inside 1e-6
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))
    assert percentile([], 0.5) is None


def test_a_lone_step_waits_for_other_training_tenants_only(table):
    recorder = _Recorder()
    recorder.gate.set()
    scheduler = Scheduler(table, Metrics(), recorder, batching=True, batch_window_s=1.5)
    scheduler.start()
    alone = _work(table, "forward_backward", "m1", None)
    started = time.monotonic()
    scheduler.submit(alone)
    _wait([alone.future])
    assert time.monotonic() - started < 1.0  # nobody else trains: no waiting
    warm = _work(table, "forward_backward", "m2", None)
    scheduler.submit(warm)
    _wait([warm.future])
    first, second = _work(table, "forward_backward", "m1", None), _work(table, "forward_backward", "m2", None)
    scheduler.submit(first)  # m2 trains too: m1's step waits for m2's
    time.sleep(0.3)
    scheduler.submit(second)
    _wait([first.future, second.future])
    assert recorder.batches[-1] == ["m1", "m2"]
    scheduler.stop()


# ------------------------------------------------------------- service limits and sessions
class _IdleEngine:
    """An engine whose model is never called: these tests stop before the worker runs anything."""

    batching = False
    sampler = None
    slots = 4
    vocab_size = None
    targets = {"attn": ["q_proj"], "mlp": [], "unembed": []}


@pytest.fixture
def service(tmp_path):
    from twinkle_server.config import ServerConfig, ServiceConfig
    from twinkle_server.paths import CheckpointDirs
    from twinkle_server.service import Service

    store = Store(tmp_path / "registry.sqlite")
    config = ServerConfig(server=ServiceConfig(max_inflight_per_key=3, session_timeout_s=60))
    yield Service(config, _IdleEngine(), store, CheckpointDirs(tmp_path), arch="qwen2", tokenizer_id=None)
    store.close()


def test_each_key_may_queue_only_so_many_requests(service):
    from twinkle_server.errors import ApiError

    for _ in range(3):
        service.submit("alice", "optim_step", MODEL, None, run=lambda: Result({}))
    with pytest.raises(ApiError, match="3 requests queued or running") as refused:
        service.submit("alice", "optim_step", MODEL, None, run=lambda: Result({}))
    assert refused.value.status == 429
    service.submit("bob", "optim_step", MODEL, None, run=lambda: Result({}))  # another key is not limited


def test_requests_refused_at_the_door_do_not_hold_up_the_models_next_one(service, tmp_path):
    from fastapi.testclient import TestClient

    from twinkle_server.app import create_app

    key = add_key(str(tmp_path / "keys.txt"), "alice")
    client = TestClient(create_app(service, KeyStore.from_file(str(tmp_path / "keys.txt"))))
    service.store.add_session("s1", "alice", None, "0.38.0")
    service.store.add_model(MODEL, "alice", "s1", "base", {"rank": 4}, None)
    service.scheduler.expect(MODEL, 1)
    refused = [("/api/v1/optim_step", {"model_id": MODEL, "seq_id": 1, "optim_params": {"learning_rate": 1e6}}),
               ("/api/v1/save_weights", {"model_id": MODEL, "seq_id": 2, "path": "../escape"})]
    for path, body in refused:
        answer = client.post(path, json=body, headers={"X-API-Key": key})
        assert answer.status_code == 400, answer.text
    assert service.scheduler._next_seq[MODEL] == 3  # seq 3 runs when it comes, without the reorder wait


def test_a_forward_backward_refused_at_decoding_does_not_hold_up_the_next(service):
    from twinkle_server.errors import ApiError
    from twinkle_server.wire import pb

    service.store.add_session("s1", "alice", None, "0.38.0")
    service.store.add_model(MODEL, "alice", "s1", "base", {"rank": 4}, None)
    service.scheduler.expect(MODEL, 1)
    empty = pb.ForwardBackwardRequest(model_id=MODEL, seq_id=1).SerializeToString()  # no data: a 400
    with pytest.raises(ApiError, match="has no data"):
        service.forward_backward("bob", empty)  # another key's refusal changes nothing of alice's model
    assert service.scheduler._next_seq[MODEL] == 1
    with pytest.raises(ApiError, match="has no data"):
        service.forward_backward("alice", empty)
    assert service.scheduler._next_seq[MODEL] == 2


def test_a_session_without_heartbeat_ends_and_unloads_its_models(service):
    service.store.add_session("s1", "alice", None, "0.38.0")
    service.store.add_session("s2", "alice", None, "0.38.0")
    service.store.add_model("s1:train:0", "alice", "s1", "base", {"rank": 4}, None)
    service.store._db.execute("UPDATE sessions SET heartbeat = heartbeat - 120 WHERE id = 's1'")
    service.expire_sessions()
    assert service.store.session("s1", "alice")["finished"] == 1
    assert service.store.session("s2", "alice")["finished"] == 0
    queued = [w for q in service.scheduler._queues.values() for w in q]
    assert [(w.kind, w.model_id) for w in queued] == [("unload_model", "s1:train:0")]


# ------------------------------------------------------------------------------- command line
def test_serve_help_describes_every_option_from_the_shared_schema(capsys):
    """`twinkle serve --help` is rendered from ServerConfig's schema, like `twinkle train --help` from the Trainer's."""
    from twinkle.config import schema_of
    from twinkle_server.cli import main
    from twinkle_server.config import ServerConfig

    assert main(["--help"]) == 0
    entries: dict[str, str] = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  --"):
            name = line.split()[0].rstrip(",").replace("[no-]", "")
            entries[name] = line.strip()
        elif line.startswith("      ") and entries:
            entries[name] += " " + line.strip()
    specs = schema_of(ServerConfig).specs.values()
    assert set(entries) == {spec.option for spec in specs}  # its own options only: none of the Trainer's
    for spec in specs:
        assert spec.help and spec.help in entries[spec.option], spec.dotted
    assert entries["--server.api-keys-file"].endswith("(required)")
    assert "--total-step" not in entries and "--lora.r" not in entries


def test_serve_names_a_missing_keys_file_before_building_anything(capsys, monkeypatch):
    import twinkle_server.server as server
    from twinkle_server.cli import main

    monkeypatch.setattr(server, "serve", lambda config: pytest.fail("the config was accepted"))
    assert main(["--server.port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinkle serve: error: server.api_keys_file is required: create a key with `twinkle serve "
                          "keygen")
    assert main(["--server.prot", "0"]) == 2
    assert "--server.prot: unknown field; did you mean 'port'?" in capsys.readouterr().err


# ------------------------------------------------------------------------------- paging
class _SlotModel:
    """The public calls the pager makes, on a model whose 'weights' are one number per tenant."""

    def __init__(self) -> None:
        self.weights: dict[str, float] = {}
        self.calls: list[str] = []

    def save(self, name, output_dir, *, adapter_name, **kwargs):
        import json
        from pathlib import Path

        path = Path(output_dir) / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "w.json").write_text(json.dumps(self.weights[adapter_name]))
        self.calls.append(f"save {adapter_name}")

    def release_lora(self, tenant):
        del self.weights[tenant]
        self.calls.append(f"release {tenant}")

    def load_lora(self, tenant, directory):
        import json
        from pathlib import Path

        self.weights[tenant] = json.loads((Path(directory) / "w.json").read_text())
        self.calls.append(f"load {tenant}")

    def resume_from_checkpoint(self, directory, adapter_name):
        self.calls.append(f"resume {adapter_name}")


def test_slots_page_the_least_recently_used_idle_model_and_hold_unapplied_gradients(tmp_path):
    from twinkle_server.paging import Pager, SlotsBusy

    model = _SlotModel()
    pager = Pager(model, 2, tmp_path, memory_bytes=0, grad_hold_s=0.3, reset_optimizer=lambda name: None)
    for name, value in (("a", 1.0), ("b", 2.0)):
        pager.admit(name, "train", lambda n=name, v=value: model.weights.__setitem__(n, v))
    with pager.use(["a"]):
        pass  # b is now the least recently used
    pager.admit("c", "train", lambda: model.weights.__setitem__("c", 3.0))
    assert model.calls[-2:] == ["save b", "release b"] and sorted(model.weights) == ["a", "c"]
    with pager.use(["b"]):  # back, as it was; a (least recently used) goes
        assert model.weights["b"] == 2.0 and "a" not in model.weights
    pager.set_dirty("c", True)
    pager.set_dirty("b", True)
    with pytest.raises(SlotsBusy, match="server.max_tenants"):
        pager.admit("d", "train", lambda: model.weights.__setitem__("d", 4.0))  # both hold gradients
    time.sleep(0.35)  # past grad_hold_s: the older one may go, its gradients dropped
    pager.admit("d", "train", lambda: model.weights.__setitem__("d", 4.0))
    assert sorted(model.weights) == ["b", "d"] and pager.take_dropped("c") and not pager.take_dropped("b")
    with pager.use(["b", "d"]):
        with pytest.raises(SlotsBusy):  # every slot pinned by running work
            pager.admit("e", "sample", lambda: model.weights.__setitem__("e", 0.0))
    pager.drop("c")
    assert not pager.known("c") and not (tmp_path / "paged" / "c").exists()


def test_a_failed_create_model_can_be_sent_again(tmp_path):
    """A create that failed (e.g. every slot busy) is not remembered: the same model_seq_id works next time."""
    from twinkle_server.config import ServerConfig, ServiceConfig
    from twinkle_server.paths import CheckpointDirs
    from twinkle_server.service import Service

    class FlakyEngine(_IdleEngine):
        fails = 1

        def lora_config(self, lora):
            return lora

        def create(self, model_id, lora):
            if FlakyEngine.fails:
                FlakyEngine.fails -= 1
                raise ValueError("every LoRA slot is busy")
            return "v1"

    store = Store(tmp_path / "registry.sqlite")
    service = Service(ServerConfig(server=ServiceConfig()), FlakyEngine(), store, CheckpointDirs(tmp_path),
                      arch="qwen2", tokenizer_id=None)
    service.start()
    try:
        service.store.add_session("s1", "alice", None, "0.38.0")
        request = types.CreateModelRequest(session_id="s1", model_seq_id=0, base_model="twinkle/tiny-qwen",
                                           lora_config=types.LoraConfig(rank=4))
        first = service.futures.get(service.create_model("alice", request)["request_id"], "alice")
        _wait([first])
        assert first.state == "failed" and "busy" in first.error
        second = service.futures.get(service.create_model("alice", request)["request_id"], "alice")
        _wait([second])
        assert second.state == "done" and second.id != first.id
    finally:
        service.stop()
        store.close()


def test_a_session_timeout_below_the_clients_heartbeat_is_refused():
    from twinkle_server.config import ServiceConfig

    with pytest.raises(ConfigError, match="session_timeout_s"):
        ServiceConfig(session_timeout_s=5)
    assert ServiceConfig(session_timeout_s=0).session_timeout_s == 0  # never
    assert ServiceConfig(session_timeout_s=30).session_timeout_s == 30


def test_queued_requests_of_an_expired_session_fail_saying_so(service):
    service.store.add_session("s1", "alice", None, "0.38.0")
    service.store.add_model("s1:train:0", "alice", "s1", "base", {"rank": 4}, None)
    queued = [service.submit("alice", "optim_step", "s1:train:0", 2 + i, run=lambda: Result({})) for i in range(2)]
    service.store._db.execute("UPDATE sessions SET heartbeat = heartbeat - 120 WHERE id = 's1'")
    service.expire_sessions()
    for record in queued:
        assert record.state == "failed" and record.error.startswith("session expired: session 's1' has ended")


def test_served_names_have_no_colon():
    from twinkle_server.config import ServerConfig, hub_id, served_name

    assert served_name("twinkle://tiny-qwen") == "twinkle/tiny-qwen"
    assert served_name("ms://Qwen/Qwen3-0.6B") == served_name("hf://Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert served_name("/models/my:model/") == "my-model"
    assert hub_id("ms://Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B" and hub_id("/models/x") is None
    config = ServerConfig()
    assert config.base_model_name == "twinkle/tiny-qwen"
    assert config.base_model_aliases == ("twinkle/tiny-qwen", "twinkle://tiny-qwen")


def test_sliced_work_takes_turns_with_other_keys_and_can_wait_for_a_slot(table):
    """A sliced request (a generator) runs one slice per turn; a light key's request runs between two slices;
    a slice that found every slot busy (RETRY) runs again later; cancelling stops it after its slice."""
    from twinkle_server.scheduler import RETRY

    order: list[str] = []

    def heavy():
        for i in range(4):
            order.append(f"slice{i}")
            yield RETRY if i == 1 else None
        return Result({"done": True})

    def heavy_forever():
        while True:
            order.append("forever")
            yield None

    scheduler = Scheduler(table, Metrics(), _Recorder(), batching=False)
    big = Work(table.create("bob", None, "sample"), "sample", None, None, run=heavy)
    scheduler.submit(big)
    scheduler.start()
    time.sleep(0.05)
    light = Work(table.create("alice", None, "optim_step"), "optim_step", None, None,
                 run=lambda: order.append("light") or Result({}))
    scheduler.submit(light)
    _wait([big.future, light.future])
    assert big.future.result.json == {"done": True} and order.count("light") == 1
    assert order.index("light") < order.index("slice3")  # it did not wait for the whole request
    endless = Work(table.create("bob", None, "sample"), "sample", None, None, run=heavy_forever)
    scheduler.submit(endless)
    time.sleep(0.05)
    scheduler.drop(lambda w: w.future.id == endless.future.id, "cancelled by the client (cancel_future)")
    _wait([endless.future])
    assert endless.future.state == "failed" and "cancelled" in endless.future.error
    scheduler.stop()
