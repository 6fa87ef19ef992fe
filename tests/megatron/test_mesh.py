"""DeviceMesh -> megatron-core parallel groups, and every bad request refused before a weight is read."""

from __future__ import annotations

import itertools

import pytest
import torch
import transformers
from megatron_testing import hf_model, make_batch, megatron_model, save_hf
from rounding import tiny_hf

from twinkle import DeviceMesh
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.parallel.mesh import MEGATRON_ORDER, parallel_sizes

MESHES = [dict(tp_size=2, dp_size=2, pp_size=2, cp_size=2), dict(tp_size=4, dp_size=2), dict(pp_size=4, dp_size=2),
          dict(tp_size=2, cp_size=2, dp_size=3), dict(tp_size=2, dp_size=4, ep_size=2, pp_size=2)]


def _megatron_groups(sizes, dim):
    """megatron-core's own rank arithmetic (parallel_state.RankGenerator) for one kind of group."""
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=sizes.tp, ep=1, dp=sizes.dp, pp=sizes.pp, cp=sizes.cp, order=MEGATRON_ORDER)
    return gen.get_ranks(dim)


@pytest.mark.parametrize("sizes", MESHES, ids=lambda s: "-".join(f"{k[:-5]}{v}" for k, v in s.items()))
def test_megatron_groups_are_twinkle_mesh_groups(sizes):
    mesh = DeviceMesh.from_sizes(**sizes)
    mapped = parallel_sizes(mesh)
    for dim in ("tp", "dp", "cp", "pp"):
        for group in _megatron_groups(mapped, dim):
            for rank in group:
                assert mesh.group_ranks(dim, rank) == group, (dim, rank)
    # model-parallel (tp x pp) groups too: same pp/tp members, in the same order
    for group in _megatron_groups(mapped, "tp-pp"):
        assert sorted(group) == mesh.group_ranks(("tp", "pp"), group[0])


def test_expert_parallel_groups_match_the_mesh_ep_coordinate():
    from megatron.core.parallel_state import RankGenerator

    mesh = DeviceMesh.from_sizes(tp_size=2, dp_size=4, ep_size=2, pp_size=2)
    sizes = parallel_sizes(mesh)
    expert_dp = sizes.dp * sizes.cp // sizes.ep
    gen = RankGenerator(tp=sizes.tp, ep=sizes.ep, dp=expert_dp, pp=sizes.pp, cp=1, order="tp-ep-dp-pp")
    for group in gen.get_ranks("ep"):
        assert [mesh.coords(r)["ep"] for r in group] == list(range(sizes.ep))
        assert len({(mesh.coords(r)["tp"], mesh.coords(r)["pp"]) for r in group}) == 1


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        (DeviceMesh.from_sizes(pp_size=2, vpp_size=2), r"vpp_size=2.*virtual pipeline parallelism.*Remove vpp_size"),
        (DeviceMesh.from_sizes(fsdp_size=2, dp_size=1), r"fsdp_size=2\) cannot be mapped.*Use dp_size instead"),
    ],
)
def test_unmappable_meshes_are_refused(mesh, message):
    with pytest.raises(MegatronConfigError, match=message):
        parallel_sizes(mesh)


@pytest.fixture
def no_weights_read(monkeypatch):
    """Fail the test if MegatronModel reads any weight."""
    import twinkle_megatron.model.build as module

    def forbidden(*args, **kwargs):
        raise AssertionError("weights were loaded before the error")

    monkeypatch.setattr(module, "load_weights", forbidden)


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        (DeviceMesh.from_sizes(pp_size=2, vpp_size=4), r"vpp_size=4"),
        (DeviceMesh.from_sizes(tp_size=3), r"num_attention_heads=4 by tp_size=3; num_key_value_heads=2 by tp_size=3"),
        (DeviceMesh.from_sizes(pp_size=2), r"pp_size=2 needs CUDA"),
        (DeviceMesh.from_sizes(dp_size=2, ep_size=2), r"ep_size=2 needs a mixture-of-experts model"),
        (DeviceMesh.from_sizes(tp_size=2, sequence_parallel=True), r"sequence_parallel=True needs CUDA"),
    ],
)
def test_bad_meshes_fail_before_any_weight_is_read(mesh, message, tmp_path, no_weights_read):
    path = save_hf(hf_model("qwen2"), tmp_path)
    with pytest.raises(MegatronConfigError, match=message):
        megatron_model(path, device_mesh=mesh)


def test_unmapped_architecture_fails_before_any_weight_is_read(tmp_path, no_weights_read):
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    gpt2.save_pretrained(str(tmp_path))
    with pytest.raises(MegatronConfigError, match=r"no HF<->Megatron mapping for model_type='gpt2'"):
        megatron_model(tmp_path)


def test_moe_on_cpu_is_refused_with_the_reason(tmp_path, no_weights_read):
    with pytest.raises(MegatronConfigError, match=r"mixture-of-experts model.*need CUDA and Transformer Engine"):
        megatron_model(save_hf(hf_model("qwen3_moe"), tmp_path))


def test_megatron_kwargs_must_not_contradict_the_mesh(tmp_path, no_weights_read):
    path = save_hf(hf_model("qwen2"), tmp_path)
    with pytest.raises(MegatronConfigError, match=r"\['tensor_model_parallel_size'\] are set by twinkle"):
        megatron_model(path, tensor_model_parallel_size=2)
    with pytest.raises(TypeError, match=r"unknown arguments \['not_a_field'\]"):
        megatron_model(path, not_a_field=1)


def test_mesh_layout_is_row_major_with_tp_fastest():
    """The premise of the mapping: twinkle's rank order is megatron's tp-cp-dp-pp order."""
    mesh = DeviceMesh.from_sizes(tp_size=2, cp_size=2, dp_size=2, pp_size=2)
    for rank, (pp, dp, cp, tp) in enumerate(itertools.product(range(2), repeat=4)):
        coords = mesh.coords(rank)
        assert (coords["pp"], coords["dp"], coords["cp"], coords["tp"]) == (pp, dp, cp, tp)


def test_megatron_training_arguments_go_to_the_object_they_configure(tmp_path):
    """Seed 001: megatron's arguments in kwargs. Each lands in TransformerConfig, the DDP config, the optimizer
    defaults or the micro-batching; a misspelt one is refused with a suggestion and the accepted names."""
    from megatron.core.distributed import DistributedDataParallelConfig

    from twinkle_megatron.model.drivers import ddp_settings

    path = save_hf(hf_model("qwen2"), tmp_path)
    model = megatron_model(path, recompute_activations=True, hidden_dropout=0.0, overlap_grad_reduce=True,
                           bucket_size=1 << 20, use_distributed_optimizer=True, lr=3e-3, weight_decay=0.0,
                           micro_batch_size=2)
    assert model.transformer_config.recompute_granularity == "selective"
    assert model.transformer_config.hidden_dropout == 0.0
    ddp = DistributedDataParallelConfig(**ddp_settings(model.backend))  # what Megatron DDP is built with on a GPU
    assert (ddp.overlap_grad_reduce, ddp.bucket_size, ddp.use_distributed_optimizer) == (True, 1 << 20, True)
    model.set_optimizer("default", weight_decay=0.1)
    assert model.optimizer_group["default"].optimizer.lr == 3e-3  # constructor default (a float passed through)
    assert model.optimizer_group["default"].optimizer.optimizer.param_groups[0]["weight_decay"] == 0.1  # call wins

    batch = make_batch(seed=5)  # 4 rows: micro_batch_size=2 makes it two micro-batches
    split, whole = megatron_model(path, micro_batch_size=2), megatron_model(path)
    rows_seen = []
    run = split.backend.run
    split.backend.run = lambda task, micro, *a: rows_seen.append(len(micro["input_ids"])) or run(task, micro, *a)
    # micro-batches sum the same terms in another order: a forward's float32 bound (tests/rounding.py)
    assert split.forward_backward(inputs=batch) == pytest.approx(whole.forward_backward(inputs=batch),
                                                                 rel=tiny_hf(12, 4, vocab=125).forward_bound())
    assert rows_seen == [2, 2]
    logits = split.forward_only(batch)["logits"]  # a forward runs the micro-batches' rows together
    assert rows_seen[2:] == [4] and torch.equal(logits, whole.forward_only(batch)["logits"])
    with pytest.raises(TypeError, match=r"unknown arguments \['overlap_grad_reduse'\]\. Did you mean "
                                        r"overlap_grad_reduce.*DistributedDataParallelConfig fields \(.*bucket_size"):
        megatron_model(path, overlap_grad_reduse=True)
