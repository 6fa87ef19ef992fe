"""TwinkleModel: the abstract API of the seed documents, and model names through twinkle.model."""

from __future__ import annotations

import inspect

import pytest

import twinkle.model
from twinkle.errors import MissingBackendError
from twinkle.model import TwinkleModel
from twinkle.registry import set_registry

# The methods of the TwinkleModel API (docs/architecture.md), resume_from_checkpoint included.
SEED_METHODS = {
    "forward", "forward_only", "calculate_loss", "backward", "forward_backward", "clip_grad_norm", "step",
    "zero_grad", "lr_step", "clip_grad_and_step", "set_loss", "set_optimizer", "set_lr_scheduler", "save", "load",
    "get_state_dict", "apply_patch", "add_metric", "calculate_metric", "add_adapter_to_model", "set_template",
    "set_processor", "get_train_configs", "resume_from_checkpoint",
}


def test_every_seed_method_is_abstract_documented_and_takes_adapter_name():
    assert TwinkleModel.__abstractmethods__ == SEED_METHODS
    for name in SEED_METHODS:
        method = getattr(TwinkleModel, name)
        assert method.__doc__ and len(method.__doc__.strip()) > 20, name
        assert "adapter_name" in inspect.signature(method).parameters, name


def test_seed_signatures():
    sig = inspect.signature
    assert list(sig(TwinkleModel.clip_grad_norm).parameters)[1:3] == ["max_grad_norm", "norm_type"]
    assert sig(TwinkleModel.clip_grad_and_step).parameters["max_grad_norm"].default == 1.0
    for name in ("forward", "forward_only", "forward_backward"):  # seed 001 calls model.forward(inputs)
        params = list(sig(getattr(TwinkleModel, name)).parameters.values())
        assert params[1].name == "inputs" and params[1].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        assert sig(getattr(TwinkleModel, name)).parameters["adapter_name"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(sig(TwinkleModel.save).parameters)[1:3] == ["name", "output_dir"]
    assert sig(TwinkleModel.resume_from_checkpoint).parameters["resume_only_model"].default is False
    assert list(sig(TwinkleModel.add_adapter_to_model).parameters)[1:3] == ["adapter_name", "config_or_dir"]


def test_incomplete_subclass_cannot_be_built():
    class Half(TwinkleModel):
        def forward(self, *, inputs, adapter_name=None, **kwargs):
            return inputs

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_backend_models_resolve_through_twinkle_model():
    from twinkle.model import MegatronModel, MultiLoraMegatronModel

    assert issubclass(MegatronModel, TwinkleModel) and issubclass(MultiLoraMegatronModel, MegatronModel)
    assert "MegatronModel" in dir(twinkle.model)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchModel'"):
        twinkle.model.NoSuchModel  # noqa: B018


def test_missing_backend_is_an_import_error_naming_the_package(make_registry):
    old = set_registry(make_registry())  # core only, as if no backend were installed
    try:
        with pytest.raises(ImportError, match="pip install twinkle-hf") as info:
            from twinkle.model import TransformersModel  # noqa: F401
        assert isinstance(info.value, MissingBackendError)
        with pytest.raises(ImportError, match="pip install twinkle-megatron"):
            from twinkle.model import MultiLoraMegatronModel  # noqa: F401
    finally:
        set_registry(old)
