"""Ray mode for real: a local cluster with 2 CPUs, one actor per rank, torch.distributed among them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
from rounding import chain_bound, within

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.actors.proxy import RemoteActorError

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from ray_toy import ToyTrainer  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="module")
def ray_runtime():
    runtime = twinkle.initialize(
        mode="ray", global_device_mesh=DeviceMesh.from_sizes(dp_size=2),
        groups=[DeviceGroup("actor", 2, device_type="cpu")], seed=0, num_cpus=2, timeout_s=120,
    )
    yield runtime
    twinkle.shutdown()


def batches(steps: int, rows: int = 8, dim: int = 4) -> list[dict]:
    gen = torch.Generator().manual_seed(42)
    return [{"x": torch.randn(rows, dim, generator=gen), "y": torch.randn(rows, 1, generator=gen)}
            for _ in range(steps)]


def reference_losses(data: list[dict], dim: int = 4, lr: float = 0.1) -> tuple[list[float], list[torch.Tensor]]:
    """The same training in this process on the whole batch: the independent reference."""
    torch.manual_seed(0)
    model = torch.nn.Linear(dim, 1)
    losses = []
    for batch in data:
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
                p.grad = None
    return losses, [p.detach() for p in model.parameters()]


def test_actors_train_like_one_process(ray_runtime):
    trainer = ToyTrainer(4, lr=0.1, remote_group="actor")
    assert repr(trainer) == "<remote ToyTrainer on group 'actor': 2 actors>"
    info = trainer.whoami()
    assert [i["rank"] for i in info] == [0, 1] and [i["data_rank"] for i in info] == [0, 1]
    assert len({i["pid"] for i in info} | {os.getpid()}) == 3  # two actor processes besides the driver
    data = batches(5)
    losses = []
    for batch in data:
        losses.append(trainer.forward_backward(batch))
        trainer.step()
    expected, weights = reference_losses(data)
    # the actors sum the one process's float32 terms in another order: per SGD step a 4-term dot, a mean over 8 rows
    # and a gradient sum over 8 (tests/rounding.py), step k carrying the earlier steps' rounding twice
    bound = (2 * (5 - 1) + 1) * chain_bound(4, 8, 8)
    assert losses == pytest.approx(expected, rel=bound, abs=0)
    for got, want in zip(trainer.weights(), weights):
        torch.testing.assert_close(got, want, **within(bound, want, terms=8))
    assert trainer.steps == 5  # a plain attribute is read from rank 0
    assert trainer.double([1, 2, 3, 4]) == [2, 4, 6, 8]
    with pytest.raises(ValueError, match="7 rows, which does not divide evenly over 2"):
        trainer.double(list(range(7)))


def test_a_failing_rank_is_named_and_nothing_hangs(ray_runtime):
    trainer = ToyTrainer(4, remote_group="actor")
    start = time.monotonic()
    with pytest.raises(RemoteActorError) as info:
        trainer.fail_on(1)
    assert time.monotonic() - start < 60
    assert info.value.rank == 1
    message = str(info.value)
    assert "ToyTrainer.fail_on failed on rank 1 of group 'actor'" in message
    assert "ValueError: rank 1 hit a bad batch" in message  # the remote traceback comes along
    with pytest.raises(twinkle.errors.TwinkleError, match="were stopped"):
        trainer.step()


def test_unknown_group_and_bad_group_mesh(ray_runtime):
    with pytest.raises(KeyError, match="No device group named 'critic'; declared groups: actor"):
        ToyTrainer(4, remote_group="critic")
    with pytest.raises(ValueError, match="has 3 ranks but global_device_mesh covers 2"):
        twinkle.initialize(mode="ray", global_device_mesh=DeviceMesh.from_sizes(dp_size=2),
                           groups=[DeviceGroup("g", 3)])
    assert twinkle.get_runtime() is ray_runtime  # the failed call left the running cluster alone
    assert ToyTrainer(2, remote_group="actor").whoami()[1]["rank"] == 1
