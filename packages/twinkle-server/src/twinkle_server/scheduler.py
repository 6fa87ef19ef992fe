"""One worker thread owns the model; requests queue per client model and run in their ``seq_id`` order.

The tinker client numbers every request of a training client (``seq_id``) and expects them to run
in that order; it may send the chunks of one forward_backward at once, the first one last. Each
model's queue is therefore ordered by ``seq_id`` and its head runs only when it is the next one
(or after ``REORDER_WAIT_S``, so a lost request never blocks a model forever).

Fair across API keys: among the ready heads, the key that has had the worker for the least time
(its "virtual time", seconds of work run for it) goes first, its oldest head; a key that was idle
starts level with the busiest-served active key, so idleness is not banked. Work is bounded: a
forward_backward holds at most ``server.max_tokens_per_request`` tokens, and a sample request
is a generator that runs one slice (about ``server.slice_ms``) per turn, so a heavy key takes turns
with light ones instead of holding the worker. With batching on, every other ready head that is a
forward_backward of another tenant joins the chosen one in one ``forward_backward_multi`` step
(at most one per LoRA slot). With a batch
window, a lone forward_backward waits up to that long for company -- but only while other tenants
are training (sent a forward_backward in the last ``ACTIVE_S`` seconds), so a single tenant never waits. A failing
request fails its own future only; a failing batch is retried tenant by tenant (nothing is
applied before the backward), so one tenant's bad request never costs another its step. Work that
finds every LoRA slot busy (:class:`twinkle_server.paging.SlotsBusy`) waits ``RETRY_S`` and runs
again; queued work can be dropped with a reason (a cancelled request, an expired session).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twinkle_server.futures import FutureRecord, FutureTable, Result
from twinkle_server.metrics import Metrics
from twinkle_server.paging import SlotsBusy

logger = logging.getLogger("twinkle_server")

#: How long a model's queue waits for a missing earlier seq_id before running what it has.
REORDER_WAIT_S = 10.0
#: A tenant that sent a forward_backward this recently counts as training (worth waiting for, see batch window).
ACTIVE_S = 5.0
#: How long work that found every LoRA slot busy waits before it tries again.
RETRY_S = 0.2
#: What a sliced request's generator yields to be run again after ``RETRY_S`` (else: at its next turn).
RETRY = "retry"
#: Errors that are the request's fault (the client gets category "user"); anything else is "server".
USER_ERRORS = (ValueError, TypeError, KeyError, FileNotFoundError, PermissionError)


@dataclass
class Work:
    """One queued request: its future, the model it belongs to, and how to run it."""

    future: FutureRecord
    kind: str
    model_id: str | None
    seq_id: int | None
    run: Callable[[], Result] | None = None  # everything except batchable forward_backward
    step: Any = None  # a StepRequest, for forward_backward (batchable)
    tokens: int = 0
    session_id: str | None = None  # model-less work of a session (sampling)
    enqueued: float = field(default_factory=time.monotonic)
    not_before: float = 0.0  # retry time after SlotsBusy
    slices: Any = None  # the generator of a sliced request (sampling), once started
    dropped: str | None = None  # set while running: the reason to fail it after its current slice

    @property
    def owner(self) -> str:
        return self.future.owner


class Scheduler:
    """Per-model ordered queues drained by one worker thread (see the module docstring)."""

    def __init__(self, futures: FutureTable, metrics: Metrics, run_steps: Callable[[list[Work]], dict[str, Result]],
                 *, batching: bool, batch_window_s: float = 0.0, max_batch: int = 1 << 30) -> None:
        self.futures = futures
        self.metrics = metrics
        self.run_steps = run_steps
        self.batching = batching
        self.batch_window_s = batch_window_s
        self.max_batch = max_batch
        self._vtime: dict[str, float] = {}  # seconds of worker time spent on each key's work
        self._running: list[Work] = []
        self._cond = threading.Condition()
        self._queues: dict[str, list[Work]] = {}
        self._next_seq: dict[str, int] = {}
        self._refused: dict[str, set[int]] = {}  # seq_ids refused before they were queued: never waited for
        self._seen: dict[tuple[str, int], FutureRecord] = {}
        self._last_step: dict[str, float] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="twinkle-server-worker", daemon=True)

    # ------------------------------------------------------------- submission
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def duplicate(self, model_id: str | None, seq_id: int | None) -> FutureRecord | None:
        """The future already created for this (model, seq_id): a client retry gets the same answer."""
        if model_id is None or not seq_id:
            return None
        with self._cond:
            return self._seen.get((model_id, seq_id))

    def submit(self, work: Work) -> None:
        key = work.model_id or f"_{work.future.id}"  # model-less work (sampling sessions...) queues alone
        with self._cond:
            if work.model_id is not None and work.seq_id:
                self._seen[(work.model_id, work.seq_id)] = work.future
            if work.kind == "forward_backward":
                self._last_step[key] = time.monotonic()
            if not any(w.owner == work.owner for q in self._queues.values() for w in q):
                active = [self._vtime.get(w.owner, 0.0) for q in self._queues.values() for w in q[:1]]
                self._vtime[work.owner] = max(self._vtime.get(work.owner, 0.0), min(active, default=0.0))
            queue = self._queues.setdefault(key, [])
            queue.append(work)
            queue.sort(key=lambda w: (w.seq_id or 0, w.enqueued))
            self._count()
            self._cond.notify_all()

    def depth(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def _count(self) -> None:
        self.metrics.queue_depth = self.depth()
        self.metrics.queued = dict(Counter(w.kind for q in self._queues.values() for w in q))

    def expect(self, model_id: str, seq_id: int) -> None:
        """A new model's first request is ``seq_id`` (the client numbers from 1); later ones follow it."""
        with self._cond:
            self._next_seq[model_id] = seq_id
            self._cond.notify_all()

    def refused(self, model_id: str, seq_id: int | None) -> None:
        """Request ``seq_id`` of ``model_id`` was refused before it was queued (a 400 at the door): it will never
        run, so the model's next request must not wait the reorder time for it. Only for the model's owner."""
        if not seq_id:
            return
        with self._cond:
            self._refused.setdefault(model_id, set()).add(seq_id)
            self._skip_refused(model_id)
            self._cond.notify_all()

    def _skip_refused(self, model_id: str) -> None:
        """Move the model's expected seq_id past the refused ones it has reached (holding the lock)."""
        refused, expected = self._refused.get(model_id), self._next_seq.get(model_id)
        if not refused or expected is None:
            return
        while expected in refused:
            expected += 1
        self._next_seq[model_id] = expected
        self._refused[model_id] = {seq for seq in refused if seq > expected}  # what is left still lies ahead

    def drop(self, match: Callable[[Work], bool], reason: str) -> int:
        """Fail every queued work that ``match`` selects with ``reason`` (running sliced work stops after its
        slice); returns how many."""
        with self._cond:
            dropped = [w for q in self._queues.values() for w in q if match(w)]
            for key in list(self._queues):
                self._queues[key] = [w for w in self._queues[key] if not match(w)]
                if not self._queues[key]:
                    del self._queues[key]
            for work in self._running:
                if match(work):
                    work.dropped = reason
            self._count()
            self._cond.notify_all()
        for work in dropped:
            self.futures.fail(work.future.id, reason, "user")
        return len(dropped)

    def forget_model(self, model_id: str) -> None:
        """Drop the seq bookkeeping of an unloaded model."""
        with self._cond:
            self._next_seq.pop(model_id, None)
            self._refused.pop(model_id, None)
            self._last_step.pop(model_id, None)
            for key in [k for k in self._seen if k[0] == model_id]:
                del self._seen[key]

    # ----------------------------------------------------------------- worker
    def _ready(self, now: float) -> list[tuple[str, Work]]:
        """Ready queue heads, fairest first: the key with the least worker time, then the oldest."""
        ready = []
        for key, queue in self._queues.items():
            if not queue:
                continue
            head = queue[0]
            if head.not_before > now:
                continue
            expected = self._next_seq.get(key)
            in_order = not head.seq_id or expected is None or head.seq_id <= expected
            if in_order or now - head.enqueued > REORDER_WAIT_S:
                ready.append((key, head))
        ready.sort(key=lambda item: (self._vtime.get(item[1].owner, 0.0), item[1].enqueued))
        return ready

    def _next_wake(self, now: float) -> float | None:
        """Seconds until queued work may become ready by itself (a retry or reorder deadline), None: never."""
        times = [w.not_before - now for q in self._queues.values() for w in q[:1] if w.not_before > now]
        times += [w.enqueued + REORDER_WAIT_S - now for q in self._queues.values() for w in q[:1]]
        return max(0.01, min(times)) if times else None

    def _take(self) -> list[Work] | None:
        """The next work to run (several forward_backward heads when batching), or None when stopping."""
        with self._cond:
            while True:
                if self._stopping:
                    return None
                now = time.monotonic()
                ready = self._ready(now)
                if ready:
                    break
                self._cond.wait(timeout=self._next_wake(now))
            first_key, first = ready[0]
            chosen = [(first_key, first)]
            if self.batching and first.kind == "forward_backward":
                ready = self._wait_for_company(first_key, ready)
                chosen += [(k, w) for k, w in ready if k != first_key and w.kind == "forward_backward"]
                chosen = chosen[:self.max_batch]
            for key, _ in chosen:
                self._queues[key].pop(0)
                if not self._queues[key]:
                    del self._queues[key]
            self._running = [w for _, w in chosen]
            self._count()
            return [w for _, w in chosen]

    def _finish_take(self, batch: list[Work]) -> None:
        """Work that ran (or failed) for good: the next seq_id of its model may run."""
        with self._cond:
            for work in batch:
                if work.seq_id and work.model_id is not None:
                    self._next_seq[work.model_id] = max(self._next_seq.get(work.model_id, 0), work.seq_id + 1)
                    self._skip_refused(work.model_id)
            self._running = []
            self._cond.notify_all()

    def _requeue(self, work: Work, delay: float = 0.0) -> None:
        """Put ``work`` back at the head of its queue (another slice, or a retry after ``delay``)."""
        key = work.model_id or f"_{work.future.id}"
        with self._cond:
            work.not_before = time.monotonic() + delay
            self._queues.setdefault(key, []).insert(0, work)
            self._count()
            self._cond.notify_all()

    def _charge(self, batch: list[Work], seconds: float) -> None:
        with self._cond:
            for work in batch:
                self._vtime[work.owner] = self._vtime.get(work.owner, 0.0) + seconds / len(batch)

    def _wait_for_company(self, key: str, ready: list[tuple[str, Work]]) -> list[tuple[str, Work]]:
        """With a batch window: wait (up to it) until another training tenant's forward_backward is ready too."""
        deadline = time.monotonic() + self.batch_window_s

        def company(items: list[tuple[str, Work]]) -> bool:
            return any(k != key and w.kind == "forward_backward" for k, w in items)

        while not company(ready) and not self._stopping:
            now = time.monotonic()
            training = any(k != key and now - t < ACTIVE_S for k, t in self._last_step.items())
            if not training or now >= deadline:
                break
            self._cond.wait(timeout=deadline - now)
            ready = self._ready(time.monotonic())
        return ready

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            for work in batch:
                self.futures.start(work.future.id)
            started = time.monotonic()
            if batch[0].kind == "forward_backward":
                done = self._run_steps(batch)
            else:
                done = self._run_one(batch[0])
            elapsed = time.monotonic() - started
            self._charge(batch, elapsed)
            finished = [w for w in batch if w.future.id in done]
            self._finish_take(finished)
            if finished:
                self.metrics.record(finished, elapsed)

    def _run_one(self, work: Work) -> set[str]:
        """One turn of ``work`` (the whole request, or one slice of a sliced one); the ids that finished."""
        try:
            if work.slices is None:
                result = work.run()
                if not isinstance(result, Result):  # a sliced request: its generator
                    work.slices = result
            if work.slices is not None:
                if work.dropped is not None:
                    raise LookupError(work.dropped)
                try:
                    asked = next(work.slices)
                except StopIteration as stop:
                    result = stop.value
                else:
                    if work.dropped is not None:
                        raise LookupError(work.dropped)
                    self._requeue(work, RETRY_S if asked == RETRY else 0.0)
                    return set()
        except SlotsBusy:
            self._requeue(work, RETRY_S)
            return set()
        except LookupError as exc:
            if work.dropped is None:
                self._fail(work, exc)
            else:
                self.futures.fail(work.future.id, work.dropped, "user")
            return {work.future.id}
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the client
            self._fail(work, exc)
            return {work.future.id}
        self.futures.complete(work.future.id, result)
        return {work.future.id}

    def _run_steps(self, batch: list[Work]) -> set[str]:
        try:
            results = self.run_steps(batch)
        except SlotsBusy:
            if len(batch) == 1:
                self._requeue(batch[0], RETRY_S)
                return set()
            done: set[str] = set()
            for work in batch:
                done |= self._run_steps([work])
            return done
        except BaseException as exc:  # noqa: BLE001
            if len(batch) == 1:
                self._fail(batch[0], exc)
                return {batch[0].future.id}
            logger.warning("batched step of %d tenants failed (%s: %s); running them one by one",
                           len(batch), type(exc).__name__, exc)
            done = set()
            for work in batch:
                done |= self._run_steps([work])
            return done
        for work in batch:
            self.futures.complete(work.future.id, results[work.future.id])
        return {w.future.id for w in batch}

    def _fail(self, work: Work, exc: BaseException) -> None:
        user = isinstance(exc, USER_ERRORS)
        if not user:
            logger.error("%s %s failed:\n%s", work.kind, work.future.id, traceback.format_exc())
        message = f"{type(exc).__name__}: {exc}" if not user else str(exc)
        self.futures.fail(work.future.id, message, "user" if user else "server")
