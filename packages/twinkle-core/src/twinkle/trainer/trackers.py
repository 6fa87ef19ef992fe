"""Experiment trackers: one record per optimizer step (loss, lr, grad_norm, tokens/s, memory...)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    def log(self, step: int, record: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlTracker:
    """``work_dir/logs/metrics.jsonl``; on resume, records past the resumed step (lost work) are dropped."""

    def __init__(self, log_dir: Path, resume_step: int = 0) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / "metrics.jsonl"
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step_of(line) <= resume_step]
            self.path.write_text("".join(f"{line}\n" for line in kept))
        self._handle = self.path.open("a", encoding="utf-8")

    def log(self, step: int, record: dict[str, float]) -> None:
        self._handle.write(json.dumps({"step": step, **record}, sort_keys=True) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62  # an unreadable (half-written) line is dropped


class TensorboardTracker:
    """torch.utils.tensorboard event files under ``work_dir/tensorboard`` (needs the tensorboard package)."""

    def __init__(self, log_dir: Path, resume_step: int = 0) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError("exp_tracker='tensorboard' needs the tensorboard package: pip install tensorboard "
                              "(or use exp_tracker='jsonl').") from exc
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step: int, record: dict[str, float]) -> None:
        for key, value in record.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def make_tracker(kind: str, work_dir: Path, resume_step: int = 0, log_dir: Path | None = None) -> Any:
    """The tracker writing under ``log_dir`` (default: ``work_dir/logs``, ``work_dir/tensorboard`` for tensorboard)."""
    if kind == "tensorboard":
        return TensorboardTracker(log_dir or work_dir / "tensorboard", resume_step)
    return JsonlTracker(log_dir or work_dir / "logs", resume_step)
