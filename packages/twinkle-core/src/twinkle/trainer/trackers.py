"""Experiment trackers: one record per optimizer step (loss, lr, grad_norm, tokens/s, memory...)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    def log(self, step: int, record: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlTracker:
    """``log_dir/metrics.jsonl``, appended to and never rewritten: every record names its ``run``.

    A resumed run writes ``{"run": ..., "event": "resumed", "step": N}`` and then its records from step N+1;
    records of the same run and step written before it (work lost by the interruption) are superseded:
    readers (``twinkle plot``, :func:`read_records`) keep the last record of each run, step and kind.
    """

    def __init__(self, log_dir: Path, resume_step: int = 0, run_id: str = "") -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / "metrics.jsonl"
        self.run_id = run_id
        self._handle = self.path.open("a", encoding="utf-8")
        if self.path.stat().st_size and not _ends_with_newline(self.path):
            self._handle.write("\n")  # a line cut by a kill stays one broken line, not glued to ours
        if resume_step:
            self._write({"run": run_id, "event": "resumed", "step": resume_step, "time": time.time()})

    def log(self, step: int, record: dict[str, float]) -> None:
        self._write({"run": self.run_id, "step": step, **record})

    def _write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, 2)
        return handle.read(1) == b"\n"


def read_records(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The metric records of ``metrics.jsonl`` by run (in order of first appearance), each run's records by
    step: the last one of each step and kind (training / evaluation) wins; unreadable lines are skipped."""
    runs: dict[str, dict[tuple[int, bool], dict[str, Any]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            continue
        run = str(record.get("run", ""))
        kept = runs.setdefault(run, {})
        if record.get("event") == "resumed":  # what the interrupted part wrote past this step was lost
            for key in [k for k in kept if k[0] > step]:
                del kept[key]
            continue
        if "event" in record:
            continue
        kept[(step, any(k.startswith("eval_") for k in record))] = record
    return {run: [kept[k] for k in sorted(kept)] for run, kept in runs.items()}


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


def make_tracker(kind: str, work_dir: Path, resume_step: int = 0, log_dir: Path | None = None,
                 run_id: str = "") -> Any:
    """The tracker writing under ``log_dir`` (default: ``work_dir/logs``, ``work_dir/tensorboard`` for tensorboard)."""
    if kind == "tensorboard":
        return TensorboardTracker(log_dir or work_dir / "tensorboard", resume_step)
    return JsonlTracker(log_dir or work_dir / "logs", resume_step, run_id)
