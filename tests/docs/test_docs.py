"""README.md and docs/*.md as a newcomer follows them (issue 26, item 3).

Every command block the docs mark ``<!-- docs-test: run NAME -->`` runs as written, in document order
(README first), in a copy of the repository and in the environment ``./dev`` made for the tests:
``./dev`` lines run there (``DEV_ENV_BIN``), and ``twinkle`` / ``python`` are that environment's, as
inside ``./dev hatch shell``. One shell session per document: what a block exports, the next block
sees. Every number the docs quote with ``<!-- docs-test: NAME.KEY TOL -->`` is compared with the one
measured from that run's output (:data:`MEASURES`), within the tolerance the marker states. The
marker grammar is in ``docs_markers.py``; every shell block must be marked run or skip (with why).

No network: ``HF_HUB_OFFLINE=1``; blocks that need it are marked skip. Seconds are CPU seconds of the
command (its processes' user + system time) with ``OMP_NUM_THREADS=1``, as README suggests for a busy
machine: wall time depends on the load, and two torch threads on a loaded 2-core machine spin (the
GRPO cookbook took 85 CPU seconds with two threads at load 25, 12 with one; same rewards).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from docs_markers import REPO, SHELL, Block, Quoted, everything

BLOCKS, QUOTED = everything()
RUNS = [b for b in BLOCKS if b.action == "run"]


@dataclass
class Result:
    block: Block
    returncode: int
    stdout: str
    stderr: str
    cpu_seconds: float
    wall_seconds: float
    cwd: Path | None = None  # where it ran: the copy of the repository

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr

    def find(self, pattern: str) -> re.Match:
        match = re.search(pattern, self.output, re.M)
        assert match, f"{self.block.where} ({self.block.name}): no line matching {pattern!r} in its output:\n" + \
            self.output[-3000:]
        return match


# --------------------------------------------------------------------------------------------- measures
def _train(r: Result) -> dict[str, float]:
    done = r.find(r"^twinkle train: finished at step (\d+)/(\d+) in [\d.]+s; final loss ([\d.]+); checkpoint: (\S+)$")
    best = r.find(r"^twinkle train: best eval loss ([\d.]+): \S+best-checkpoint$")
    assert done.group(1) == done.group(2)
    return {"steps": float(done.group(1)), "final_loss": float(done.group(3)), "best_eval_loss": float(best.group(1)),
            "cpu_seconds": r.cpu_seconds}


def _packed(r: Result) -> dict[str, float]:
    report = r.find(r"packed (\d+) rows into (\d+) packs of <= (\d+) tokens \(fill ratio ([\d.]+)\)")
    return {**_train(r), "rows": float(report.group(1)), "packs": float(report.group(2)),
            "fill_ratio": float(report.group(4))}


def _load(r: Result) -> dict[str, float]:
    chat = r.find(r"^user\nwho are you\?\nassistant\n(.+)$")
    return {"answer_characters": float(len(chat.group(1)))}


def _grpo(r: Result) -> dict[str, float]:
    curve = [float(x) for x in r.find(r"^grpo: mean reward per step: ([\d. ]+)$").group(1).split()]
    cross = next((i + 1 for i, x in enumerate(curve) if x >= 0.5), float("inf"))
    return {"first_reward": curve[0], "cross_step": float(cross), "last_reward": curve[-1], "steps": len(curve),
            "cpu_seconds": r.cpu_seconds}


def _dpo(r: Result) -> dict[str, float]:
    m = r.find(r"held-out margin ([-\d.]+) -> ([-\d.]+), accuracy ([\d.]+) -> ([\d.]+) \((\d+) steps")
    return {"margin_before": float(m.group(1)), "margin_after": float(m.group(2)),
            "accuracy_before": float(m.group(3)), "accuracy_after": float(m.group(4)), "steps": float(m.group(5)),
            "cpu_seconds": r.cpu_seconds}


def _vl(r: Result) -> dict[str, float]:
    m = r.find(r"^loss ([\d.]+) -> ([\d.]+) in (\d+) steps \([\d.]+ s\); adapter: (\S+)$")
    assert (Path(m.group(4)) / "adapter_model.safetensors").is_file()
    return {"first_loss": float(m.group(1)), "last_loss": float(m.group(2)), "steps": float(m.group(3)),
            "cpu_seconds": r.cpu_seconds}


def _client(r: Result) -> dict[str, float]:
    losses = [float(x) for x in re.findall(r"^step \d+: loss ([\d.]+)$", r.stdout, re.M)]
    assert len(losses) == 10, r.output[-3000:]
    saved = r.find(r"^saved: (tinker://\S+/weights/step-10)$")
    sampled = re.findall(r"^sampled: '.*'$|^sampled: \".*\"$", r.stdout, re.M)
    assert saved and len(sampled) == 2, r.output[-3000:]
    return {"first_loss": losses[0], "last_loss": losses[-1]}


def _plot(r: Result) -> dict[str, float]:
    png = r.cwd / r.find(r"^\s*curves\s+(\S+\.png)$").group(1)  # relative to where it ran, or absolute
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    return {}


def _ok(r: Result) -> dict[str, float]:
    return {}


#: run name -> what it measures from the run's output (and the output's shape it asserts on the way)
MEASURES: dict[str, Callable[[Result], dict[str, float]]] = {
    "train": _train, "packed": _packed, "plot": _plot, "load": _load, "grpo": _grpo, "dpo": _dpo, "vl": _vl,
    "client": _client,
    "server-key": _ok, "server": _ok, "train-help": _ok,
}


# ---------------------------------------------------------------------------------------------- session
def _clone(target: Path) -> Path:
    """A copy of the repository's tracked files (what a fresh clone holds); everything but outputs without git."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        names = [n for n in files.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
    if not names:
        shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(".git", ".hatch", ".tools", "output", "*.pyc"))
        return target
    for name in names:
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _base_env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWINKLE_", "PYTEST_"))}
    env.update({"DEV_ENV_BIN": bin_dir, "PATH": bin_dir + os.pathsep + env.get("PATH", ""), "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    return env


def _read_env(path: Path) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in path.read_bytes().decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if not k.startswith("BASH_FUNC_")}


class Session:
    """Runs the marked blocks in order, one shell environment per document; background blocks live to the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.envs: dict[str, dict[str, str]] = {}
        self.ports: dict[str, dict[str, str]] = {}  # doc -> {documented port: the free port used}
        self.background: list[subprocess.Popen] = []

    def script(self, block: Block) -> str:
        text = block.commands()
        ports = self.ports.setdefault(block.doc, {})
        if "port" in block.options and block.options["port"] not in ports:  # the document's first use picks it
            ports[block.options["port"]] = str(_free_port())
        for documented, used in ports.items():
            text = re.sub(rf"\b{documented}\b", used, text)
        return text

    def run(self, block: Block) -> Result:
        env = dict(self.envs.setdefault(block.doc, _base_env()))
        text = self.script(block)
        timeout = float(block.options.get("timeout", 600))
        env_out = self.root / f".docs-test-env-{block.name}"
        if block.lang == "python":
            path = self.root / f".docs-test-{block.name}.py"
            path.write_text(text)
            argv = [sys.executable, str(path)]
        else:
            suffix = "" if "background" in block.options else f'\nenv -0 > "{env_out}"\n'
            argv = ["bash", "-c", "set -e\n" + text + suffix]
        if "background" in block.options:
            return self._start(block, argv, env, timeout)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout,
                                  start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return Result(block, -1, out, err + f"\n(timed out after {timeout:.0f} s)", 0.0, timeout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if proc.returncode == 0 and env_out.is_file():
            self.envs[block.doc] = _read_env(env_out)
        return Result(block, proc.returncode, proc.stdout, proc.stderr, cpu, time.monotonic() - start, self.root)

    def _start(self, block: Block, argv: list[str], env: dict[str, str], timeout: float) -> Result:
        log = self.root / f".docs-test-{block.name}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(argv, cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.background.append(proc)
        ready = self.root / block.options["ready"] if "ready" in block.options else None
        deadline = time.monotonic() + timeout
        while ready is not None and not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        ok = proc.poll() is None and (ready is None or ready.exists())
        return Result(block, 0 if ok else (proc.returncode or -1), log.read_text(), "", 0.0, 0.0)

    def close(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    runner = Session(_clone(tmp_path_factory.mktemp("clone")))
    results: dict[str, Result] = {}
    try:
        for block in RUNS:
            results[block.name] = runner.run(block)
    finally:
        runner.close()
    return results


# ------------------------------------------------------------------------------------------------ tests
def test_every_shell_block_is_marked_run_or_skip_with_a_reason():
    unmarked = [b.where for b in BLOCKS if b.lang in SHELL and b.action is None]
    assert not unmarked, f"shell blocks without a docs-test marker (run NAME, or skip REASON): {unmarked}"
    assert all(b.reason for b in BLOCKS if b.action == "skip"), [b.where for b in BLOCKS if b.action == "skip"]


def test_markers_are_consistent():
    names = [b.name for b in RUNS]
    assert len(names) == len(set(names)), names
    assert set(names) <= set(MEASURES), set(names) - set(MEASURES)
    assert {q.run for q in QUOTED} <= set(names), {q.run for q in QUOTED} - set(names)
    assert all(b.lang in (*SHELL, "python") for b in RUNS), [b.where for b in RUNS]


@pytest.mark.slow
@pytest.mark.parametrize("name", [b.name for b in RUNS])
def test_the_documented_command_runs(session: dict[str, Result], name: str) -> None:
    result = session[name]
    assert result.returncode == 0, (f"{result.block.where}: `{result.block.commands().strip()}` exited "
                                    f"{result.returncode}:\n{result.output[-4000:]}")
    MEASURES[name](result)  # its output has the shape the docs describe


@pytest.mark.slow
@pytest.mark.parametrize("quoted", QUOTED, ids=lambda q: q.id)
def test_the_quoted_number_is_what_a_run_measures(session: dict[str, Result], quoted: Quoted) -> None:
    result = session[quoted.run]
    assert result.returncode == 0, f"{quoted.run} failed; see test_the_documented_command_runs"
    measured = MEASURES[quoted.run](result)[quoted.key]
    shown = f"{quoted.low}–{quoted.high}" if quoted.tolerance == "range" else f"{quoted.low} ({quoted.tolerance})"
    assert quoted.accepts(measured), f"{quoted.doc}:{quoted.line} quotes {quoted.id} = {shown}; measured {measured}"
