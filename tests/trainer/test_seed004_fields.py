"""Seed 004's fields that were new to twinkle, each checked for its effect against an independent reference:
load_checkpoint_cfg / resume_cfg, skip_checkpoint_validation, load_from (a checkpoint), grad_norm_dtype,
skip_grad_norm_threshold, fsdp_cfg, intra_layer_micro_batch, global_batch_size from the mesh, hooks_config,
debug, debug_skip_save, async_hf_export, prober_list, internal_metrics_cfg, profile_*, dataset_cfg, sp_size,
patch_for_dcp_finish. (backend and check_health_interval: test_torchrun_health.py.)"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from rounding import LAMBDA, LAMBDA_2, U, tiny_qwen
from trainer_testing import assert_bitwise_equal, load_weights, tiny_job

from twinkle.trainer import ConfigError, DatasetConfig, FSDPConfig, LoadCheckpointConfig, Trainer, TrainerConfig

CKPT = "checkpoints/step-{:08d}/model"


def _records(work_dir: Path, key: str = "loss") -> list[dict[str, Any]]:
    path = work_dir / "logs" / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if key in r]


class Watch:
    """A hook that keeps the Trainer (connect_trainer) and what ``look(trainer, step)`` returns at each step."""

    def __init__(self, look: Any) -> None:
        self.look, self.seen, self.trainer = look, {}, None

    def connect_trainer(self, trainer: Any) -> None:
        self.trainer = trainer

    def __call__(self, step: int, **kwargs: Any) -> None:
        self.seen[step] = self.look(self.trainer, step)


def _optimizer(trainer: Any) -> Any:
    return trainer.model.optimizer_group[trainer.adapter].optimizer


def test_load_checkpoint_chooses_the_states_load_from_takes_weights_and_skip_validation(tmp_path: Path) -> None:
    import torch

    base = tmp_path / "base"
    draw = {"before_train_step": lambda **kwargs: torch.rand(3)}  # uses the RNG, as dropout would
    Trainer(**tiny_job(base, total_step=4, checkpoint_interval=2, hooks=draw)).fit()
    step2 = base / "checkpoints" / "step-00000002"
    saved_rng = torch.load(step2 / "model" / "rng_state.pt", weights_only=False)["torch"]

    # everything loaded: the run continues exactly (from another work_dir)
    look = Watch(lambda t, s: (len(_optimizer(t).state), _optimizer(t).param_groups[0]["weight_decay"],
                               torch.get_rng_state().clone()))
    Trainer(**tiny_job(tmp_path / "full", total_step=4, hooks={"before_train_step": look},
                       load_checkpoint_cfg=LoadCheckpointConfig(checkpoint_path=step2))).fit()
    assert_bitwise_equal(load_weights(tmp_path / "full" / CKPT.format(4)), load_weights(base / CKPT.format(4)))
    full = look.seen[3]

    # nothing but weights and step: empty optimizer, this config's hyper-parameters, a new schedule, the data
    # from its first row, this run's RNG (resume_cfg spells the same flags, xtuner's deprecated way)
    look = Watch(lambda t, s: (len(_optimizer(t).state), _optimizer(t).param_groups[0]["weight_decay"],
                               torch.get_rng_state().clone()))
    Trainer(**tiny_job(tmp_path / "part", total_step=4, optimizer={"weight_decay": 0.5},
                       hooks={"before_train_step": look},
                       resume_cfg={"resume_from": str(step2), "load_optimizer_states": False,
                                   "load_optimizer_args": False, "load_scheduler": False, "load_dataset": False},
                       load_checkpoint={"load_rng": False})).fit()
    part = look.seen[3]
    assert full[0] > 0 and part[0] == 0  # optimizer moments: loaded / not
    assert full[1] == 0.0 and part[1] == 0.5  # weight decay: the checkpoint's / this config's
    assert torch.equal(full[2], saved_rng) and not torch.equal(part[2], saved_rng)  # RNG: the checkpoint's / not
    lrs = {name: [r["lr"] for r in _records(tmp_path / name)] for name in ("base", "full", "part")}
    assert lrs["full"] == lrs["base"][2:]  # the schedule went on (its lr after steps 3 and 4 of 4)
    # a new cosine over the 2 remaining steps, in Python floats (a few ulps of 1e-16, inside approx's 1e-6)
    assert lrs["part"] == [pytest.approx(0.5 * 5e-3), 0.0]
    consumed = [json.loads((d / CKPT.format(4) / "trainer_state.json").read_text())["consumed_train_samples"]
                for d in (tmp_path / "full", tmp_path / "part")]
    assert consumed == [16, 8]  # the data went on / started again

    # load_from a Trainer checkpoint: its weights, nothing else
    weights = Watch(lambda t, s: {k: v.clone() for k, v in t.model.get_state_dict(adapter_name=t.adapter).items()})
    Trainer(**tiny_job(tmp_path / "from", total_step=1, load_from=step2, hooks={"before_train_step": weights})).fit()
    saved = load_weights(step2 / "model")
    assert all(torch.equal(weights.seen[1][k], saved[k]) for k in saved)

    # skip_checkpoint_validation: a bit flip inside the newest checkpoint's weights is found by the checksum
    # pass (auto_resume falls back to step 2) and not without it (step 4 is taken, with a warning)
    for name, skip in (("checked", False), ("skipped", True)):
        shutil.copytree(base, tmp_path / name)
        damaged = tmp_path / name / CKPT.format(4) / "adapter_model.safetensors"
        data = bytearray(damaged.read_bytes())
        data[-1] ^= 0x01
        damaged.write_bytes(bytes(data))
        result = Trainer(**tiny_job(tmp_path / name, total_step=4, auto_resume=True,
                                    skip_checkpoint_validation=skip)).fit()
        assert result.resumed_from.endswith("step-00000002" if not skip else "step-00000004"), name
    assert "skip_checkpoint_validation:" in (tmp_path / "skipped" / "logs" / "train.log").read_text()


def test_grad_norm_dtype_skip_threshold_and_fsdp_cfg(tmp_path: Path) -> None:
    import numpy as np

    from twinkle.errors import TwinkleError

    f32 = Trainer(**tiny_job(tmp_path / "f32", total_step=1))
    f32.fit()
    norm32 = _records(tmp_path / "f32")[0]["grad_norm"]
    assert float(np.float32(norm32)) == norm32  # computed in float32
    Trainer(**tiny_job(tmp_path / "f64", total_step=1, grad_norm_dtype="float64", prober_list=["AccProber"],
                       profile_step=1)).fit()
    norm64 = _records(tmp_path / "f64")[0]["grad_norm"]
    rows = map(json.loads, (tmp_path / "f64" / "logs/probes/AccProber/step-1-rank-0.jsonl").read_text().splitlines())
    reference = math.sqrt(sum(r["grad_norm"] ** 2 for r in rows if r["kind"] == "gradient_before_clip"))
    # the AccProber's own float64 per-parameter norms: the same float64 squares (< 1e6 of them) summed in
    # another grouping, LAMBDA_2 * 2**-53 * sqrt(1e6) = 1.3e-12 relative (tests/rounding.py's model in float64)
    assert norm64 == pytest.approx(reference, rel=LAMBDA_2 * 2.0**-53 * 1e3)
    # measured: 0.7456051911 (float64) vs 0.7456038594 (float32), 1.8e-6 apart: float32 sums lose digits. The
    # float32 sum of < 1e6 squares is within LAMBDA * sqrt(1e6) * u of the (float64 ~ exact) value: 3.6e-4
    assert float(np.float32(norm64)) != norm64 and norm64 == pytest.approx(norm32, rel=LAMBDA * U * 1e3)

    # skip_grad_norm_threshold: a window over it is dropped (no update), too many in a row stop the run
    with pytest.raises(TwinkleError, match=r"2 windows in a row had a gradient norm over "
                                           r"optimizer.skip_grad_norm_threshold=1e-09"):
        Trainer(**tiny_job(tmp_path / "skip", total_step=2, checkpoint_interval=-1,
                           optimizer={"skip_grad_norm_threshold": 1e-9, "max_consecutive_skips": 2})).fit()
    assert "Skipped step 1: gradient norm" in (tmp_path / "skip" / "logs" / "train.log").read_text()

    # fsdp_cfg: xtuner's spelling of precision and recompute, applied to the model
    bf16 = Trainer(**tiny_job(tmp_path / "bf16", total_step=1,
                              fsdp_cfg=FSDPConfig(param_dtype="bfloat16", recompute_ratio=1.0)))
    bf16.fit()
    assert bf16.model.mixed_precision == "bf16" and bf16.model.backend.hf_model().is_activation_checkpointing
    assert _records(tmp_path / "bf16")[0]["loss"] != _records(tmp_path / "f32")[0]["loss"]
    with pytest.raises(ConfigError, match=r"recompute_ratio: 0.5 recomputes part of the layers"):
        FSDPConfig(recompute_ratio=0.5)
    # sp_size: xtuner's name of the context-parallel size, checked against the launched processes
    assert TrainerConfig(total_step=1, sp_size=2).infra.cp_size == 2
    with pytest.raises(ConfigError, match=r"infra: .*cp"):
        Trainer(total_step=1, sp_size=2, work_dir=str(tmp_path / "sp"))


def test_intra_layer_micro_batch_and_micro_batch_size(tmp_path: Path) -> None:
    """Sub-batches give the gradient of the whole micro-batch with about half the saved activations;
    micro_batch_size derives the accumulation from the mesh (here 1 rank) and trains as the explicit one."""
    import torch

    from twinkle.trainer.setup import batching

    def run(name: str, **options: Any) -> int:
        peak = [0]

        class Measure:
            def connect_trainer(self, trainer: Any) -> None:
                model = trainer.model
                original = model.forward_backward

                def measured(*args: Any, **kwargs: Any) -> Any:
                    saved = [0]

                    def pack(tensor: torch.Tensor) -> torch.Tensor:
                        saved[0] += tensor.numel() * tensor.element_size()
                        return tensor

                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                        out = original(*args, **kwargs)
                    peak[0] = max(peak[0], saved[0])
                    return out

                model.forward_backward = measured

            def __call__(self, **kwargs: Any) -> None:
                pass

        # SGD: the weights move by lr x the gradient (Adam would magnify rounding in near-zero moments)
        job = tiny_job(tmp_path / name, total_step=2, hooks={"before_train_step": Measure()},
                       optimizer={"name": "SGD", "lr": 0.5}, **options)
        Trainer(**job).fit()
        return peak[0]

    whole = run("whole")
    split = run("split", intra_layer_micro_batch=2)
    # the same gradient summed over sub-batches: each step within a step's bound (4 rows of <= 128 tokens), the
    # second carrying the first's twice (tests/rounding.py); SGD (lr 0.5, clipped to norm 1) moves the weights
    # by lr * g, so by norm they differ by at most 2 steps * lr * 1 * 2 rel (the gradient's and the clip's)
    rel = (2 * 1 + 1) * tiny_qwen(128, 4).step_bound()
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in _records(tmp_path / "split")] == pytest.approx(
            [r[key] for r in _records(tmp_path / "whole")], rel=rel, abs=0), key
    got, want = load_weights(tmp_path / "split" / CKPT.format(2)), load_weights(tmp_path / "whole" / CKPT.format(2))
    room = 2 * 0.5 * 1.0 * 2 * rel
    assert got.keys() == want.keys()
    assert torch.cat([(got[k] - v).flatten() for k, v in want.items()]).norm() <= room
    moved = torch.cat([v.flatten() for k, v in want.items() if "lora_B" in k]).norm()  # lora_B starts at zero
    assert moved > 10 * room, (moved, room)
    assert split < 0.75 * whole, (split, whole)  # measured: bytes saved for backward by one forward_backward
    print(f"saved activations per forward_backward: whole {whole} B, 2 sub-batches {split} B")

    run("micro", dataloader={"micro_batch_size": 2, "gradient_accumulation_steps": 1})  # global 4 / (2 x 1 rank)
    assert_bitwise_equal(load_weights(tmp_path / "micro" / CKPT.format(2)),
                         load_weights(tmp_path / "whole" / CKPT.format(2)))  # = gradient_accumulation_steps 2
    cfg = TrainerConfig(total_step=1, global_batch_size=8, dataloader={"micro_batch_size": 2})
    assert batching(cfg, 1) == (4, 2) and batching(cfg, 2) == (2, 4) and batching(cfg, 4) == (1, 8)
    with pytest.raises(ConfigError, match=r"global_batch_size: 8 is not a multiple of dataloader.micro_batch_size"):
        batching(cfg, 3)
    assert batching(TrainerConfig(total_step=1, global_batch_size=None, intra_layer_micro_batch=2), 2) == (1, 4)


def test_hooks_debug_skip_save_async_hf_export_and_debug(tmp_path: Path) -> None:
    import torch

    from twinkle.errors import TwinkleError

    events: list[tuple[str, int, Any]] = []

    def on(event: str) -> Any:
        def hook(step: int, epoch: int, total_step: int, total_epoch: Any, **info: Any) -> None:
            extra = info.get("checkpoint")
            events.append((event, step, extra.is_dir() if extra is not None else sorted(info)))
        return hook

    hooks = {event: on(event) for event in ("before_train_step", "after_train_step", "after_evaluate",
                                            "after_save_dcp", "after_save_hf", "after_fit")}
    data = {"train_samples": 16, "eval_samples": 4, "max_length": 128}
    Trainer(**tiny_job(tmp_path / "hooks", total_step=2, checkpoint_interval=2, eval_interval=2, hf_interval=1,
                       dataset=data, hooks_config=hooks)).fit()
    assert events == [("before_train_step", 1, []), ("after_train_step", 1, ["train_step_info"]),
                      ("after_save_hf", 1, True), ("before_train_step", 2, []),
                      ("after_train_step", 2, ["train_step_info"]), ("after_evaluate", 2, ["metrics"]),
                      ("after_save_hf", 2, True), ("after_save_dcp", 2, True), ("after_fit", 2, ["result"])]

    # debug_skip_save: the same training, nothing written
    result = Trainer(**tiny_job(tmp_path / "nosave", total_step=2, checkpoint_interval=2, eval_interval=2,
                                hf_interval=1, dataset=data, debug_skip_save=True)).fit()
    assert result.checkpoint is None and result.best_eval_loss is not None
    assert sorted(p.name for p in (tmp_path / "nosave").iterdir() if not p.name.startswith(".")) == ["logs",
                                                                                                    "run.json"]
    assert [r["loss"] for r in _records(tmp_path / "nosave")] == [r["loss"] for r in _records(tmp_path / "hooks")]

    # async_hf_export: the exports written in the background equal the ones written in the loop
    Trainer(**tiny_job(tmp_path / "async", total_step=2, hf_interval=1, async_hf_export=True)).fit()
    for step in (1, 2):
        name = f"hf/step-{step:08d}"
        assert_bitwise_equal(load_weights(tmp_path / "async" / name), load_weights(tmp_path / "hooks" / name))
        assert json.loads((tmp_path / "async" / name / "adapter_config.json").read_text())["r"] == 16
    assert not [p for p in (tmp_path / "async" / "hf").iterdir() if p.name.startswith(".")]  # renamed into place

    # debug: a NaN weight (put there at step 2) stops the run at once, naming the module that produced it
    def poison(step: int, **kwargs: Any) -> None:
        if step == 2:
            with torch.no_grad():
                poison.trainer.model.model.base_model.model.model.layers[1].mlp.up_proj.lora_B.default.weight[0, 0] = \
                    float("nan")
    poison.connect_trainer = lambda trainer: setattr(poison, "trainer", trainer)
    with pytest.raises(TwinkleError, match=r"debug: anomaly detection stopped step 2: .*nan.* The first non-finite "
                                           r"forward output came from .*layers\.1\.mlp\.up_proj"):
        Trainer(**tiny_job(tmp_path / "debug", total_step=3, debug=True, hooks={"before_train_step": poison})).fit()
    # without debug the same NaN step is skipped (and the run goes on skipping)
    from twinkle.model.optimizer_group import TooManySkippedStepsError

    with pytest.raises(TooManySkippedStepsError):
        Trainer(**tiny_job(tmp_path / "nodebug", total_step=3, hooks={"before_train_step": poison},
                           optimizer={"max_consecutive_skips": 2})).fit()


def test_probers_internal_metrics_and_profiling(tmp_path: Path) -> None:
    from twinkle.registry import get_registry

    assert {"AccProber", "TimeProber"} <= set(get_registry().names("prober"))
    with pytest.raises(ConfigError, match=r"prober_list \(NoSuchProber\)"):
        Trainer(total_step=1, prober_list=["NoSuchProber"], work_dir=str(tmp_path / "no"))

    logs = tmp_path / "logs"
    Trainer(**tiny_job(tmp_path / "wd", total_step=2, checkpoint_interval=2, log_dir=logs, profile_step=2,
                       prober_list=["AccProber", "TimeProber"],
                       internal_metrics_cfg={"internal_metrics_interval": 2})).fit()
    records = [r for r in map(json.loads, (logs / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert not [k for k in records[0] if k.startswith(("probe/", "internal/"))]  # step 1: neither is due
    last = records[1]
    # probers: per-module activations, per-parameter gradients, per-module time, at the profile step only
    rows = [json.loads(line) for line in (logs / "probes/AccProber/step-2-rank-0.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in rows}
    assert kinds == {"activation", "gradient_before_clip", "gradient_after_clip", "grad_norm"}
    assert not (logs / "probes/AccProber/step-1-rank-0.jsonl").exists()
    assert any(k.startswith("probe/act_absmax/") and "layers.1.mlp" in k for k in last)
    assert any(k.startswith("probe/forward_ms/") for k in last)
    # internal metrics: the weight RMS per layer equals the one computed from the checkpoint's weights
    from twinkle.trainer.internal_metrics import layer_of

    weights = {k: v for k, v in load_weights(tmp_path / "wd" / CKPT.format(2)).items() if "lora_" in k}
    for layer in ("layers.0", "layers.1", "lm_head"):
        tensors = [t.double() for k, t in weights.items() if layer_of(k) == layer]
        rms = math.sqrt(sum(float(t.pow(2).sum()) for t in tensors) / sum(t.numel() for t in tensors))
        # both in float64 from the same float32 weights (saved exactly): < 1e6 squares summed in other orders,
        # 2 * LAMBDA_2 * 2**-53 * sqrt(1e6) (the square root halves it; the division is exact to 1 ulp)
        assert last[f"internal/weight_rms/{layer}"] == pytest.approx(rms, rel=2 * LAMBDA_2 * 2.0**-53 * 1e3), layer
        assert last[f"internal/grad_norm/{layer}"] > 0
    for index in (0, 1):
        assert 0.0 < last[f"internal/attn_entropy/layers.{index}"] < math.log(128)
        assert 0.0 < last[f"internal/attn_max_prob/layers.{index}"] <= 1.0
    assert last["internal/max_logits"] > 0
    # profile_time: a trace of the profile step under log_dir
    assert json.loads((logs / "profile" / "trace-step-2.json").read_text())["traceEvents"]

    # profile_memory alone: a memory timeline, no trace
    Trainer(**tiny_job(tmp_path / "mem", total_step=1, profile_step=1, profile_time=False, profile_memory=True)).fit()
    profile = tmp_path / "mem" / "logs" / "profile"
    assert sorted(p.name for p in profile.iterdir()) == ["memory-timeline-step-1.json"]
    times, sizes = json.loads((profile / "memory-timeline-step-1.json").read_text())
    assert len(times) == len(sizes) > 0


def test_moe_load_balance_and_router_stats(tmp_path: Path) -> None:
    """internal_metrics on a tiny mixture-of-experts model: maxvio from the top-k routing, checked by hand."""
    import torch
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from twinkle.trainer import InternalMetricsConfig
    from twinkle.trainer.internal_metrics import forward_stats

    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=32,
                                               moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                                               num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                               shared_expert_intermediate_size=16))
    batch = {"input_ids": torch.randint(0, 64, (2, 9)), "attention_mask": torch.ones(2, 9, dtype=torch.long)}
    cfg = InternalMetricsConfig(internal_metrics_interval=1, monitor_moe_load_balance_stats=True,
                                monitor_moe_router_logits_stats=True)
    stats = forward_stats(model, model, batch, cfg)
    with torch.no_grad():
        router = model(**batch, output_router_logits=True).router_logits
    for index, logits in enumerate(router):
        counts = torch.bincount(logits.topk(2, dim=-1).indices.reshape(-1), minlength=4).double()
        # the same forward in this process: the same logits and integer counts; approx's 1e-6 only covers the
        # float64 division and mean (a few ulps), and a float32 logit converted to float
        assert stats[f"internal/maxvio/layers.{index}"] == pytest.approx(float(counts.max() / counts.mean() - 1))
        assert stats[f"internal/router_logits_max/layers.{index}"] == pytest.approx(float(logits.max()))


def test_dataset_cfg_sources_are_combined_by_sample_ratio(tmp_path: Path) -> None:
    from twinkle.trainer.setup import build_datasets, sampled_rows

    for name, count in (("a", 4), ("b", 6)):
        rows = [{"messages": [{"role": "user", "content": f"{name}{i}?"},
                              {"role": "assistant", "content": f"{name}{i}"}]} for i in range(count)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sources = [{"dataset": DatasetConfig(anno_path=tmp_path / "a.jsonl", sample_ratio=2.0, preprocessor=None)},
               {"dataset": DatasetConfig(anno_path=tmp_path / "b.jsonl", sample_ratio=0.5, preprocessor=None)}]
    cfg = TrainerConfig(total_step=1, dataset_cfg=sources)
    train, _ = build_datasets(cfg, "twinkle://tiny-qwen")
    assert len(train) == 4 * 2 + 3  # every row of a twice; half of b (a seeded sample, no repeats)
    a, b = (source["dataset"] for source in cfg.dataset.combine)
    assert sorted(sampled_rows(a, 0)) == [0, 0, 1, 1, 2, 2, 3, 3]
    picked = sampled_rows(b, 1)
    assert len(picked) == len(set(picked)) == 3 and picked == sampled_rows(b, 1)  # seeded
    # xtuner's newer place for the list: dataloader_cfg.dataset_config_list, the same config
    same = TrainerConfig(total_step=1, dataloader_cfg={"dataset_config_list": sources})
    assert same.dataset == cfg.dataset


def test_patch_for_dcp_finish_broadcasts_no_metadata_and_the_checkpoint_still_loads(tmp_path: Path) -> None:
    """What xtuner patches (the finish step's return value), done on torch 2.13: the save returns an empty
    Metadata, the .metadata file is complete and the checkpoint loads back equal."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.utils import _DistWrapper

    from twinkle.trainer.dcp_finish import dcp_finish_patch

    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    plain = dcp.save(state, checkpoint_id=str(tmp_path / "plain"), no_dist=True)
    original = _DistWrapper.all_reduce
    with dcp_finish_patch(True):
        patched = dcp.save(state, checkpoint_id=str(tmp_path / "patched"), no_dist=True)
    assert _DistWrapper.all_reduce is original  # removed afterwards
    assert set(plain.state_dict_metadata) == {"w", "b"} and patched.state_dict_metadata == {}
    loaded = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "patched"), no_dist=True)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
    # in the Trainer: async checkpoints (DCP's async_save) with the patch resume exactly
    job = tiny_job(tmp_path / "wd", total_step=2, checkpoint_interval=1, async_checkpoint=True,
                   patch_for_dcp_finish=True)
    Trainer(**job).fit()
    shutil.rmtree(tmp_path / "wd" / "checkpoints" / "step-00000002")
    Trainer(**{**job, "auto_resume": True}).fit()
    reference = tmp_path / "ref"
    Trainer(**tiny_job(reference, total_step=2, checkpoint_interval=1)).fit()
    assert [r["loss"] for r in _records(tmp_path / "wd")][-1] == [r["loss"] for r in _records(reference)][-1]
