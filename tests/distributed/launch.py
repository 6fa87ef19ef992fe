"""Running a torchrun job from a test, bounded by a timeout, with its output kept for the report."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@dataclass
class JobResult:
    returncode: int
    output: str
    out_dir: Path

    def load(self, name: str, rank: int) -> dict:
        error = self.out_dir / f"{name}.rank{rank}.error"
        if error.exists():
            raise AssertionError(f"{name} failed on rank {rank}:\n{error.read_text()}")
        path = self.out_dir / f"{name}.rank{rank}.pt"
        if not path.exists():
            raise AssertionError(f"{name} left no result on rank {rank}; job output:\n{self.output[-4000:]}")
        return torch.load(path, weights_only=False)


def torchrun(script: str, args: list[str], out_dir: Path, nproc: int = 2,
             timeout: float = 300, env: dict[str, str] | None = None) -> JobResult:
    """``torchrun --standalone --nproc_per_node=nproc script out_dir *args``; a hang becomes a TimeoutExpired failure.

    ``--standalone``: torchrun binds a free port itself, so parallel runs never collide (a fixed port did).
    """
    command = [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", str(SCRIPTS / script),
               str(out_dir), *args]
    proc = subprocess.run(command, env=_job_env(out_dir, env), capture_output=True, text=True, timeout=timeout)
    return JobResult(proc.returncode, proc.stdout + proc.stderr, out_dir)


def free_port() -> int:
    """A port free on the loopback interface now (the OS's choice; bound again by the caller's process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_nodes(script: str, args: list[str], out_dir: Path, nnodes: int = 2, nproc: int = 2,
                   timeout: float = 300, env: dict[str, str] | None = None) -> JobResult:
    """A multi-node launch simulated on this machine: ``nnodes`` torchrun launches, one per node rank
    (``--nnodes N --node_rank i``), meeting at a c10d rendezvous on 127.0.0.1 (the first to bind hosts its
    store, the others join it), as launches on N machines pointed at one head would.

    Every launch runs in a session of its own and is killed with its ranks if the job outlives ``timeout``.
    """
    endpoint = f"127.0.0.1:{free_port()}"
    launches = []
    for node_rank in range(nnodes):
        command = [*TORCHRUN, f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", f"--node_rank={node_rank}",
                   "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", "--rdzv_id=twinkle-test",
                   "--local_addr=127.0.0.1", str(SCRIPTS / script), str(out_dir), *args]
        launches.append(subprocess.Popen(command, env=_job_env(out_dir, env), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outputs, deadline = [], time.monotonic() + timeout
    try:
        for node_rank, launch in enumerate(launches):
            out, _ = launch.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(f"--- node {node_rank} ---\n{out}")
    finally:
        for launch in launches:
            if launch.poll() is None:
                os.killpg(launch.pid, signal.SIGKILL)
                launch.wait()
    code = next((launch.returncode for launch in launches if launch.returncode), 0)
    return JobResult(code, "\n".join(outputs), out_dir)


def _job_env(out_dir: Path, env: dict[str, str] | None) -> dict[str, str]:
    env = {**os.environ, "DIST_TEST_OUT": str(out_dir), "TWINKLE_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("WORLD_SIZE", None)
    return env
