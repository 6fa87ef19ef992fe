"""Who owns a work_dir's results: the run record, the guard against mixing runs, the best-checkpoint record.

``work_dir/run.json`` names the run that owns the checkpoints, exports and ``best-checkpoint`` there (its
id, start, command). A new run that finds another run's results either continues that run
(``auto_resume``, or ``load_checkpoint.checkpoint_path`` inside this work_dir), replaces it (``overwrite``:
its checkpoints, exports and best checkpoint are deleted; its logs stay), or is refused with a message
naming it. So rotation only ever sees one run's checkpoints, and ``best-checkpoint`` only ever holds the
best evaluation of the run that owns the work_dir (``best-checkpoint.json`` records which).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.config import ConfigError
from twinkle.log import get_logger

logger = get_logger()
RUN_FILE = "run.json"
BEST_DIR = "best-checkpoint"
BEST_FILE = "best-checkpoint.json"
HF_DIR = "hf"


class WorkDirInUseError(ConfigError):
    """The work_dir holds another run's results and this run was told neither to continue nor to replace it."""


@dataclass
class Run:
    """This run's identity in the work_dir; ``continued`` when it carries on the run that was there."""

    run_id: str
    continued: bool = False


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``path`` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def results(work_dir: Path) -> list[Path]:
    """What a run leaves that a new run could lose: checkpoints, snapshot, HF exports, the best checkpoint."""
    from twinkle.trainer.store import list_checkpoints

    found = [path for _, path in list_checkpoints(work_dir / "checkpoints", with_snapshot=True)]
    found += [path for _, path in list_checkpoints(work_dir / HF_DIR)]
    found += [p for p in (work_dir / BEST_DIR, work_dir / BEST_FILE) if p.exists()]
    return found


def describe_run(work_dir: Path) -> str:
    """The earlier run, for the refusal message: id, start, command, newest checkpoint, best evaluation."""
    from twinkle.trainer.store import list_checkpoints

    record = read_json(work_dir / RUN_FILE) or {}
    parts = [f"run {record['run_id']}" if record.get("run_id") else "an earlier run (no run.json)"]
    if record.get("started"):
        parts.append(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record['started']))}")
    if record.get("command"):
        parts.append(f"by `{record['command']}`")
    checkpoints = list_checkpoints(work_dir / "checkpoints", with_snapshot=True)
    if checkpoints:
        parts.append(f"newest checkpoint {checkpoints[-1][1].name} (step {checkpoints[-1][0]})")
    best = read_json(work_dir / BEST_FILE)
    if best and best.get("eval_loss") is not None:
        parts.append(f"best eval loss {best['eval_loss']:.4f} at step {best.get('step')}")
    elif (work_dir / BEST_DIR).exists():
        parts.append("a best-checkpoint")
    return ", ".join(parts)


def begin(work_dir: Path, config: Any, log_dir: Path, continuing: bool) -> Run:
    """Decide this run's identity in ``work_dir`` (rank 0, under the work_dir lock); see the module docstring.

    ``continuing``: auto_resume, or a checkpoint of this work_dir to load.
    """
    earlier = read_json(work_dir / RUN_FILE)
    found = results(work_dir)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500]
    if found and continuing:
        run_id = (earlier or {}).get("run_id") or new_run_id()
        record = {**(earlier or {}), "run_id": run_id}
        record.setdefault("started", time.time())
        record.setdefault("history", []).append({"resumed": time.time(), "command": command})
        record["log_dir"] = str(log_dir)
        write_json(work_dir / RUN_FILE, record)
        return Run(run_id, continued=True)
    if found and not config.overwrite:
        raise WorkDirInUseError(
            f"work_dir {str(work_dir)!r} holds the results of {describe_run(work_dir)}. A new run there would rotate "
            "out and replace them. Continue that run with --auto-resume (auto_resume=True), or start a new one with "
            "another --work-dir, or with --overwrite (deletes its checkpoints, exports and best-checkpoint; keeps its "
            "logs).", option="work_dir")
    if found:
        logger.warning("overwrite: deleting the results of %s: %s", describe_run(work_dir),
                       ", ".join(p.name for p in found))
        for path in found:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_id = new_run_id()
    write_json(work_dir / RUN_FILE, {"run_id": run_id, "started": time.time(), "command": command,
                                     "log_dir": str(log_dir), "history": []})
    return Run(run_id)


def best_loss(work_dir: Path, run_id: str) -> float | None:
    """The eval loss ``best-checkpoint`` holds, if this run wrote it."""
    record = read_json(work_dir / BEST_FILE)
    if record and record.get("run_id") == run_id and (work_dir / BEST_DIR).is_dir():
        return float(record["eval_loss"])
    return None


def record_best(work_dir: Path, run_id: str, step: int, eval_loss: float) -> None:
    write_json(work_dir / BEST_FILE, {"run_id": run_id, "step": step, "eval_loss": eval_loss})
