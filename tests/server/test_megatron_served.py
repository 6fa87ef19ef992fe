"""`twinkle serve --model.type MultiLoraMegatronModel`: the service depends on the MultiTenantModel protocol only,
so a Megatron base model serves tenants (CPU, TP=1) through the real tinker client, with the numbers of the
component API on the same model.
"""

from __future__ import annotations

import pytest
from rounding import U, tiny_qwen
from server_proc import ALL_LAYERS, BASE_MODEL, MODEL_ID, make_keys, start_server
from server_testing import adapter_tensors, rows, sft_datums
from tinker import types

pytest.importorskip("megatron.core")

STEPS = 3
#: eps = 1: the update is Lipschitz in the gradient (tests/server/test_ray_mode.py derives it); with 1e-8 the
#: server's and the script's reduction orders flip lr * sign(g) of near-zero gradients, bounded on no CPU
ADAM = {"learning_rate": 2e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1.0, "weight_decay": 0.01}
#: the served run against the script (another process, another summation order): STEPS steps of 4 rows of at
#: most 20 tokens, step k carrying the earlier steps' rounding twice (tests/rounding.py, as test_sft)
BOUND = (2 * (STEPS - 1) + 1) * tiny_qwen(seq=20, rows=4).step_bound()


@pytest.fixture(scope="module")
def megatron_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("megatron-server")
    keys_file = root / "keys.txt"
    running = start_server(root / "work", keys_file, make_keys(keys_file),
                           ["--model.type", "MultiLoraMegatronModel", "--server.max-tenants", "2",
                            "--server.max-rank", "8", "--server.max-length", "128", "--server.seed", "0"])
    yield running
    running.stop()


def test_a_megatron_base_model_trains_tenants_through_the_client(megatron_server):
    client = megatron_server.service_client("alice")
    try:
        training = client.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=11).result()
        datums = sft_datums(training.get_tokenizer())
        losses, norms = [], []
        for _ in range(STEPS):
            fwd = training.forward_backward(datums, "cross_entropy")
            opt = training.optim_step(types.AdamParams(**ADAM))
            losses.append(fwd.result().metrics["loss:sum"])
            norms.append(opt.result().metrics["grad_norm:mean"])
        saved = training.save_weights_for_sampler("final").result().path
    finally:
        client.close("success").result()
    assert losses[-1] < losses[0]

    # the same run written against the component API on the same model class
    from peft import LoraConfig

    from twinkle.model import MultiLoraMegatronModel
    from twinkle.runtime import seed_everything

    seed_everything(0)
    model = MultiLoraMegatronModel(model_id=MODEL_ID, mixed_precision="no", max_loras=2, max_r=8,
                                   max_length=128, target_modules=ALL_LAYERS)
    model.acquire_lora("ref", LoraConfig(r=4, lora_alpha=32, lora_dropout=0.0, target_modules=ALL_LAYERS), seed=11)
    initial = {k: v.clone() for k, v in model.get_state_dict(adapter_name="ref").items()}
    model.set_optimizer("default", adapter_name="ref", lr=ADAM["learning_rate"])
    model.set_optimizer_params(adapter_name="ref", betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"],
                               weight_decay=ADAM["weight_decay"])
    model.set_loss("cross_entropy", adapter_name="ref")
    script_losses = []
    for _ in range(STEPS):
        script_losses.append(float(model.forward_backward(inputs=rows(datums), adapter_name="ref")))
        model.clip_grad_and_step(max_grad_norm=None, adapter_name="ref")
    assert losses == pytest.approx(script_losses, rel=BOUND, abs=0)
    served = adapter_tensors(megatron_server.checkpoint_dir(saved))
    local = model.get_state_dict(adapter_name="ref")
    assert served.keys() == local.keys()
    for key in local:  # per tensor: the bound of the update, plus u |w| per stored step (as test_sft)
        update = (local[key] - initial[key]).norm().item()
        room = BOUND * update + STEPS * U * local[key].norm().item()
        assert (served[key] - local[key]).norm().item() <= room, key
        if "lora_B" in key:  # lora_A's share of the first steps is second order (lora_B starts at zero)
            assert update > 10 * room, (key, update, room)


def _sample_a_tenant(server) -> None:
    """A tenant's snapshot sampled through the client (what an RL loop does between steps)."""
    client = server.service_client("bob")
    try:
        training = client.create_lora_training_client(base_model=BASE_MODEL, rank=2, seed=3).result()
        sampler = training.save_weights_and_get_sampling_client()
        sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=2)).result()
    finally:
        client.close("success").result()


def test_sampling_from_a_megatron_tenant_is_refused_with_a_400(megatron_server):
    """The server's sampler (TorchSampler) generates with an HF model only: a Megatron server says so in its
    capabilities and answers sampling with 400 (tinker.BadRequestError), not a 500; the server keeps serving."""
    import tinker

    capabilities = megatron_server.rest_client().get_server_capabilities().result()
    assert [(m.trainable, m.sampleable) for m in capabilities.supported_models] == [(True, False)]
    with pytest.raises(tinker.BadRequestError, match="this server cannot sample"):
        _sample_a_tenant(megatron_server)
    base = megatron_server.service_client("alice").create_sampling_client(base_model=BASE_MODEL)
    with pytest.raises(tinker.BadRequestError, match="this server cannot sample"):
        base.sample(types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=2)).result()
    assert megatron_server.alive()
    assert "TorchSampler samples on a TransformersModel or MultiLoraTransformersModel, got MultiLoraMegatronModel" in (
        megatron_server.log.read_text())  # the reason, in the server's log


def test_the_refusal_names_why_a_megatron_server_cannot_sample(megatron_server):
    import tinker

    with pytest.raises(tinker.BadRequestError, match="MultiLoraMegatronModel") as refused:
        _sample_a_tenant(megatron_server)
    assert "local mode" not in str(refused.value)
