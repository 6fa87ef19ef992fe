"""`twinkle serve --model.type MultiLoraMegatronModel`: the service depends on the MultiTenantModel protocol only,
so a Megatron base model serves tenants (CPU, TP=1) through the real tinker client, with the numbers of the
component API on the same model.
"""

from __future__ import annotations

import pytest
import torch
from server_proc import ALL_LAYERS, BASE_MODEL, make_keys, start_server
from server_testing import adapter_tensors, rows, sft_datums
from tinker import types

pytest.importorskip("megatron.core")

STEPS = 3
ADAM = {"learning_rate": 2e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.01}


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
    model = MultiLoraMegatronModel(model_id=BASE_MODEL, mixed_precision="no", max_loras=2, max_r=8,
                                   max_length=128, target_modules=ALL_LAYERS)
    model.acquire_lora("ref", LoraConfig(r=4, lora_alpha=32, lora_dropout=0.0, target_modules=ALL_LAYERS), seed=11)
    model.set_optimizer("default", adapter_name="ref", lr=ADAM["learning_rate"])
    model.set_optimizer_params(adapter_name="ref", betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"],
                               weight_decay=ADAM["weight_decay"])
    model.set_loss("cross_entropy", adapter_name="ref")
    script_losses = []
    for _ in range(STEPS):
        script_losses.append(float(model.forward_backward(inputs=rows(datums), adapter_name="ref")))
        model.clip_grad_and_step(max_grad_norm=None, adapter_name="ref")
    assert losses == pytest.approx(script_losses, rel=1e-5)
    served = adapter_tensors(megatron_server.checkpoint_dir(saved))
    local = model.get_state_dict(adapter_name="ref")
    assert served.keys() == local.keys()
    for key in local:
        torch.testing.assert_close(served[key], local[key], rtol=1e-5, atol=1e-6, msg=key)
