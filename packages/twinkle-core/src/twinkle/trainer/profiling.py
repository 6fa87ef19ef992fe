"""Per-step timing and memory, and at the ``profile_step`` steps (under ``log_dir/profile``): a torch.profiler
chrome trace (``profile_time``) and a memory snapshot (``profile_memory``: on CUDA the allocator's
``memory-snapshot-step-N.pickle`` for pytorch.org/memory_viz, elsewhere the profiler's memory timeline
``memory-timeline-step-N.json``: per sample time and bytes by category)."""

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
    """Wrap a step: its wall time and peak memory; at the ``profile_steps`` a trace and/or a memory snapshot."""

    def __init__(self, out_dir: Path, profile_steps: list[int], profile_time: bool, profile_memory: bool) -> None:
        self.out_dir = out_dir
        self.profile_steps = set(profile_steps)
        self.profile_time = profile_time
        self.profile_memory = profile_memory
        self.last: dict[str, float] = {}
        self.traces: list[Path] = []
        self.snapshots: list[Path] = []

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Profile optimizer step ``step`` (1-based: the step this block completes)."""
        started = time.perf_counter()
        with self._profile(step):
            yield
        self.last = {"step_time_s": time.perf_counter() - started, "memory_mb": memory_mb()}

    @contextlib.contextmanager
    def _profile(self, step: int) -> Iterator[Any]:
        if step not in self.profile_steps or not (self.profile_time or self.profile_memory):
            yield None
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        memory = self.profile_memory
        if memory and cuda:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        with profile(activities=activities, record_shapes=True, profile_memory=memory,
                     with_stack=memory and not cuda) as prof:
            yield prof
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.profile_time:
            path = self.out_dir / f"trace-step-{step}.json"
            prof.export_chrome_trace(str(path))
            self.traces.append(path)
        if memory:
            self.snapshots.append(self._memory(prof, step, cuda))

    def _memory(self, prof: Any, step: int, cuda: bool) -> Path:
        import torch

        if cuda:
            path = self.out_dir / f"memory-snapshot-step-{step}.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            return path
        import warnings

        path = self.out_dir / f"memory-timeline-step-{step}.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated for CUDA, the only CPU memory timeline
            prof.export_memory_timeline(str(path), device="cpu")
        return path
