"""LoRA slots as a cache: any number of client models on ``server.max_tenants`` slots.

A model (a training tenant, or the adapter a sampling client reads) holds a slot while it is used;
when a slot is needed and none is free, the least recently used idle one is paged out through the
model's public API -- ``save(..., save_optimizer=True)`` (adapter, Adam moments, step count, RNG)
then ``release_lora`` -- and paged back on its next request with ``load_lora`` + the optimizer +
``resume_from_checkpoint``, which continues bit-exactly (a checkpoint resumes bitwise). Paged
models go to host memory first (a tmpfs directory, up to ``server.page_memory_mb``), the least
recently used of them on to the work dir.

A model whose gradients are not applied yet (forward_backward without optim_step) is not paged out
while it is active: saving does not keep gradients. After ``server.grad_hold_s`` idle it may be,
its gradients dropped; its next optim_step then fails saying so and changes nothing. A sampling
adapter is paged out by releasing its slot (its files are already saved). The slots a request uses
are pinned while it runs. With every slot pinned, :class:`SlotsBusy` tells the scheduler to try
the request again a little later.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("twinkle_server")


class SlotsBusy(RuntimeError):
    """Every slot is in use by running work or by gradients waiting for their optim_step; retry soon."""


@dataclass
class Entry:
    """A model the pager knows: how it gets a slot back and whether it holds unapplied gradients."""

    kind: str  # "train" (state saved on page-out) | "sample" (read-only: its slot is simply released)
    load: Callable[[], None] | None = None  # sample entries: acquire its slot with its weights
    dirty: bool = False
    last_used: float = 0.0
    pinned: int = 0


class Pager:
    """Which models hold the model's slots; pages the others out and in (see the module docstring)."""

    def __init__(self, model: Any, capacity: int, work_dir: Path, *, memory_bytes: int, grad_hold_s: float,
                 reset_optimizer: Callable[[str], None]) -> None:
        self.model = model
        self.capacity = capacity
        self.grad_hold_s = grad_hold_s
        self.reset_optimizer = reset_optimizer
        self.memory_bytes = memory_bytes
        self.disk_dir = work_dir / "paged"
        self.memory_dir = _memory_dir(work_dir) if memory_bytes > 0 else None
        if self.memory_dir is not None:
            _remove_orphans(self.memory_dir.parent)
        for root in (self.disk_dir, self.memory_dir):
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)  # pages of an earlier run describe nothing now
                root.mkdir(parents=True, exist_ok=True)
        if self.memory_dir is not None:
            (self.memory_dir / "owner.pid").write_text(str(os.getpid()))
        self.resident: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self.paged: dict[str, tuple[Entry, Path | None]] = {}  # a sample entry has no page directory
        self.in_memory: OrderedDict[str, int] = OrderedDict()  # paged names in the memory tier -> bytes
        self.dropped_grads: set[str] = set()
        self.page_outs = 0
        self.page_ins = 0

    # ------------------------------------------------------------------ entries
    def known(self, name: str) -> bool:
        return name in self.resident or name in self.paged

    def admit(self, name: str, kind: str, acquire: Callable[[], None]) -> None:
        """A new model: room is made, ``acquire()`` gives it a slot, it becomes the most recently used."""
        self._make_room(1, exclude=set())
        acquire()
        self.resident[name] = Entry(kind, load=acquire if kind == "sample" else None, last_used=time.monotonic())

    def drop(self, name: str) -> None:
        """Forget a model: its slot released (when it holds one) and its page deleted."""
        if self.resident.pop(name, None) is not None:
            self.model.release_lora(name)
        paged = self.paged.pop(name, None)
        if paged is not None and paged[1] is not None:
            self.in_memory.pop(name, None)
            shutil.rmtree(paged[1], ignore_errors=True)
        self.dropped_grads.discard(name)

    def set_dirty(self, name: str, dirty: bool) -> None:
        entry = self.resident.get(name)
        if entry is not None:
            entry.dirty = dirty
        if dirty:
            self.dropped_grads.discard(name)

    def take_dropped(self, name: str) -> bool:
        """Whether ``name``'s gradients were dropped by a page-out since its last optim_step (and forget it)."""
        if name in self.dropped_grads:
            self.dropped_grads.discard(name)
            return True
        return False

    @contextmanager
    def use(self, names: list[str]) -> Iterator[None]:
        """``names`` hold slots (paged in as needed) and stay pinned for the block."""
        wanted = list(dict.fromkeys(names))
        if len(wanted) > self.capacity:
            raise ValueError(f"{len(wanted)} models at once exceed the {self.capacity} LoRA slots.")
        missing = [n for n in wanted if n not in self.resident]
        unknown = [n for n in missing if n not in self.paged]
        if unknown:
            raise KeyError(f"no model {unknown[0]!r} is loaded")
        for name in wanted:
            if name in self.resident:
                self.resident[name].pinned += 1
        try:
            self._make_room(len(missing), exclude=set(wanted))
            for name in missing:
                self._page_in(name)
                self.resident[name].pinned += 1
            now = time.monotonic()
            for name in wanted:
                self.resident[name].last_used = now
                self.resident.move_to_end(name)
            yield
        finally:
            for name in wanted:
                entry = self.resident.get(name)
                if entry is not None and entry.pinned:
                    entry.pinned -= 1

    # ------------------------------------------------------------------ paging
    def _make_room(self, needed: int, exclude: set[str]) -> None:
        while self.capacity - len(self.resident) < needed:
            victim = self._victim(exclude)
            if victim is None:
                raise SlotsBusy(f"all {self.capacity} LoRA slots (server.max_tenants) are in use by running requests "
                                "or by models between forward_backward and optim_step")
            self._page_out(victim)

    def _victim(self, exclude: set[str]) -> str | None:
        """The least recently used slot that may be paged out now (clean ones first)."""
        now = time.monotonic()
        candidates = [(n, e) for n, e in self.resident.items() if n not in exclude and not e.pinned]
        for name, entry in candidates:
            if not entry.dirty:
                return name
        for name, entry in candidates:
            if now - entry.last_used >= self.grad_hold_s:
                return name
        return None

    def _page_out(self, name: str) -> None:
        entry = self.resident.pop(name)
        if entry.kind == "train":
            directory = self._page_dir(name)
            self.model.save(directory.name, str(directory.parent), adapter_name=name, save_optimizer=True,
                            overwrite=True, allow_non_finite=True)
            if entry.dirty:
                logger.info("model %s was idle %.0fs between forward_backward and optim_step; paged out, its "
                            "gradients dropped", name, time.monotonic() - entry.last_used)
                self.dropped_grads.add(name)
                entry.dirty = False
            self.paged[name] = (entry, directory)
            if self.memory_dir is not None and directory.parent == self.memory_dir:
                self.in_memory[name] = _size(directory)
                self._spill()
        else:
            self.paged[name] = (entry, None)
        self.model.release_lora(name)
        self.page_outs += 1

    def _page_in(self, name: str) -> None:
        entry, directory = self.paged.pop(name)
        self.in_memory.pop(name, None)
        if entry.kind == "train":
            self.model.load_lora(name, str(directory))
            try:
                self.reset_optimizer(name)
                self.model.resume_from_checkpoint(str(directory), adapter_name=name)
            except BaseException:
                self.model.release_lora(name)
                self.paged[name] = (entry, directory)
                raise
            shutil.rmtree(directory, ignore_errors=True)
        else:
            entry.load()
        self.resident[name] = entry
        self.page_ins += 1

    def _page_dir(self, name: str) -> Path:
        """Memory while the budget and the tmpfs have room for a page (sized like the last ones), else disk."""
        if self.memory_dir is not None and sum(self.in_memory.values()) < self.memory_bytes:
            typical = max(self.in_memory.values(), default=64 << 20)
            stats = os.statvfs(self.memory_dir)
            if stats.f_bavail * stats.f_frsize > 2 * typical:
                return self.memory_dir / name
        return self.disk_dir / name

    def _spill(self) -> None:
        """Move the least recently paged models from memory to disk while memory is over its budget."""
        while self.in_memory and sum(self.in_memory.values()) > self.memory_bytes:
            name, _ = self.in_memory.popitem(last=False)
            entry, directory = self.paged[name]
            target = self.disk_dir / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(directory), str(target))
            self.paged[name] = (entry, target)

    def close(self) -> None:
        """Free the host memory the pages hold (at shutdown; the models' state is gone with the process)."""
        if self.memory_dir is not None:
            shutil.rmtree(self.memory_dir, ignore_errors=True)

    def stats(self) -> dict[str, int]:
        return {"resident": len(self.resident), "paged": len(self.paged), "paged_in_memory": len(self.in_memory),
                "page_out": self.page_outs, "page_in": self.page_ins}


def _memory_dir(work_dir: Path) -> Path | None:
    """A directory in host memory (``/dev/shm``) for this work dir, or None where there is none."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return None
    digest = hashlib.sha256(str(work_dir).encode()).hexdigest()[:16]
    return shm / f"twinkle-server-{digest}"


def _remove_orphans(shm: Path) -> None:
    """Memory pages left by servers that were killed (their process is gone): host memory, freed."""
    for directory in shm.glob("twinkle-server-*"):
        try:
            pid = int((directory / "owner.pid").read_text())
            os.kill(pid, 0)
            continue  # its server runs
        except PermissionError:
            continue  # another user's server runs
        except (OSError, ValueError):
            shutil.rmtree(directory, ignore_errors=True)


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
