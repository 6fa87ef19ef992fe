"""The served model is built with the Trainer's model options (strategy, gradient checkpointing)."""

from __future__ import annotations

import pytest

from twinkle.config import ConfigError


def _config(**model):
    from twinkle_server.config import ServedModelConfig, ServerConfig, ServiceConfig

    return ServerConfig(model=ServedModelConfig(mixed_precision="no", **model),
                        server=ServiceConfig(max_tenants=2, max_rank=4))


def test_the_model_options_of_the_trainer_apply_to_the_served_model():
    from twinkle.hub import resolve_path
    from twinkle_server.server import build_model
    from twinkle_server.targets import layer_families

    config = _config(gradient_checkpointing=True, strategy="native_fsdp")
    targets = layer_families(resolve_path(config.model.model_id))
    model = build_model(config, targets)
    assert model.strategy == "native_fsdp" and model.backend.hf_model().is_gradient_checkpointing
    assert not build_model(_config(), targets).backend.hf_model().is_gradient_checkpointing
    with pytest.raises(ConfigError, match="model.strategy: MultiLoraMegatronModel takes no strategy"):
        build_model(_config(type="MultiLoraMegatronModel", strategy="native_fsdp"), targets)


def test_only_a_multi_tenant_model_is_served():
    """The service depends on twinkle.model.MultiTenantModel only: a model class without tenants is refused
    before anything is built, naming the option and the classes that implement it."""
    from twinkle.hub import resolve_path
    from twinkle.model import MultiTenantModel, TransformersModel
    from twinkle.registry import resolve
    from twinkle_server.server import build_model
    from twinkle_server.targets import layer_families

    config = _config(type="TransformersModel")
    with pytest.raises(ConfigError, match="model.type: TransformersModel serves one adapter; twinkle serve needs "
                                          "a multi-tenant model"):
        build_model(config, layer_families(resolve_path(config.model.model_id)))
    assert not issubclass(TransformersModel, MultiTenantModel)
    assert all(issubclass(resolve("model", name), MultiTenantModel)
               for name in ("MultiLoraTransformersModel", "MultiLoraMegatronModel"))
