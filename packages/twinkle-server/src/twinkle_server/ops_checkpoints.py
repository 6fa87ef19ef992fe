"""Checkpoints: save, load, list, delete, expire, and download; training runs.

``save_state`` writes ``weights/<name>`` (the tenant's PEFT adapter + optimizer state);
``save_weights_for_sampler`` writes ``sampler_weights/<name>`` (adapter only), and so do the
snapshots of ``save_weights_and_get_sampling_client`` (``sampler_weights/snapshot-...``, with
``server.snapshot_ttl_s``); ``save_weights_external`` writes ``external_weights/<name>``: the PEFT
adapter files, for download (age-encrypted when the client asks). All are checkpoint directories
as every twinkle model writes them (``model.save``), so a checkpoint loads in plain peft too. Only
the key that made a checkpoint may list, load, inspect, download, expire or delete it.

TTLs: ``ttl_seconds`` (or ``server.checkpoint_ttl_s`` / ``server.snapshot_ttl_s`` when the client
sends none) sets ``expires_at``; :meth:`CheckpointOps.expire_checkpoints` deletes what has expired.
"""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from twinkle_server.downloads import URL_TTL_S, DownloadError, listed_files
from twinkle_server.engine import lora_of_checkpoint
from twinkle_server.errors import ApiError, not_found
from twinkle_server.futures import Result
from twinkle_server.paths import CheckpointRef, PathError, check_name, parse_checkpoint_id, parse_tinker_path

#: The longest TTL a client may set (the client documents 10 years).
MAX_TTL_S = 10 * 365 * 86400
#: What a PEFT adapter download holds (the tokenizer files come along, so a client elsewhere can encode).
EXPORT_FILES = ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt",
                "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def _time(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def expiry(ttl_seconds: Any, default_s: float) -> float | None:
    """``expires_at`` for a client's ``ttl_seconds`` (None: ``default_s``, 0 meaning never)."""
    if ttl_seconds is None:
        return time.time() + default_s if default_s > 0 else None
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not 1 <= ttl_seconds <= MAX_TTL_S:
        raise ApiError(400, f"ttl_seconds={ttl_seconds!r} is not allowed; use 1..{MAX_TTL_S} seconds, or none for "
                            "no expiry.")
    return time.time() + ttl_seconds


class CheckpointOps:
    """Checkpoint half of :class:`twinkle_server.service.Service`."""

    # ------------------------------------------------------------------ saving
    def save_weights(self, owner: str, request: Any, kind: str = "weights") -> dict[str, Any]:
        self.model_row(owner, request.model_id)
        name = request.path or f"step-{request.seq_id or 0:06d}"
        try:
            ref = CheckpointRef(request.model_id, kind, check_name(name))
            directory = self.dirs.directory(ref)
        except PathError as exc:
            raise ApiError(400, str(exc)) from None
        overwrite = bool(getattr(request, "overwrite", False))
        metadata = getattr(request, "user_metadata", None)
        expires_at = expiry(getattr(request, "ttl_seconds", None), self.config.server.checkpoint_ttl_s)
        recipients = getattr(request, "age_encryption_recipients", None) or []
        if recipients:
            check_recipients(recipients)
        result_type = {"weights": "save_weights", "sampler_weights": "save_weights_for_sampler",
                       "external_weights": "save_weights_external"}[kind]

        def run() -> Result:
            if self.store.checkpoint(ref.model_id, ref.checkpoint_id, owner) is not None and not overwrite:
                raise ValueError(f"checkpoint {ref.tinker_path} exists; pick another name or pass overwrite=True.")
            self.engine.save(ref.model_id, directory, optimizer=(kind == "weights"))
            if kind == "external_weights":
                export_only(directory, recipients)
            self.store.add_checkpoint(ref.model_id, ref.checkpoint_id, owner, _size(directory), metadata, expires_at)
            return Result({"type": result_type, "path": ref.tinker_path})

        return self.untyped(self.submit(owner, "save_weights", request.model_id, request.seq_id, run=run))

    def save_weights_for_sampler(self, owner: str, request: Any) -> dict[str, Any]:
        if request.path is not None:
            return self.save_weights(owner, request, kind="sampler_weights")
        if request.sampling_session_seq_id is None:
            raise ApiError(400, "save_weights_for_sampler needs a path (a name) or a sampling_session_seq_id.")
        return self.snapshot_for_sampler(owner, request)

    def save_weights_external(self, owner: str, request: Any) -> dict[str, Any]:
        return self.save_weights(owner, request, kind="external_weights")

    # ----------------------------------------------------------------- loading
    def checkpoint_dir(self, owner: str, path: str, *, need_optimizer: bool) -> tuple[CheckpointRef, Path]:
        """The caller's checkpoint behind a ``tinker://`` path (404 for a foreign or missing one)."""
        try:
            ref = parse_tinker_path(path)
        except PathError as exc:
            raise ApiError(400, str(exc)) from None
        row = self.store.checkpoint(ref.model_id, ref.checkpoint_id, owner)
        if row is None or (row["expires_at"] is not None and row["expires_at"] <= time.time()):
            raise not_found("checkpoint", path)
        if need_optimizer and ref.kind != "weights":
            raise ApiError(400, f"{path} holds no optimizer state; load it with load_state / "
                                "create_training_client_from_state, or pass a save_state path.")
        return ref, self.dirs.directory(ref)

    def load_weights(self, owner: str, request: Any) -> dict[str, Any]:
        ref, directory = self.checkpoint_dir(owner, request.path, need_optimizer=request.optimizer)
        if ref.kind == "external_weights":
            raise ApiError(400, f"{request.path} is an export for download; load a save_state or "
                                "save_weights_for_sampler path.")
        if request.session_id is not None:
            return self._create_from_checkpoint(owner, request, ref, directory)
        if request.model_id is None:
            raise ApiError(400, "load_weights needs model_id (an existing model) or session_id + model_seq_id.")
        row = self.model_row(owner, request.model_id, trainable=False)

        def run() -> Result:
            if not self.engine.has(request.model_id):  # restored after a restart: it gets a slot now
                self.engine.create(request.model_id, row["lora"])
            self.engine.load(request.model_id, directory, optimizer=request.optimizer)
            self.store.set_weights_version(request.model_id, self.engine.weights_version[request.model_id])
            if row["state"] == "restored":
                self.store.set_model_state(request.model_id, "active")
            return Result({"type": "load_weights", "path": ref.tinker_path, "model_id": request.model_id})

        return self.untyped(self.submit(owner, "load_weights", request.model_id, request.seq_id, run=run))

    def _create_from_checkpoint(self, owner: str, request: Any, ref: CheckpointRef, directory: Path) -> dict:
        from twinkle_server.checks import CheckError, check_seq_id

        self.session_row(owner, request.session_id)
        self.check_base_model(request.base_model)
        if request.optimizer_config is not None and getattr(request.optimizer_config, "type", "adamw") != "adamw":
            raise ApiError(400, "this server trains with AdamW only.")
        try:
            check_seq_id("model_seq_id", request.model_seq_id)
        except CheckError as exc:
            raise ApiError(400, str(exc)) from None
        model_id = f"{request.session_id}:train:{request.model_seq_id}"
        if self.store.model(model_id, None) is not None:
            raise ApiError(400, f"model {model_id!r} already exists; use a new model_seq_id.")

        def run() -> Result:
            lora = self.engine.create_from_checkpoint(model_id, directory, optimizer=request.optimizer)
            self.store.add_model(model_id, owner, request.session_id, self.config.base_model_name, lora,
                                 request.user_metadata)
            self.store.set_weights_version(model_id, self.engine.weights_version[model_id])
            self.scheduler.expect(model_id, 1)
            return Result({"type": "load_weights", "path": ref.tinker_path, "model_id": model_id})

        return self.untyped(self.submit(owner, "load_weights", model_id, None, run=run))

    # ----------------------------------------------------------------- listing
    def checkpoint_info(self, row: dict[str, Any]) -> dict[str, Any]:
        ref = parse_checkpoint_id(row["model_id"], row["checkpoint_id"])
        return {"checkpoint_id": ref.checkpoint_id, "checkpoint_type": ref.checkpoint_type,
                "time": _time(row["created"]), "tinker_path": ref.tinker_path, "size_bytes": row["size_bytes"],
                "public": False, "user_metadata": row["user_metadata"], "expires_at": _time(row.get("expires_at"))}

    def _live(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now = time.time()
        return [r for r in rows if r.get("expires_at") is None or r["expires_at"] > now]

    def list_checkpoints(self, owner: str, model_id: str) -> dict[str, Any]:
        if self.store.model(model_id, owner) is None:
            raise not_found("training run", model_id)
        return {"checkpoints": [self.checkpoint_info(r) for r in self._live(self.store.checkpoints(owner, model_id))]}

    def list_user_checkpoints(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        rows = self._live(self.store.checkpoints(owner))
        page = rows[offset:offset + limit]
        return {"checkpoints": [self.checkpoint_info(r) for r in page],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(rows)}}

    def _own_ref(self, owner: str, model_id: str, checkpoint_id: str) -> CheckpointRef:
        try:
            ref = parse_checkpoint_id(model_id, checkpoint_id)
        except PathError as exc:
            raise ApiError(400, str(exc)) from None
        row = self.store.checkpoint(ref.model_id, ref.checkpoint_id, owner)
        if row is None or (row["expires_at"] is not None and row["expires_at"] <= time.time()):
            raise not_found("checkpoint", ref.tinker_path)
        return ref

    def delete_checkpoint(self, owner: str, model_id: str, checkpoint_id: str) -> None:
        try:
            ref = parse_checkpoint_id(model_id, checkpoint_id)
        except PathError as exc:
            raise ApiError(400, str(exc)) from None
        if not self.store.delete_checkpoint(ref.model_id, ref.checkpoint_id, owner):
            raise not_found("checkpoint", ref.tinker_path)
        shutil.rmtree(self.dirs.directory(ref), ignore_errors=True)

    def set_checkpoint_ttl(self, owner: str, model_id: str, checkpoint_id: str, ttl_seconds: Any) -> None:
        ref = self._own_ref(owner, model_id, checkpoint_id)
        self.store.set_checkpoint_expiry(ref.model_id, ref.checkpoint_id, owner, expiry(ttl_seconds, 0.0))

    def publish_checkpoint(self, owner: str, model_id: str, checkpoint_id: str) -> None:
        raise ApiError(400, "publishing checkpoints is not supported by this server: checkpoints stay private to "
                            "the API key that made them. Share one by downloading it (tinker checkpoint download).")

    def expire_checkpoints(self) -> int:
        """Delete every checkpoint whose ``expires_at`` has passed (files and registry rows)."""
        count = 0
        for row in self.store.expired_checkpoints(time.time()):
            ref = parse_checkpoint_id(row["model_id"], row["checkpoint_id"])
            if self.store.delete_checkpoint(ref.model_id, ref.checkpoint_id, row["owner"]):
                shutil.rmtree(self.dirs.directory(ref), ignore_errors=True)
                count += 1
        return count

    def weights_info(self, owner: str, tinker_path: str) -> dict[str, Any]:
        _, directory = self.checkpoint_dir(owner, tinker_path, need_optimizer=False)
        lora = lora_of_checkpoint(directory, self.engine.targets)
        return {"base_model": self.config.base_model_name, "is_lora": True, "lora_rank": lora["rank"],
                "optimizer_config": {"type": "adamw"}, "train_attn": lora["train_attn"],
                "train_mlp": lora["train_mlp"], "train_unembed": lora["train_unembed"]}

    # --------------------------------------------------------------- downloads
    def external_weights_urls(self, owner: str, model_id: str, checkpoint_id: str, base_url: str) -> dict[str, Any]:
        """Signed URLs, one per file, of the caller's checkpoint (any kind; the client asks for external ones)."""
        ref = self._own_ref(owner, model_id, checkpoint_id)
        expires = time.time() + URL_TTL_S
        urls = {f: f"{base_url}/api/v1/downloads/{self.signer.token(owner, ref.tinker_path, f, expires)}"
                for f in listed_files(self.dirs.directory(ref))}
        return {"urls": urls, "expires": _time(expires)}

    def archive_url(self, owner: str, model_id: str, checkpoint_id: str, base_url: str) -> dict[str, Any]:
        """A signed URL of the whole checkpoint directory as a tar (streamed)."""
        ref = self._own_ref(owner, model_id, checkpoint_id)
        expires = time.time() + URL_TTL_S
        token = self.signer.token(owner, ref.tinker_path, "*", expires)
        return {"url": f"{base_url}/api/v1/downloads/{token}", "expires": _time(expires)}

    def download(self, token: str) -> tuple[Path, str | None, str]:
        """``(directory, file or None for the tar, archive name)`` behind a signed token (404 if gone)."""
        try:
            claims = self.signer.check(token)
        except DownloadError as exc:
            raise ApiError(403, str(exc)) from None
        except (ValueError, KeyError, TypeError):
            raise ApiError(403, "this download link is not valid; ask for a new one.") from None
        ref, directory = self.checkpoint_dir(claims["o"], claims["p"], need_optimizer=False)
        if claims["f"] == "*":
            return directory, None, ref.name
        if claims["f"] not in listed_files(directory):
            raise not_found("file", claims["f"])
        return directory, claims["f"], ref.name

    # ------------------------------------------------------------------- runs
    def training_run(self, owner: str, model_id: str) -> dict[str, Any]:
        row = self.store.model(model_id, owner)
        if row is None:
            raise not_found("training run", model_id)
        checkpoints = [self.checkpoint_info(r) for r in self._live(self.store.checkpoints(owner, model_id))]
        last = {kind: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == kind), None)
                for kind in ("training", "sampler")}
        return {"training_run_id": model_id, "base_model": row["base_model"], "model_owner": owner, "is_lora": True,
                "corrupted": False, "lora_rank": row["lora"]["rank"], "last_request_time": _time(row["last_request"]),
                "last_checkpoint": last["training"], "last_sampler_checkpoint": last["sampler"],
                "user_metadata": {str(k): str(v) for k, v in (row["user_metadata"] or {}).items()} or None}

    def training_runs(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        rows = self.store.models(owner)
        return {"training_runs": [self.training_run(owner, r["id"]) for r in rows[offset:offset + limit]],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(rows)}}


def check_recipients(recipients: list[str]) -> None:
    """age recipients the server can encrypt to (x25519 ``age1...`` keys or SSH public keys)."""
    try:
        import pyrage
    except ImportError:
        raise ApiError(400, "age_encryption_recipients needs pyrage on the server (pip install pyrage); export "
                            "without encryption.") from None
    for recipient in recipients:
        try:
            _recipient(pyrage, recipient)
        except Exception:  # noqa: BLE001 - pyrage raises its own error types
            raise ApiError(400, f"age recipient {recipient[:40]!r} is not an age1... key or an SSH public key.") \
                from None


def _recipient(pyrage: Any, text: str) -> Any:
    if text.startswith("age1"):
        return pyrage.x25519.Recipient.from_str(text)
    return pyrage.ssh.Recipient.from_str(text)


def export_only(directory: Path, recipients: list[str]) -> None:
    """Keep the adapter (and tokenizer) files of a saved checkpoint; encrypt them to ``recipients`` if any."""
    for path in list(directory.iterdir()):
        if path.name not in EXPORT_FILES:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    if recipients:
        import pyrage

        keys = [_recipient(pyrage, r) for r in recipients]
        for path in list(directory.iterdir()):
            encrypted = path.with_name(path.name + ".age")
            encrypted.write_bytes(pyrage.encrypt(path.read_bytes(), keys))
            path.unlink()
