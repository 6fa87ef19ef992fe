"""The registry of sessions, models, checkpoints, samplers and futures: sqlite in the work dir.

Everything a restarted server needs to answer for is here: which models exist (to re-create their
slots), which checkpoints they own, and which futures were pending (they become errors). Rows
carry their ``owner``; every lookup takes the caller's owner, so another key's row reads as
missing. One connection, guarded by a lock (the HTTP threads and the worker share it); WAL mode, so
a committed row survives the process being killed.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, heartbeat REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0, user_metadata TEXT, sdk_version TEXT,
    model_counter INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
    lora TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL, last_request REAL NOT NULL,
    user_metadata TEXT, weights_version TEXT);
CREATE TABLE IF NOT EXISTS checkpoints (
    model_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, owner TEXT NOT NULL, created REAL NOT NULL,
    size_bytes INTEGER, user_metadata TEXT, expires_at REAL, PRIMARY KEY (model_id, checkpoint_id));
CREATE TABLE IF NOT EXISTS samplers (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT NOT NULL, model_id TEXT, model_path TEXT,
    base_model TEXT NOT NULL, weights_version TEXT, created REAL NOT NULL, clients INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS futures (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, model_id TEXT, kind TEXT NOT NULL, state TEXT NOT NULL,
    created REAL NOT NULL, result TEXT, error TEXT, category TEXT);
"""

#: Columns added after the first release: (table, column, type).
_ADDED_COLUMNS = (("models", "weights_version", "TEXT"), ("checkpoints", "expires_at", "REAL"))

#: Model states: a slot holds its weights ('active'); re-created after a restart, waiting for a
#: load ('restored'); slot released ('unloaded').
MODEL_STATES = ("active", "restored", "unloaded")


class Store:
    """Thin typed access to the registry tables (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        for table, column, kind in _ADDED_COLUMNS:  # a registry written before these columns existed
            have = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _one(self, sql: str, *args: Any) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(sql, args).fetchone()
        return dict(row) if row is not None else None

    def _all(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, args).fetchall()]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ sessions
    def add_session(self, session_id: str, owner: str, user_metadata: Any, sdk_version: str | None) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO sessions (id, owner, created, heartbeat, user_metadata, sdk_version) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (session_id, owner, now, now, _dump(user_metadata), sdk_version))

    def session(self, session_id: str, owner: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM sessions WHERE id = ? AND owner = ?", session_id, owner)
        if row is not None:
            row["user_metadata"] = _load(row["user_metadata"])
        return row

    def heartbeat(self, session_id: str, owner: str) -> bool:
        with self._tx() as db:
            cur = db.execute("UPDATE sessions SET heartbeat = ? WHERE id = ? AND owner = ? AND finished = 0",
                             (time.time(), session_id, owner))
            return cur.rowcount == 1

    def finish_session(self, session_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE sessions SET finished = 1 WHERE id = ?", (session_id,))

    def expired_sessions(self, older_than: float) -> list[tuple[str, str]]:
        """``(session id, owner)`` of open sessions whose last heartbeat is older than ``older_than``."""
        rows = self._all("SELECT id, owner FROM sessions WHERE finished = 0 AND heartbeat < ?", older_than)
        return [(r["id"], r["owner"]) for r in rows]

    def touch_all_sessions(self) -> None:
        """After a restart: every open session gets a fresh heartbeat (its client was cut off, not gone)."""
        with self._tx() as db:
            db.execute("UPDATE sessions SET heartbeat = ? WHERE finished = 0", (time.time(),))

    def sessions(self, owner: str) -> list[str]:
        return [r["id"] for r in self._all("SELECT id FROM sessions WHERE owner = ? ORDER BY created", owner)]

    # -------------------------------------------------------------------- models
    def add_model(self, model_id: str, owner: str, session_id: str, base_model: str, lora: dict[str, Any],
                  user_metadata: Any) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO models (id, owner, session_id, base_model, lora, state, created, last_request, "
                       "user_metadata) VALUES (?, ?, ?, ?, ?, 'active', ?, ?, ?)",
                       (model_id, owner, session_id, base_model, json.dumps(lora), now, now, _dump(user_metadata)))

    def model(self, model_id: str, owner: str | None) -> dict[str, Any] | None:
        """The model row (``owner=None``: any owner, for the server's own use)."""
        row = self._one("SELECT * FROM models WHERE id = ?", model_id)
        if row is None or (owner is not None and row["owner"] != owner):
            return None
        row["lora"] = json.loads(row["lora"])
        row["user_metadata"] = _load(row["user_metadata"])
        return row

    def set_model_state(self, model_id: str, state: str) -> None:
        assert state in MODEL_STATES, state
        with self._tx() as db:
            db.execute("UPDATE models SET state = ?, last_request = ? WHERE id = ?", (state, time.time(), model_id))

    def set_weights_version(self, model_id: str, version: str | None) -> None:
        """The token naming the model's current weights (None: lost, matches no sampling snapshot)."""
        with self._tx() as db:
            db.execute("UPDATE models SET weights_version = ? WHERE id = ?", (version, model_id))

    def models(self, owner: str | None = None, states: tuple[str, ...] = MODEL_STATES) -> list[dict[str, Any]]:
        marks = ",".join("?" * len(states))
        rows = self._all(f"SELECT id FROM models WHERE state IN ({marks}) ORDER BY created", *states)
        found = [self.model(r["id"], owner) for r in rows]
        return [m for m in found if m is not None]

    def session_models(self, session_id: str) -> list[str]:
        return [r["id"] for r in self._all("SELECT id FROM models WHERE session_id = ? AND state != 'unloaded'",
                                           session_id)]

    # --------------------------------------------------------------- checkpoints
    def add_checkpoint(self, model_id: str, checkpoint_id: str, owner: str, size_bytes: int,
                       user_metadata: Any, expires_at: float | None = None) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO checkpoints (model_id, checkpoint_id, owner, created, size_bytes, "
                       "user_metadata, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (model_id, checkpoint_id, owner, time.time(), size_bytes, _dump(user_metadata), expires_at))

    def set_checkpoint_expiry(self, model_id: str, checkpoint_id: str, owner: str, expires_at: float | None) -> bool:
        with self._tx() as db:
            cur = db.execute("UPDATE checkpoints SET expires_at = ? WHERE model_id = ? AND checkpoint_id = ? AND "
                             "owner = ?", (expires_at, model_id, checkpoint_id, owner))
            return cur.rowcount == 1

    def expired_checkpoints(self, now: float) -> list[dict[str, Any]]:
        return self._all("SELECT model_id, checkpoint_id, owner FROM checkpoints WHERE expires_at IS NOT NULL AND "
                         "expires_at <= ?", now)

    def checkpoint(self, model_id: str, checkpoint_id: str, owner: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM checkpoints WHERE model_id = ? AND checkpoint_id = ? AND owner = ?",
                        model_id, checkpoint_id, owner)
        if row is not None:
            row["user_metadata"] = _load(row["user_metadata"])
        return row

    def checkpoints(self, owner: str, model_id: str | None = None) -> list[dict[str, Any]]:
        if model_id is None:
            rows = self._all("SELECT * FROM checkpoints WHERE owner = ? ORDER BY created", owner)
        else:
            rows = self._all("SELECT * FROM checkpoints WHERE owner = ? AND model_id = ? ORDER BY created",
                             owner, model_id)
        for row in rows:
            row["user_metadata"] = _load(row["user_metadata"])
        return rows

    def delete_checkpoint(self, model_id: str, checkpoint_id: str, owner: str) -> bool:
        with self._tx() as db:
            cur = db.execute("DELETE FROM checkpoints WHERE model_id = ? AND checkpoint_id = ? AND owner = ?",
                             (model_id, checkpoint_id, owner))
            return cur.rowcount == 1

    # ------------------------------------------------------------------ samplers
    def add_sampler(self, sampler_id: str, owner: str, session_id: str, model_id: str | None,
                    model_path: str | None, base_model: str, weights_version: str | None) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO samplers (id, owner, session_id, model_id, model_path, base_model, "
                       "weights_version, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (sampler_id, owner, session_id, model_id, model_path, base_model, weights_version,
                        time.time()))

    def sampler(self, sampler_id: str, owner: str) -> dict[str, Any] | None:
        return self._one("SELECT * FROM samplers WHERE id = ? AND owner = ?", sampler_id, owner)

    def samplers_of_path(self, model_path: str) -> list[str]:
        return [r["id"] for r in self._all("SELECT id FROM samplers WHERE model_path = ?", model_path)]

    def session_samplers(self, session_id: str) -> list[str]:
        return [r["id"] for r in self._all("SELECT id FROM samplers WHERE session_id = ? ORDER BY created",
                                           session_id)]

    def join_sampler(self, sampler_id: str) -> int:
        """A new client id within the sampling session (the original client is 0)."""
        with self._tx() as db:
            row = db.execute("SELECT clients FROM samplers WHERE id = ?", (sampler_id,)).fetchone()
            db.execute("UPDATE samplers SET clients = clients + 1 WHERE id = ?", (sampler_id,))
            return int(row["clients"])

    # ------------------------------------------------------------------- futures
    def add_future(self, future_id: str, owner: str, model_id: str | None, kind: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO futures (id, owner, model_id, kind, state, created) VALUES (?, ?, ?, ?, "
                       "'queued', ?)", (future_id, owner, model_id, kind, time.time()))

    def finish_future(self, future_id: str, result: Any | None) -> None:
        """Done; a JSON ``result`` is kept (it survives a restart), a binary one only in memory."""
        with self._tx() as db:
            db.execute("UPDATE futures SET state = 'done', result = ? WHERE id = ?",
                       (None if result is None else json.dumps(result), future_id))

    def fail_future(self, future_id: str, error: str, category: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE futures SET state = 'failed', error = ?, category = ? WHERE id = ?",
                       (error, category, future_id))

    def future(self, future_id: str, owner: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM futures WHERE id = ? AND owner = ?", future_id, owner)
        if row is not None and row["result"] is not None:
            row["result"] = json.loads(row["result"])
        return row

    def fail_unfinished_futures(self, error: str) -> int:
        """After a restart: the work of every queued/running future was lost; they answer ``error``."""
        with self._tx() as db:
            cur = db.execute("UPDATE futures SET state = 'failed', error = ?, category = 'server' "
                             "WHERE state = 'queued'", (error,))
            return cur.rowcount


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)
