"""``tinker://`` checkpoint paths and where they live in the work dir; nothing a client sends leaves it.

A checkpoint path is ``tinker://<model_id>/<kind>/<name>`` with kind ``weights`` (``save_state``:
adapter + optimizer), ``sampler_weights`` (``save_weights_for_sampler`` and the snapshots of
``save_weights_and_get_sampling_client``: adapter only) or ``external_weights``
(``save_weights_external``: the PEFT adapter files, for download), the
layout the client's ``ParsedCheckpointTinkerPath`` parses. On disk it is
``<work_dir>/checkpoints/<model_id with ':' as '~'>/<kind>/<name>``. Names are single plain
path components; every resolved path is checked to lie inside the checkpoints directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SCHEME = "tinker://"
KINDS = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_MODEL_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}:train:[0-9]{1,9}$")


class PathError(ValueError):
    """A client-supplied path or name is malformed or points outside the work dir."""


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint: the model it belongs to, its kind directory and its name."""

    model_id: str
    kind: str  # "weights" | "sampler_weights"
    name: str

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def tinker_path(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.checkpoint_id}"

    @property
    def checkpoint_type(self) -> str:
        return KINDS[self.kind]


def check_name(name: str, what: str = "checkpoint name") -> str:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise PathError(f"{what} {name!r} is not allowed: use 1-128 letters, digits, '_', '-' or '.' (no '/', "
                        "not starting with '.' or '-'), e.g. 'step-100'.")
    return name


def check_model_id(model_id: str) -> str:
    if not isinstance(model_id, str) or not _MODEL_ID.match(model_id):
        raise PathError(f"model id {model_id!r} is malformed; ids look like '<session>:train:<n>'.")
    return model_id


def parse_tinker_path(path: str) -> CheckpointRef:
    """``tinker://<model_id>/<kind>/<name>`` -> its parts, each validated."""
    if not isinstance(path, str) or not path.startswith(SCHEME):
        raise PathError(f"{path!r} is not a checkpoint path; expected 'tinker://<model_id>/weights/<name>' as "
                        "returned by save_state / save_weights_for_sampler.")
    parts = path[len(SCHEME):].split("/")
    if len(parts) != 3 or parts[1] not in KINDS:
        raise PathError(f"{path!r} is not a checkpoint path; expected 'tinker://<model_id>/weights/<name>', "
                        "'tinker://<model_id>/sampler_weights/<name>' or 'tinker://<model_id>/external_weights/<name>'.")
    return CheckpointRef(check_model_id(parts[0]), parts[1], check_name(parts[2]))


def parse_checkpoint_id(model_id: str, checkpoint_id: str) -> CheckpointRef:
    """A REST ``(training_run_id, checkpoint_id)`` pair, e.g. ``('s:train:0', 'weights/step-1')``."""
    kind, _, name = checkpoint_id.partition("/")
    if kind not in KINDS:
        raise PathError(f"checkpoint id {checkpoint_id!r} is malformed; expected 'weights/<name>', "
                        "'sampler_weights/<name>' or 'external_weights/<name>'.")
    return CheckpointRef(check_model_id(model_id), kind, check_name(name))


class CheckpointDirs:
    """Maps checkpoint refs to directories under ``<work_dir>/checkpoints`` (and refuses anything else)."""

    def __init__(self, work_dir: str | Path) -> None:
        self.root = (Path(work_dir).expanduser().resolve() / "checkpoints")
        self.root.mkdir(parents=True, exist_ok=True)

    def model_dir(self, model_id: str) -> Path:
        return self._inside(self.root / check_model_id(model_id).replace(":", "~"))

    def kind_dir(self, model_id: str, kind: str) -> Path:
        if kind not in KINDS:
            raise PathError(f"unknown checkpoint kind {kind!r}.")
        return self._inside(self.model_dir(model_id) / kind)

    def directory(self, ref: CheckpointRef) -> Path:
        return self._inside(self.kind_dir(ref.model_id, ref.kind) / check_name(ref.name))

    def _inside(self, path: Path) -> Path:
        resolved = path.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise PathError(f"{str(path)!r} is outside the server's checkpoint directory.")
        return resolved
