"""SFT through the real tinker client equals twinkle's component API on the same data and LoRA init."""

from __future__ import annotations

import pytest
import torch
from rounding import U, chain_bound, tiny_qwen
from server_proc import ALL_LAYERS, BASE_MODEL
from server_testing import adapter_tensors, reference_model, rows, sft_datums, weighted_nll
from tinker import types

STEPS = 6
#: eps = 1: the update is Lipschitz in the gradient (tests/server/test_ray_mode.py derives it); with 1e-8 the
#: server's and the script's reduction orders flip lr * sign(g) of near-zero gradients, bounded on no CPU
ADAM = {"learning_rate": 2e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1.0, "weight_decay": 0.01}
#: the served run against the script (another process, another summation order): STEPS steps of 4 rows of at
#: most 20 tokens, step k carrying the earlier steps' rounding twice (tests/rounding.py, as test_ray_mode)
BOUND = (2 * (STEPS - 1) + 1) * tiny_qwen(seq=20, rows=4).step_bound()
#: one step of the same 4 rows with its sums grouped otherwise (two halves added, a client-side loss)
STEP = tiny_qwen(seq=20, rows=4).step_bound()


def _one_step_alike(got: dict, want: dict, initial: dict) -> None:
    """One Adam (eps = 1) step's weights per tensor within STEP of its update, plus u |w| of storage."""
    assert got.keys() == want.keys() == initial.keys()
    for key in want:
        update = (want[key] - initial[key]).norm().item()
        room = STEP * update + U * want[key].norm().item()
        assert (got[key] - want[key]).norm().item() <= room, key
        if "lora_B" in key:  # lora_B starts at zero: the step moved it far beyond the room
            assert update > 10 * room, (key, update, room)


def test_sft_loop_through_the_client_equals_the_component_api(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=1234).result()
    info = training.get_info()
    assert (info.model_data.model_name, info.lora_rank, info.is_lora) == (BASE_MODEL, 8, True)  # no ":" in it
    tokenizer = training.get_tokenizer()  # loads offline from the tokenizer_id the server reports
    datums = sft_datums(tokenizer)

    client_losses, client_metrics = [], []
    for _ in range(STEPS):
        fwd = training.forward_backward(datums, "cross_entropy")
        opt = training.optim_step(types.AdamParams(**ADAM))
        result = fwd.result()
        client_metrics.append(opt.result().metrics)
        client_losses.append(result.metrics["loss:sum"])
        # the reported loss is Tinker's definition applied to the returned per-token logprobs
        # the same per-token logprobs summed in another order (80 terms at most)
        assert result.metrics["loss:sum"] == pytest.approx(weighted_nll(result, datums), rel=chain_bound(80))
        assert [len(o["logprobs"].data) for o in result.loss_fn_outputs] == [d.model_input.length for d in datums]
    saved = training.save_weights_for_sampler("final").result().path
    assert client_losses[-1] < 0.7 * client_losses[0]  # it learns

    # the same run written against the component API, as a training script would
    model = reference_model()
    config = __import__("peft").LoraConfig(r=8, lora_alpha=32, lora_dropout=0.0, target_modules=ALL_LAYERS)
    model.acquire_lora("ref", config, seed=1234)
    initial = {k: v.clone() for k, v in model.get_state_dict(adapter_name="ref").items()}
    model.set_optimizer("AdamW", adapter_name="ref", lr=ADAM["learning_rate"], betas=(ADAM["beta1"], ADAM["beta2"]),
                        eps=ADAM["eps"], weight_decay=ADAM["weight_decay"])
    model.set_loss("cross_entropy", adapter_name="ref")
    script_losses = []
    for _ in range(STEPS):
        script_losses.append(model.forward_backward(inputs=rows(datums), adapter_name="ref"))
        model.clip_grad_and_step(max_grad_norm=None, adapter_name="ref")
    diffs = [abs(a - b) / abs(b) for a, b in zip(client_losses, script_losses)]
    print(f"SFT loss via client vs component API: max rel diff {max(diffs):.2e}; losses {client_losses}")
    assert max(diffs) < BOUND
    served = adapter_tensors(server.checkpoint_dir(saved))
    local = model.get_state_dict(adapter_name="ref")
    assert served.keys() == local.keys()
    for key in local:  # per tensor: the bound of the update, plus u |w| per stored step (as test_ray_mode)
        update = (local[key] - initial[key]).norm().item()
        room = BOUND * update + STEPS * U * local[key].norm().item()
        assert (served[key] - local[key]).norm().item() <= room, key
        if "lora_B" in key:  # lora_A's share of the first steps is second order (lora_B starts at zero)
            assert update > 10 * room, (key, update, room)
    assert all("grad_norm:mean" in m for m in client_metrics)


def test_forward_reports_without_training_and_accumulation_sums(server, alice):
    """forward() leaves the weights alone; two forward_backward calls before a step add their gradients.

    eps=1 keeps Adam's first update proportional to the gradient (a tiny eps makes it ~sign(grad), blind
    to whether the two halves were summed or averaged).
    """
    adam = types.AdamParams(learning_rate=1e-2, eps=1.0)
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=7).result()
    initial = training.save_weights_for_sampler("initial").result().path
    datums = sft_datums(training.get_tokenizer())
    before = training.forward(datums, "cross_entropy").result()
    again = training.forward(datums, "cross_entropy").result()
    assert before.metrics["loss:sum"] == again.metrics["loss:sum"]
    training.forward_backward(datums[:2], "cross_entropy").result()
    training.forward_backward(datums[2:], "cross_entropy").result()
    training.optim_step(adam).result()
    split = training.save_weights_for_sampler("split").result().path

    whole = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=7).result()
    whole.forward_backward(datums, "cross_entropy").result()
    whole.optim_step(adam).result()
    together = whole.save_weights_for_sampler("together").result().path
    a, b = adapter_tensors(server.checkpoint_dir(split)), adapter_tensors(server.checkpoint_dir(together))
    _one_step_alike(a, b, adapter_tensors(server.checkpoint_dir(initial)))


def test_forward_backward_custom_runs_client_side_on_top_of_cross_entropy(server, alice):
    """The client's two-phase custom loss (forward, then cross_entropy with weights = -dL/dlogprobs) works here.

    A custom loss equal to Tinker's cross_entropy must give the same update as cross_entropy itself.
    """
    adam = types.AdamParams(learning_rate=1e-2, eps=1.0)
    custom = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=5).result()
    initial = custom.save_weights_for_sampler("initial").result().path
    datums = sft_datums(custom.get_tokenizer())

    def nll(data, logprobs):
        loss = sum(-(lp * torch.as_tensor(d.loss_fn_inputs["weights"].to_numpy())).sum()
                   for d, lp in zip(data, logprobs))
        return loss, {"custom_nll:sum": float(loss.detach())}

    result = custom.forward_backward_custom(datums, nll).result()
    custom.optim_step(adam).result()
    plain = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=5).result()
    reference = plain.forward_backward(datums, "cross_entropy").result()
    plain.optim_step(adam).result()
    # the same forward, its token sum (<= 80 terms) taken on the client in another order
    rel = tiny_qwen(seq=20, rows=4).forward_bound() + chain_bound(80)
    assert result.metrics["loss:sum"] == pytest.approx(reference.metrics["loss:sum"], rel=rel, abs=0)
    a = adapter_tensors(server.checkpoint_dir(custom.save_weights_for_sampler("custom").result().path))
    b = adapter_tensors(server.checkpoint_dir(plain.save_weights_for_sampler("plain").result().path))
    _one_step_alike(a, b, adapter_tensors(server.checkpoint_dir(initial)))
