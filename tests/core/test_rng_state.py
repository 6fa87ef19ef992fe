"""RNG state across machines: each rank saves its current device's generator and resumes on any device count.

``torch.cuda`` is replaced by a fake with N devices, each holding a distinct generator state, that
behaves like torch's: an ordinal beyond the visible devices is an error.
"""

from __future__ import annotations

import logging

import pytest
import torch

from twinkle.checkpoint import capture_rng_state, restore_rng_state, safe_torch_load, torch_save


class FakeCuda:
    """``torch.cuda`` as far as RNG state goes: ``count`` devices, ``current`` selected."""

    def __init__(self, count: int, current: int) -> None:
        self.count, self.current = count, current
        self.states = [torch.full((8,), 10 * count + i, dtype=torch.uint8) for i in range(count)]

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def _index(self, device: object) -> int:
        index = device if isinstance(device, int) else torch.device(device).index
        index = self.current if index is None else index
        if not 0 <= index < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} ({self.count} devices)")
        return index

    def get_rng_state(self, device: object = "cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state: torch.Tensor, device: object = "cuda") -> None:
        self.states[self._index(device)] = state.clone()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        for i, state in enumerate(states):
            self.set_rng_state(state, i)


@pytest.fixture
def rng_log(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("twinkle")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


def _save_on(monkeypatch: pytest.MonkeyPatch, tmp_path, count: int, current: int) -> tuple[FakeCuda, torch.Tensor]:
    machine = FakeCuda(count, current)
    monkeypatch.setattr(torch, "cuda", machine)
    torch_save(capture_rng_state(), tmp_path / "rng.pt")
    return machine, machine.states[current].clone()


def test_resume_on_fewer_gpus_restores_this_ranks_generator_onto_its_device(monkeypatch, tmp_path, rng_log):
    """Saved by rank 3 of an 8-GPU machine, resumed as rank 1 of a 2-GPU machine."""
    _, saved = _save_on(monkeypatch, tmp_path, count=8, current=3)
    state = safe_torch_load(tmp_path / "rng.pt")
    target = FakeCuda(2, current=1)
    untouched = target.states[0].clone()
    monkeypatch.setattr(torch, "cuda", target)
    restore_rng_state(state)
    assert torch.equal(target.states[1], saved)  # this rank's stream continues on its current device
    assert torch.equal(target.states[0], untouched)
    assert "saved with 8 visible cuda device(s)" in rng_log.text and "this process sees 2" in rng_log.text
    assert torch.equal(state["cuda"], saved) and state["cuda_layout"] == {"device": 3, "device_count": 8}


def test_same_layout_restores_silently(monkeypatch, tmp_path, rng_log):
    _, saved = _save_on(monkeypatch, tmp_path, count=4, current=2)
    target = FakeCuda(4, current=2)
    monkeypatch.setattr(torch, "cuda", target)
    restore_rng_state(safe_torch_load(tmp_path / "rng.pt"))
    assert torch.equal(target.states[2], saved)
    assert "RNG state" not in rng_log.text


def test_a_checkpoint_with_every_devices_state_still_resumes_on_another_device_count(monkeypatch, rng_log):
    """Checkpoints written before the per-rank format hold one state per visible device."""
    old = FakeCuda(8, current=0)
    monkeypatch.setattr(torch, "cuda", old)
    state = {**capture_rng_state(), "cuda": old.get_rng_state_all()}
    state.pop("cuda_layout")
    target = FakeCuda(2, current=1)
    monkeypatch.setattr(torch, "cuda", target)
    restore_rng_state(state)
    assert torch.equal(target.states[1], old.states[1])
    assert "saved with 8 visible cuda device(s)" in rng_log.text
