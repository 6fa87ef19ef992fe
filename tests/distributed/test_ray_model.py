"""TransformersModel as Ray actors (2 CPU workers, DDP among them) driven by the unchanged loop."""

from __future__ import annotations

import sys
import time

import pytest
from dist_bounds import assert_trained_alike, run_bound
from scenarios import global_batches, reference, tiny_config

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.actors.proxy import RemoteActorError

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)


@pytest.fixture(scope="module")
def single_process() -> dict:
    """The single-process reference, computed before Ray mode makes every TransformersModel remote."""
    return reference("ddp_full")


@pytest.fixture(scope="module")
def ray_runtime(single_process):
    runtime = twinkle.initialize(
        mode="ray", global_device_mesh=DeviceMesh.from_sizes(dp_size=2),
        groups=[DeviceGroup("actor", 2, device_type="cpu")], seed=0, num_cpus=2, timeout_s=180,
    )
    yield runtime
    twinkle.shutdown()


def _model():
    from twinkle.model import TransformersModel

    return TransformersModel(config=tiny_config("qwen2"), mixed_precision="no", remote_group="actor")


def test_ray_training_matches_torchrun_and_one_process(ray_runtime, single_process) -> None:
    model = _model()
    model.set_optimizer("AdamW", lr=1e-2, eps=1.0)  # as the reference's (scripts/scenarios.py build())
    group = model.optimizer_group["default"]  # a live view: every read asks rank 0, never a stale copy
    assert list(model.optimizer_group) == ["default"] and len(model.optimizer_group) == 1
    with pytest.raises(KeyError):
        model.optimizer_group["no-such-group"]
    losses, metrics = [], []
    for step, batch in enumerate(global_batches(), 1):  # whole global batches: the proxy slices them by data rank
        losses.append(model.forward_backward(inputs=batch))
        model.clip_grad_and_step()
        metrics.append(model.calculate_metric(is_training=True))
        assert (group.cur_step, group.micro_step, group.skipped_steps) == (step, 0, 0)
    want = single_process
    bound = run_bound(len(losses))  # the derived bound of dist_bounds.py: the actors sum in another order
    assert [m["loss"] for m in metrics] == pytest.approx([m["loss"] for m in want["metrics"]], rel=bound, abs=0)
    state = model.get_state_dict()
    assert_trained_alike({"losses": losses, "params": {k: state[k] for k in want["params"]}}, want, len(losses))
    assert "strategy: accelerate" in model.get_train_configs()


def test_a_rank_that_raises_is_named_in_the_driver(ray_runtime) -> None:
    model = _model()
    model.set_optimizer("AdamW", lr=1e-2, eps=1.0)  # as the reference's (scripts/scenarios.py build())
    good = {"input_ids": [5, 6, 7, 8], "labels": [5, 6, 7, 8]}
    rows = [good, {"text": "no input ids"}, good, {"text": "no input ids"}]  # rank 1 gets rows 1 and 3
    start = time.monotonic()
    with pytest.raises(RemoteActorError) as info:
        model.forward_backward(inputs=rows)
    assert time.monotonic() - start < 120  # rank 0 waited in a collective: the proxy stopped it, no hang
    assert info.value.rank == 1
    assert "TransformersModel.forward_backward failed on rank 1 of group 'actor'" in str(info.value)
    assert "have no 'input_ids'" in str(info.value)


def test_remote_group_naming_no_group(ray_runtime) -> None:
    from twinkle.model import TransformersModel

    with pytest.raises(KeyError, match="No device group named 'critic'; declared groups: actor"):
        TransformersModel(config=tiny_config("qwen2"), remote_group="critic")


def test_ray_requested_but_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"mode='ray' needs Ray: pip install 'twinkle-core\[ray\]'"):
        twinkle.initialize(mode="ray", groups=[DeviceGroup("actor", 2)])
