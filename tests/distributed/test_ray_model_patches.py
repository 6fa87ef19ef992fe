"""In ray mode, what the reference user script does to ``model.model`` and ``kernelize(model)`` reach the actors."""

from __future__ import annotations

import pytest
from scenarios import tiny_config

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.kernel import KernelChoice, kernel_report, kernelize

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)


@pytest.fixture(scope="module")
def ray_model(monkeypatch_module):
    monkeypatch_module.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch_module.delenv("TWINKLE_TORCH_BASELINE", raising=False)  # kernelize must act
    twinkle.initialize(mode="ray", global_device_mesh=DeviceMesh.from_sizes(dp_size=1),
                       groups=[DeviceGroup("actor", 1, device_type="cpu")], seed=0, num_cpus=2, timeout_s=180)
    from twinkle.model import TransformersModel

    yield TransformersModel(config=tiny_config("qwen2"), mixed_precision="no", remote_group="actor")
    twinkle.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_no_split_modules_set_on_the_driver_reach_the_actor(ray_model) -> None:
    # the reference user script's lines, unchanged: read the live module, set the attribute
    discovered = {type(m).__name__ for m in ray_model.model.modules() if type(m).__name__.endswith("DecoderLayer")}
    assert discovered == {"Qwen2DecoderLayer"} and ray_model.model.config.model_type == "qwen2"
    ray_model.model._no_split_modules = [*discovered, "Marker"]
    assert ray_model.run_on_ranks(lambda m: m.model._no_split_modules) == ["Qwen2DecoderLayer", "Marker"]
    assert ray_model.model._no_split_modules == ["Qwen2DecoderLayer", "Marker"]  # read back live


def test_kernelize_of_the_proxy_patches_the_actor(ray_model) -> None:
    import torch.nn.functional as F

    def rms_norm(self, hidden_states):  # defined here: pickled by value to the actor
        out = F.rms_norm(hidden_states.float(), (hidden_states.shape[-1],), eps=self.variance_epsilon)
        return self.weight * out.to(hidden_states.dtype)

    assert ray_model.run_on_ranks(lambda m: kernel_report(m)) is None
    assert kernelize(ray_model, {"rms_norm": KernelChoice("test", "rms_norm", devices=("cpu",),
                                                          forward=rms_norm)}) is ray_model
    report = ray_model.run_on_ranks(lambda m: kernel_report(m))
    assert report is not None and report.changed
    assert report.ops["rms_norm"].replaced == 2 * tiny_config("qwen2").num_hidden_layers + 1  # 2 a layer + final
