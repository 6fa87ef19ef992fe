"""Per-step timing, memory and torch.profiler traces written to ``work_dir/profile``."""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def memory_mb() -> float:
    """Peak accelerator memory (CUDA) or, on CPU, the process's peak resident set, in MiB."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class StepProfiler:
    """Wrap a step: wall time when ``profile_time``; a chrome trace at the ``profile_steps``."""

    def __init__(self, out_dir: Path, profile_steps: list[int], profile_time: bool, profile_memory: bool) -> None:
        self.out_dir = out_dir
        self.profile_steps = set(profile_steps)
        self.profile_time = profile_time
        self.profile_memory = profile_memory
        self.last: dict[str, float] = {}
        self.traces: list[Path] = []

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Profile optimizer step ``step`` (1-based: the step this block completes)."""
        started = time.perf_counter()
        with self._trace(step):
            yield
        self.last = {}
        if self.profile_time:
            self.last["step_time_s"] = time.perf_counter() - started
        self.last["memory_mb"] = memory_mb()

    @contextlib.contextmanager
    def _trace(self, step: int) -> Iterator[Any]:
        if step not in self.profile_steps:
            yield None
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities, record_shapes=True, profile_memory=self.profile_memory) as prof:
            yield prof
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"trace-step-{step}.json"
        prof.export_chrome_trace(str(path))
        self.traces.append(path)
