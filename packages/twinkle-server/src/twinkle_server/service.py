"""The Tinker API's operations, request by request: ownership, validation, queueing.

HTTP routing lives in ``app.py``; this class checks that the caller's key owns what it names (a
foreign id answers exactly like a missing one), validates the request before it is queued, and
queues the work whose model calls live in :class:`twinkle_server.engine.Engine`. Checkpoint and
sampling operations are in their own mixins.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

from twinkle_server.checks import CheckError, check_adam, check_seq_id, encodable
from twinkle_server.config import ServerConfig
from twinkle_server.downloads import Signer
from twinkle_server.engine import Engine, UserError
from twinkle_server.errors import ApiError, not_found
from twinkle_server.futures import FutureRecord, FutureTable, Result
from twinkle_server.metrics import Metrics
from twinkle_server.ops_checkpoints import CheckpointOps
from twinkle_server.ops_sampling import SamplingOps
from twinkle_server.paging import SlotsBusy
from twinkle_server.paths import CheckpointDirs
from twinkle_server.scheduler import Scheduler, Work
from twinkle_server.store import Store
from twinkle_server.wire import (
    Limits,
    StepRequest,
    WireError,
    decode_step_request,
    forward_backward_json,
    forward_backward_output,
)

logger = logging.getLogger("twinkle_server")


class Service(CheckpointOps, SamplingOps):
    """Everything between the HTTP routes and the worker thread."""

    def __init__(self, config: ServerConfig, engine: Engine, store: Store, dirs: CheckpointDirs, *,
                 arch: str | None, tokenizer_id: str | None) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.dirs = dirs
        self.arch = arch
        self.tokenizer_id = tokenizer_id
        self.metrics = Metrics()
        self.metrics.slots = lambda: engine.pager.stats() if hasattr(engine, "pager") else {}
        self.futures = FutureTable(store)
        self.scheduler = Scheduler(self.futures, self.metrics, self._run_steps, batching=engine.batching,
                                   batch_window_s=config.server.batch_window_ms / 1000.0, max_batch=engine.slots)
        self.limits = Limits(max_length=config.server.max_length, max_tokens=config.server.max_tokens_per_request,
                             vocab_size=engine.vocab_size)
        self.signer = Signer(dirs.root.parent)
        self._creating: dict[str, FutureRecord] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Recover from the registry (lost futures fail, models get their slots back), then start the worker."""
        lost = self.store.fail_unfinished_futures(
            "this request was lost: the server restarted before it finished; send it again")
        if lost:
            logger.warning("%d queued or running requests were lost in the previous run; they now answer an error",
                           lost)
        self.store.touch_all_sessions()
        for row in self.store.models(states=("active", "restored")):
            if self.store.session(row["session_id"], row["owner"])["finished"]:  # its unload was lost
                self.store.set_model_state(row["id"], "unloaded")
                continue
            # its weights were in memory: it continues after load_state (it gets a slot then); until then its
            # weights version matches no sampling snapshot
            self.store.set_model_state(row["id"], "restored")
            self.store.set_weights_version(row["id"], None)
            logger.info("model %s lost its unsaved state in the restart; it continues after load_state(<checkpoint>)",
                        row["id"])
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()
        pager = getattr(self.engine, "pager", None)
        if pager is not None:
            pager.close()

    # ----------------------------------------------------------------- helpers
    def session_row(self, owner: str, session_id: str, *, open_only: bool = True) -> dict[str, Any]:
        row = self.store.session(session_id, owner)
        if row is None:
            raise not_found("session", session_id)
        if open_only and row["finished"]:
            raise ApiError(410, session_ended(session_id))
        return row

    def model_row(self, owner: str, model_id: str, *, trainable: bool = True) -> dict[str, Any]:
        row = self.store.model(model_id, owner)
        if row is None:
            raise not_found("model", model_id)
        if row["state"] == "unloaded":
            session = self.store.session(row["session_id"], owner)
            if session is not None and session["finished"]:
                raise ApiError(410, f"model {model_id!r} was unloaded: {session_ended(row['session_id'])}")
            raise not_found("model", model_id)
        if trainable and row["state"] == "restored":
            raise ApiError(400, f"model {model_id!r} lost its unsaved state when the server restarted; call "
                                "load_state_with_optimizer(<its last save_state path>) (or load_state) to continue, "
                                "or create_training_client_from_state(...).")
        return row

    def submit(self, owner: str, kind: str, model_id: str | None, seq_id: int | None, run: Any = None, *,
               step: StepRequest | None = None, tokens: int = 0, session_id: str | None = None) -> FutureRecord:
        """Queue one request and return its future (the same future again for a retried seq_id)."""
        again = self.scheduler.duplicate(model_id, seq_id)
        if again is not None and again.owner == owner:
            return again
        limit = self.config.server.max_inflight_per_key
        if self.futures.inflight(owner) >= limit:
            raise ApiError(429, f"this API key has {limit} requests queued or running (server.max_inflight_per_key); "
                                "wait for some results and retry.")
        record = self.futures.create(owner, model_id, kind)
        self.scheduler.submit(Work(record, kind, model_id, seq_id, run=run, step=step, tokens=tokens,
                                   session_id=session_id))
        return record

    def refused(self, owner: str, model_id: Any, seq_id: Any) -> None:
        """A request numbered ``seq_id`` of ``owner``'s model was answered with an error before it was queued: the
        model's next request must not wait for it (another key's model is left alone)."""
        if isinstance(model_id, str) and isinstance(seq_id, int) and not isinstance(seq_id, bool) and \
                self.store.model(model_id, owner) is not None:
            self.scheduler.refused(model_id, seq_id)

    @staticmethod
    def untyped(record: FutureRecord, **extra: Any) -> dict[str, Any]:
        return {"request_id": record.id, "model_id": record.model_id, **extra}

    # ---------------------------------------------------------------- service
    def client_config(self) -> dict[str, Any]:
        # the client packs a datum's tokens at >= 4 bytes each: chunks of this many bytes hold at most
        # max_tokens_per_request tokens
        chunk = min(5_000_000, self.config.server.max_request_bytes // 2, 4 * self.config.server.max_tokens_per_request)
        return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "parallel_fwdbwd_chunks": True,
                "proto_compress_fwdbwd": False, "fwdbwd_max_chunk_bytes_count": chunk,
                "use_pyqwest_transport": False, "sample_use_retrieve_futures": False,
                "custom_loss_server_side": False, "sample_join_sampling_session": True}

    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [{"model_name": self.config.base_model_name, "trainable": True,
                                      "sampleable": self.engine.sampler is not None,
                                      "max_context_length": self.config.server.max_length}]}

    def check_base_model(self, base_model: str | None) -> None:
        if base_model is not None and base_model not in self.config.base_model_aliases:
            raise ApiError(400, f"base_model {base_model!r} is not served here; this server serves "
                                f"{self.config.base_model_name!r} (see get_server_capabilities).")

    # ---------------------------------------------------------------- sessions
    def create_session(self, owner: str, request: Any) -> dict[str, Any]:
        session_id = secrets.token_hex(8)
        self.store.add_session(session_id, owner, request.user_metadata, request.sdk_version)
        return {"type": "create_session", "session_id": session_id}

    def heartbeat(self, owner: str, session_id: str) -> dict[str, Any]:
        self.session_row(owner, session_id)
        self.store.heartbeat(session_id, owner)
        return {"type": "session_heartbeat"}

    def finish_session(self, owner: str, session_id: str) -> None:
        row = self.session_row(owner, session_id, open_only=False)
        if not row["finished"]:
            self.end_session(session_id, owner)

    def end_session(self, session_id: str, owner: str) -> None:
        """Finish a session and unload its models (called on finish and on heartbeat expiry)."""
        self.store.finish_session(session_id)
        models = set(self.store.session_models(session_id))
        self.scheduler.drop(lambda w: w.model_id in models or w.session_id == session_id, session_ended(session_id))
        for model_id in models:
            self.submit(owner, "unload_model", model_id, None, run=self._unloader(model_id))

    def expire_sessions(self) -> None:
        timeout = self.config.server.session_timeout_s
        if timeout <= 0:
            return
        for session_id, owner in self.store.expired_sessions(time.time() - timeout):
            logger.info("session %s sent no heartbeat for %.0fs; it ends and its models unload", session_id, timeout)
            self.end_session(session_id, owner)

    def session_info(self, owner: str, session_id: str) -> dict[str, Any]:
        row = self.session_row(owner, session_id, open_only=False)
        return {"training_run_ids": self.store.session_models(session_id),
                "sampler_ids": self.store.session_samplers(session_id),
                "user_metadata": _strings(row.get("user_metadata"))}

    # ------------------------------------------------------------------ models
    def create_model(self, owner: str, request: Any) -> dict[str, Any]:
        self.session_row(owner, request.session_id)
        self.check_base_model(request.base_model)
        optimizer = getattr(request.optimizer_config, "type", "adamw")
        if optimizer != "adamw":
            raise ApiError(400, f"optimizer_config type {optimizer!r} is not supported; this server trains with "
                                "AdamW (types.AdamOptimizerConfig()).")
        if request.lora_config is None:
            raise ApiError(400, "this server trains LoRA tenants of a shared base model; pass a LoraConfig "
                                "(create_lora_training_client).")
        lora = request.lora_config.model_dump()
        try:
            check_seq_id("model_seq_id", request.model_seq_id)
            self.engine.lora_config(lora)
        except (UserError, CheckError) as exc:
            raise ApiError(400, str(exc)) from None
        model_id = f"{request.session_id}:train:{request.model_seq_id}"
        with self._lock:
            pending = self._creating.get(model_id)
            if pending is not None and pending.owner == owner and pending.state != "failed":
                return self.untyped(pending)
            if self.store.model(model_id, None) is not None:
                raise ApiError(400, f"model {model_id!r} already exists; use a new model_seq_id.")
            record = self.submit(owner, "create_model", model_id, None,
                                 run=lambda: self._create(owner, model_id, request, lora))
            self._creating[model_id] = record
        return self.untyped(record)

    def _create(self, owner: str, model_id: str, request: Any, lora: dict[str, Any]) -> Result:
        try:
            version = self.engine.create(model_id, lora)
        except SlotsBusy:
            raise  # the scheduler runs it again in a moment: still pending
        except BaseException:
            with self._lock:
                self._creating.pop(model_id, None)  # a failed create can be sent again
            raise
        self.store.add_model(model_id, owner, request.session_id, self.config.base_model_name, lora,
                             request.user_metadata)
        self.store.set_weights_version(model_id, version)
        with self._lock:
            self._creating.pop(model_id, None)  # the registry answers for it now
        self.scheduler.expect(model_id, 1)
        return Result({"type": "create_model", "model_id": model_id})

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        row = self.model_row(owner, model_id, trainable=False)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": row["lora"]["rank"],
                "model_name": self.config.base_model_name, "optimizer_config": {"type": "adamw"},
                "model_data": {"arch": self.arch, "model_name": self.config.base_model_name,
                               "tokenizer_id": self.tokenizer_id}}

    def unload_model(self, owner: str, model_id: str) -> dict[str, Any]:
        self.model_row(owner, model_id, trainable=False)
        return self.untyped(self.submit(owner, "unload_model", model_id, None, run=self._unloader(model_id)))

    def _unloader(self, model_id: str) -> Any:
        def run() -> Result:
            row = self.store.model(model_id, None)
            if row is not None and row["state"] != "unloaded":
                if self.engine.has(model_id):
                    self.engine.unload(model_id)
                self.store.set_model_state(model_id, "unloaded")
                self.scheduler.forget_model(model_id)
            return Result({"type": "unload_model", "model_id": model_id})
        return run

    # ---------------------------------------------------------------- training
    def forward_backward(self, owner: str, body: bytes) -> dict[str, Any]:
        try:
            step = decode_step_request(body, self.limits)
        except WireError as exc:
            self.refused(owner, exc.model_id, exc.seq_id)
            raise ApiError(400, str(exc)) from None
        self.model_row(owner, step.model_id)
        try:
            step.metric = self.engine.check_loss(step)
        except UserError as exc:
            self.refused(owner, step.model_id, step.seq_id)
            raise ApiError(400, str(exc)) from None
        if step.forward_only:
            record = self.submit(owner, "forward", step.model_id, step.seq_id, tokens=step.num_tokens,
                                 run=lambda: _step_result(self.engine.forward(step.model_id, step)))
        else:
            record = self.submit(owner, "forward_backward", step.model_id, step.seq_id, step=step,
                                 tokens=step.num_tokens)
        return self.untyped(record)

    def _run_steps(self, batch: list[Work]) -> dict[str, Result]:
        outcomes = self.engine.forward_backward({w.model_id: w.step for w in batch})
        return {w.future.id: _step_result(outcomes[w.model_id]) for w in batch}

    def optim_step(self, owner: str, request: Any) -> dict[str, Any]:
        self.model_row(owner, request.model_id)
        params = request.optim_params
        if getattr(params, "type", None) is not None or not hasattr(params, "beta1"):
            raise ApiError(400, f"optimizer parameters of type {getattr(params, 'type', '?')!r} are not supported; "
                                "send types.AdamParams (this server trains with AdamW).")
        values = params.model_dump()
        try:
            check_adam(values, self.config.server.max_learning_rate)
        except CheckError as exc:
            raise ApiError(400, str(exc)) from None

        def run() -> Result:
            metrics = self.engine.optim_step(request.model_id, values)
            self.store.set_weights_version(request.model_id, self.engine.weights_version[request.model_id])
            return Result({"type": "optim_step", "metrics": metrics})

        return self.untyped(self.submit(owner, "optim_step", request.model_id, request.seq_id, run=run))

    # ----------------------------------------------------------------- futures
    def cancel(self, owner: str, request_id: str) -> None:
        """Drop the caller's queued request (a running sample stops after its slice); a finished one is left."""
        record = self.futures.get(request_id, owner)
        if record is None:
            raise not_found("request", request_id)
        if not record.finished:
            self.scheduler.drop(lambda w: w.future.id == request_id, "cancelled by the client (cancel_future)")

    async def retrieve(self, owner: str, request_id: str, want_proto: bool) -> tuple[int, Any, bool]:
        """``(status, body, is_proto)`` for retrieve_future: try_again, the error, or the result."""
        record = self.futures.get(request_id, owner)
        if record is None:
            raise not_found("request", request_id)
        if not record.finished:
            await self.futures.wait(record, self.config.server.long_poll_s)
        if not record.finished:
            return 200, {"type": "try_again", "request_id": record.id, "queue_state": "active"}, False
        if record.state == "failed":
            return 200, {"error": record.error, "category": record.category}, False
        result = record.result
        if want_proto and result.proto is not None:
            return 200, result.proto, True
        return 200, encodable(result.json), False


def _step_result(outcome: Any) -> Result:
    return Result(forward_backward_json(outcome.outputs, outcome.metrics),
                  forward_backward_output(outcome.outputs, outcome.metrics), persist=False)


def session_ended(session_id: str) -> str:
    return (f"session expired: session {session_id!r} has ended (finished, or no heartbeat for "
            "server.session_timeout_s); create a new ServiceClient and load your last checkpoint.")


def _strings(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    return {str(k): str(v) for k, v in value.items()}

