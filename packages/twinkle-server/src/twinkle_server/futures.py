"""Futures: every queued request answers ``{"request_id"}`` at once and its result is fetched later.

``retrieve_future`` waits a little (long poll) and answers ``try_again`` while the work is queued or
running, the result when done, or ``{"error", "category"}`` when it failed. Results live in memory
(binary ones: forward/backward outputs, samples); JSON ones are also written to the registry, so a
restarted server still answers them. A future whose work was lost in a crash answers an error.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from twinkle_server.store import Store

#: Done futures are kept in memory this long for (repeated) retrieval.
KEEP_S = 900.0


@dataclass
class Result:
    """A finished request: a JSON body, and for protobuf-capable results the protobuf body too."""

    json: dict[str, Any]
    proto: bytes | None = None
    persist: bool = True  # write the JSON to the registry (small results only)


@dataclass
class FutureRecord:
    id: str
    owner: str
    model_id: str | None
    kind: str
    state: str = "queued"  # queued | running | done | failed
    result: Result | None = None
    error: str | None = None
    category: str = "unknown"
    finished_at: float | None = None
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


class FutureTable:
    """Futures by id, owned by API-key owners; completion wakes the HTTP pollers on their event loop."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._records: dict[str, FutureRecord] = {}
        self._inflight: Counter[str] = Counter()

    def create(self, owner: str, model_id: str | None, kind: str) -> FutureRecord:
        record = FutureRecord(f"{kind}-{secrets.token_hex(10)}", owner, model_id, kind)
        self.store.add_future(record.id, owner, model_id, kind)
        with self._lock:
            self._records[record.id] = record
            self._inflight[owner] += 1
        return record

    def inflight(self, owner: str) -> int:
        with self._lock:
            return self._inflight[owner]

    def start(self, future_id: str) -> None:
        with self._lock:
            record = self._records.get(future_id)
            if record is not None and record.state == "queued":
                record.state = "running"

    def complete(self, future_id: str, result: Result) -> None:
        self.store.finish_future(future_id, result.json if result.persist else None)
        self._finish(future_id, "done", result=result)

    def fail(self, future_id: str, error: str, category: str) -> None:
        self.store.fail_future(future_id, error, category)
        self._finish(future_id, "failed", error=error, category=category)

    def _finish(self, future_id: str, state: str, **values: Any) -> None:
        with self._lock:
            record = self._records.get(future_id)
            if record is None or record.finished:
                return
            record.state, record.finished_at = state, time.monotonic()
            for key, value in values.items():
                setattr(record, key, value)
            self._inflight[record.owner] -= 1
            waiters, record.waiters = record.waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)

    def get(self, future_id: str, owner: str) -> FutureRecord | None:
        """The caller's future (memory, then the registry), or None -- also for another owner's id."""
        with self._lock:
            record = self._records.get(future_id)
        if record is not None:
            return record if record.owner == owner else None
        row = self.store.future(future_id, owner)
        if row is None:
            return None
        if row["state"] == "done" and row["result"] is not None:
            return FutureRecord(row["id"], owner, row["model_id"], row["kind"], "done", Result(row["result"]))
        if row["state"] == "done":
            return FutureRecord(row["id"], owner, row["model_id"], row["kind"], "failed", error=(
                "the result of this request was held in memory and is gone (the server restarted or it expired); "
                "run the request again"), category="server")
        if row["state"] == "failed":
            return FutureRecord(row["id"], owner, row["model_id"], row["kind"], "failed", error=row["error"],
                                category=row["category"] or "unknown")
        return FutureRecord(row["id"], owner, row["model_id"], row["kind"], "failed", category="server",
                            error="this request was lost (the server restarted before it finished); send it again")

    async def wait(self, record: FutureRecord, timeout: float) -> None:
        """Return when ``record`` finishes or ``timeout`` seconds pass."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        with self._lock:
            if record.finished:
                return
            record.waiters.append((loop, waiter))
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                if (loop, waiter) in record.waiters:
                    record.waiters.remove((loop, waiter))

    def prune(self) -> None:
        """Forget results retrieved long ago (JSON ones stay answerable from the registry)."""
        cutoff = time.monotonic() - KEEP_S
        with self._lock:
            for key in [k for k, r in self._records.items() if r.finished_at is not None and r.finished_at < cutoff]:
                del self._records[key]


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
