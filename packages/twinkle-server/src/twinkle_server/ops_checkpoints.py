"""save_weights / save_weights_for_sampler / load_weights, checkpoint listing and deletion, training runs.

``save_state`` writes ``weights/<name>`` (the tenant's PEFT adapter + optimizer state);
``save_weights_for_sampler`` writes ``sampler_weights/<name>`` (adapter only). Both are checkpoint
directories as every twinkle model writes them (``model.save``), so a checkpoint loads in plain
peft too. Only the key that made a checkpoint may list, load, inspect or delete it.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from twinkle_server.engine import lora_of_checkpoint
from twinkle_server.errors import ApiError, not_found
from twinkle_server.futures import Result
from twinkle_server.paths import CheckpointRef, PathError, check_name, parse_checkpoint_id, parse_tinker_path


def _time(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


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
        metadata = request.user_metadata

        def run() -> Result:
            if self.store.checkpoint(ref.model_id, ref.checkpoint_id, owner) is not None and not overwrite:
                raise ValueError(f"checkpoint {ref.tinker_path} exists; pick another name or pass overwrite=True.")
            self.engine.save(ref.model_id, directory, optimizer=(kind == "weights"))
            self.store.add_checkpoint(ref.model_id, ref.checkpoint_id, owner, _size(directory), metadata)
            return Result({"type": "save_weights" if kind == "weights" else "save_weights_for_sampler",
                           "path": ref.tinker_path})

        return self.untyped(self.submit(owner, "save_weights", request.model_id, request.seq_id, run=run))

    def save_weights_for_sampler(self, owner: str, request: Any) -> dict[str, Any]:
        if request.path is not None:
            return self.save_weights(owner, request, kind="sampler_weights")
        if request.sampling_session_seq_id is None:
            raise ApiError(400, "save_weights_for_sampler needs a path (a name) or a sampling_session_seq_id.")
        return self.snapshot_for_sampler(owner, request)

    # ----------------------------------------------------------------- loading
    def checkpoint_dir(self, owner: str, path: str, *, need_optimizer: bool) -> tuple[CheckpointRef, Path]:
        """The caller's checkpoint behind a ``tinker://`` path (404 for a foreign or missing one)."""
        try:
            ref = parse_tinker_path(path)
        except PathError as exc:
            raise ApiError(400, str(exc)) from None
        if self.store.checkpoint(ref.model_id, ref.checkpoint_id, owner) is None:
            raise not_found("checkpoint", path)
        if need_optimizer and ref.kind != "weights":
            raise ApiError(400, f"{path} holds sampler weights (no optimizer state); load it with "
                                "load_state / create_training_client_from_state, or pass a save_state path.")
        return ref, self.dirs.directory(ref)

    def load_weights(self, owner: str, request: Any) -> dict[str, Any]:
        ref, directory = self.checkpoint_dir(owner, request.path, need_optimizer=request.optimizer)
        if request.session_id is not None:
            return self._create_from_checkpoint(owner, request, ref, directory)
        if request.model_id is None:
            raise ApiError(400, "load_weights needs model_id (an existing model) or session_id + model_seq_id.")
        row = self.model_row(owner, request.model_id, trainable=False)

        def run() -> Result:
            self.engine.load(request.model_id, directory, optimizer=request.optimizer)
            if row["state"] == "restored":
                self.store.set_model_state(request.model_id, "active")
            return Result({"type": "load_weights", "path": ref.tinker_path, "model_id": request.model_id})

        return self.untyped(self.submit(owner, "load_weights", request.model_id, request.seq_id, run=run))

    def _create_from_checkpoint(self, owner: str, request: Any, ref: CheckpointRef, directory: Path) -> dict:
        self.session_row(owner, request.session_id)
        self.check_base_model(request.base_model)
        if request.optimizer_config is not None and getattr(request.optimizer_config, "type", "adamw") != "adamw":
            raise ApiError(400, "this server trains with AdamW only.")
        model_id = f"{request.session_id}:train:{request.model_seq_id}"
        if self.store.model(model_id, None) is not None:
            raise ApiError(400, f"model {model_id!r} already exists; use a new model_seq_id.")

        def run() -> Result:
            lora = self.engine.create_from_checkpoint(model_id, directory, optimizer=request.optimizer)
            self.store.add_model(model_id, owner, request.session_id, self.config.base_model_name, lora,
                                 request.user_metadata)
            self.scheduler.expect(model_id, 1)
            return Result({"type": "load_weights", "path": ref.tinker_path, "model_id": model_id})

        return self.untyped(self.submit(owner, "load_weights", model_id, None, run=run))

    # ----------------------------------------------------------------- listing
    def checkpoint_info(self, row: dict[str, Any]) -> dict[str, Any]:
        ref = parse_checkpoint_id(row["model_id"], row["checkpoint_id"])
        return {"checkpoint_id": ref.checkpoint_id, "checkpoint_type": ref.checkpoint_type,
                "time": _time(row["created"]), "tinker_path": ref.tinker_path, "size_bytes": row["size_bytes"],
                "public": False, "user_metadata": row["user_metadata"], "expires_at": None}

    def list_checkpoints(self, owner: str, model_id: str) -> dict[str, Any]:
        if self.store.model(model_id, owner) is None:
            raise not_found("training run", model_id)
        return {"checkpoints": [self.checkpoint_info(r) for r in self.store.checkpoints(owner, model_id)]}

    def list_user_checkpoints(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        rows = self.store.checkpoints(owner)
        page = rows[offset:offset + limit]
        return {"checkpoints": [self.checkpoint_info(r) for r in page],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(rows)}}

    def delete_checkpoint(self, owner: str, model_id: str, checkpoint_id: str) -> None:
        try:
            ref = parse_checkpoint_id(model_id, checkpoint_id)
        except PathError as exc:
            raise ApiError(400, str(exc)) from None
        if not self.store.delete_checkpoint(ref.model_id, ref.checkpoint_id, owner):
            raise not_found("checkpoint", ref.tinker_path)
        shutil.rmtree(self.dirs.directory(ref), ignore_errors=True)

    def weights_info(self, owner: str, tinker_path: str) -> dict[str, Any]:
        _, directory = self.checkpoint_dir(owner, tinker_path, need_optimizer=False)
        lora = lora_of_checkpoint(directory, self.engine.targets)
        return {"base_model": self.config.base_model_name, "is_lora": True, "lora_rank": lora["rank"],
                "optimizer_config": {"type": "adamw"}, "train_attn": lora["train_attn"],
                "train_mlp": lora["train_mlp"], "train_unembed": lora["train_unembed"]}

    def training_run(self, owner: str, model_id: str) -> dict[str, Any]:
        row = self.store.model(model_id, owner)
        if row is None:
            raise not_found("training run", model_id)
        checkpoints = [self.checkpoint_info(r) for r in self.store.checkpoints(owner, model_id)]
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

