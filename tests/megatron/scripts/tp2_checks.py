"""Run under ``torchrun --nproc_per_node=2`` (gloo): every two-process check in one launch; rank N writes rankN.json.

Scenarios, in order (the parallel state is rebuilt between layouts):
TP=2 -- logits/weights/adapters against HF and peft; 5 steps of full training (Qwen3: q/k norms) with a resume
from a step-3 checkpoint; 5 steps of LoRA training (Qwen2); the vocab-parallel loss on a large vocabulary with
its peak memory; a custom loss reading the gathered logits; LoRA on lm_head (untied and tied embeddings) against
peft: logits, gradients, files, the padded vocabulary row, runtime_gather_output.
DP=2 -- the same full and LoRA training, each rank on its half of every batch; the loss forward_backward returns,
eager and through megatron's schedule.
CP=2 groups -- the CPU driver sums token counts and gradients over data x context parallel ranks.

argv: <qwen2 dir> <qwen3 dir> <peft adapter dir (on qwen2)> <large-vocab qwen2 dir> <output dir>
      <tied qwen2 dir> <peft adapter with lm_head on qwen2> <the same on tied qwen2>
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron_testing import (  # noqa: E402
    ADAM_EPS,
    TRAIN_LR,
    VOCAB_LARGE,
    adapter_grads,
    grad_diffs,
    lora_config,
    loss_peak_bytes,
    make_batch,
    peft_grads,
    rows,
    scheduled_on_cpu,
    train,
    train_batches,
)
from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceMesh  # noqa: E402
from twinkle.loss import Loss  # noqa: E402
from twinkle.model import MegatronModel  # noqa: E402
from twinkle_megatron.parallel import state  # noqa: E402
from twinkle_megatron.parallel.mesh import ParallelSizes, parallel_sizes  # noqa: E402


def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 125, (3, 10), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def max_diff(ours: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest difference over the real tokens, relative to the largest reference logit (the scale a
    derived tolerance takes: tests/rounding.py's ``within``)."""
    real = mask.bool()
    return float((ours[real] - ref[real]).abs().max() / ref[real].abs().max())


def hf_logits(model: torch.nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits


def groups(world: int) -> dict[str, list[int]]:
    from megatron.core import parallel_state as ps

    return {"tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
            "dp": dist.get_process_group_ranks(ps.get_data_parallel_group())}


class GatheredCrossEntropy(Loss):
    """A custom loss: reads ``outputs['logits']`` (gathered over TP on access) like any user loss would."""

    def compute(self, inputs, outputs, **kwargs):
        logits = outputs["logits"]
        labels = torch.nn.functional.pad(inputs["labels"], (0, 1), value=-100)[..., 1:]
        total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                                  ignore_index=-100, reduction="sum")
        return total, (labels != -100).sum()


def layout_checks(qwen2: Path, qwen3: Path, adapter: Path, mesh: DeviceMesh, out: Path, report: dict) -> None:
    """Forward, weights and adapters at TP=2 against HF / peft."""
    rank, b = dist.get_rank(), batch()
    model = MegatronModel(model_id=str(qwen2), device_mesh=mesh, mixed_precision="no")
    report["tp_rank"] = model.backend.ranks.tp
    report["vocab_rows_on_this_rank"] = int(model.gpt.embedding.word_embeddings.weight.shape[0])
    hf = AutoModelForCausalLM.from_pretrained(str(qwen2), dtype=torch.float32).eval()
    report["qwen2_logits_diff"] = max_diff(model.forward_only(inputs=b)["logits"], hf_logits(hf, b),
                                           b["attention_mask"])
    original = load_file(str(qwen2 / "model.safetensors"))
    exported = model.get_state_dict()
    report["export_bit_identical"] = set(exported) == set(original) and all(
        torch.equal(exported[k], original[k]) for k in original)

    saved = Path(model.save("tp2-full", output_dir=str(out)))
    dist.barrier()
    written = load_file(str(saved / "model.safetensors"))
    report["saved_bit_identical"] = all(torch.equal(written[k], original[k]) for k in original)
    reloaded = AutoModelForCausalLM.from_pretrained(str(saved), dtype=torch.float32).eval()
    report["saved_reload_logits_diff"] = max_diff(hf_logits(reloaded, b), hf_logits(hf, b), b["attention_mask"])
    report["groups_tp2"] = groups(2)
    report["mesh_tp_group"] = mesh.group_ranks("tp", rank)

    model.add_adapter_to_model("tenant", str(adapter))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(qwen2), dtype=torch.float32),
                                           str(adapter)).eval()
    report["lora_logits_diff"] = max_diff(model.forward_only(inputs=b)["logits"], hf_logits(peft_model, b),
                                          b["attention_mask"])
    saved_adapter = Path(model.save("tp2-adapter", output_dir=str(out)))
    dist.barrier()
    source, written = (load_file(str(d / "adapter_model.safetensors")) for d in (adapter, saved_adapter))
    report["adapter_bit_identical"] = set(source) == set(written) and all(
        torch.equal(source[k], written[k]) for k in source)

    second = MegatronModel(model_id=str(qwen3), device_mesh=mesh, mixed_precision="no")
    hf3 = AutoModelForCausalLM.from_pretrained(str(qwen3), dtype=torch.float32).eval()
    report["qwen3_logits_diff"] = max_diff(second.forward_only(inputs=b)["logits"], hf_logits(hf3, b),
                                           b["attention_mask"])


def training(qwen2: Path, qwen3: Path, mesh: DeviceMesh, out: Path, tag: str, report: dict) -> None:
    """5 steps of full training (Qwen3) and of LoRA (Qwen2); under DP each rank takes its half of the rows."""
    dp, part = mesh.dp_size, mesh.coords(dist.get_rank())["dp"] if mesh.dp_size > 1 else 0
    batches = [rows(b, part, dp) for b in train_batches()]
    full = MegatronModel(model_id=str(qwen3), device_mesh=mesh, mixed_precision="no")
    report[f"{tag}_full"] = train(full, batches)
    report[f"{tag}_full_saved"] = full.save(f"{tag}-full", output_dir=str(out))
    lora = MegatronModel(model_id=str(qwen2), device_mesh=mesh, mixed_precision="no")
    lora.add_adapter_to_model("a", lora_config())
    report[f"{tag}_lora"] = train(lora, batches, adapter="a")
    report[f"{tag}_lora_saved"] = lora.save(f"{tag}-lora", output_dir=str(out), adapter_name="a")
    if tag != "tp2":
        return
    head = MegatronModel(model_id=str(qwen3), device_mesh=mesh, mixed_precision="no")
    report["tp2_resume_head"] = train(head, batches[:3])
    checkpoint = head.save("tp2-step3", output_dir=str(out), save_optimizer=True)
    report["tp2_resume_files"] = sorted(p.name for p in Path(checkpoint).iterdir())
    resumed = MegatronModel(model_id=checkpoint, device_mesh=mesh, mixed_precision="no")
    resumed.set_optimizer("default", lr=TRAIN_LR, weight_decay=0.01, adam_eps=ADAM_EPS)
    resumed.resume_from_checkpoint(checkpoint)
    report["tp2_resume_tail"] = train(resumed, batches[3:])


def vocab_parallel_loss(large: Path, mesh: DeviceMesh, report: dict) -> None:
    """The loss on a large vocabulary: its value, token accuracy, peak memory; and a custom loss on gathered logits."""
    data = make_batch(seed=11, rows=2, length=64, vocab=VOCAB_LARGE)
    model = MegatronModel(model_id=str(large), device_mesh=mesh, mixed_precision="no")
    model.set_optimizer("default", lr=1e-3)
    report["large_loss"], report["large_loss_peak_bytes"] = loss_peak_bytes(model, data)
    report["large_token_accuracy"] = model.calculate_metric(True)["token_accuracy"]
    report["large_logit_columns_on_this_rank"] = int(model.gpt.output_layer.weight.shape[0])
    model.zero_grad()
    model.set_loss(GatheredCrossEntropy())
    report["large_custom_loss"] = float(model.forward_backward(inputs=data))


def lm_head_lora(base: Path, adapter: Path, tied: bool, mesh: DeviceMesh, out: Path, report: dict) -> None:
    """A peft adapter with lm_head (its base-weight copy included) at TP=2: logits and gradients against peft, the
    saved files, this rank's padded vocabulary rows of B (zero, no gradient, still zero after a step), and
    ``runtime_gather_output=True`` (the delta gathered with the output)."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    tag = "lm_head_tied" if tied else "lm_head"
    b = make_batch(seed=5)
    model = MegatronModel(model_id=str(base), device_mesh=mesh, mixed_precision="no")
    model.add_adapter_to_model("h", str(adapter))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32),
                                           str(adapter), is_trainable=True).eval()
    report[f"{tag}_logits_diff"] = max_diff(model.forward_only(inputs=b)["logits"], hf_logits(peft_model, b),
                                            b["attention_mask"])
    saved = Path(model.save(f"tp2-{tag}", output_dir=str(out)))
    dist.barrier()
    source, written = (load_file(str(d / "adapter_model.safetensors")) for d in (adapter, saved))
    copy = "base_model.model.lm_head.base_layer.weight"
    report[f"{tag}_adapter_bit_identical"] = copy in source and set(source) - {copy} == set(written) and all(
        torch.equal(source[k], written[k]) for k in written)

    model.set_optimizer("default", lr=1e-2)
    model.forward_backward(inputs=b)
    diffs = grad_diffs(adapter_grads(model), peft_grads(peft_model, b))
    report[f"{tag}_grad_keys"] = sorted(k.split(".")[-3] for k in diffs if "lm_head" in k)
    report[f"{tag}_grad_rel_diff"] = max(diffs.values())
    layer = model.gpt.output_layer
    real = layer.real_rows
    report[f"{tag}_padded_rows"] = layer.lora_B["h"].shape[0] - real
    padding_zero = [bool(not layer.lora_B["h"][real:].any() and not layer.lora_B["h"].grad[real:].any()),
                    bool(layer.lora_B["h"].grad[:real].abs().sum() > 0)]

    gen = torch.Generator().manual_seed(9)
    hidden = torch.randn(5, 2, 64, generator=gen)
    shared = model.gpt.embedding.word_embeddings.weight if tied else None
    with torch.no_grad():
        part, _ = layer(hidden, weight=shared)
        full, _ = layer(hidden, weight=shared, runtime_gather_output=True)
        report[f"{tag}_gather_diff"] = float((full - gather_from_tensor_model_parallel_region(part)).abs().max())
    report[f"{tag}_gathered_width"] = int(full.shape[-1])

    model.clip_grad_and_step(1.0)
    padding_zero.append(bool(not layer.lora_B["h"][real:].any()))
    report[f"{tag}_padding_zero"] = padding_zero


def returned_dp_loss(qwen2: Path, mesh: DeviceMesh, report: dict) -> None:
    """DP=2, each rank on its half of the rows: the loss forward_backward returns (eager, and through the schedule
    the CUDA path runs)."""
    from contextlib import nullcontext

    half = rows(train_batches()[0], mesh.coords(dist.get_rank())["dp"], 2)
    for path in ("eager", "scheduled"):
        model = MegatronModel(model_id=str(qwen2), device_mesh=mesh, mixed_precision="no")
        model.set_optimizer("default", lr=1e-3)
        with scheduled_on_cpu() if path == "scheduled" else nullcontext():
            report[f"dp2_{path}_returned_loss"] = float(model.forward_backward(inputs=half))


def context_parallel_token_counts(report: dict) -> None:
    """CP=2 process groups: the CPU driver sums gradients and token counts over data x context parallel ranks."""
    from twinkle_megatron.model.drivers import TorchDriver

    state.destroy()
    state.initialize(ParallelSizes(cp=2), "cpu")
    rank = dist.get_rank()
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.full((3,), float(rank + 1))  # loss sums of this rank's tokens
    driver = TorchDriver(torch.optim.SGD([param], lr=1.0), [("w", param)], _Config())
    driver.finalize(torch.tensor(2 + 4 * rank))  # this rank's share of the tokens: 2 and 6
    report["cp_grad_after_finalize"] = param.grad.tolist()


class _Config:
    sequence_parallel = False
    qk_layernorm = False


def main() -> None:
    qwen2, qwen3, adapter, large, out, tied, lm_head, lm_head_tied = (Path(p) for p in sys.argv[1:9])
    mesh = DeviceMesh.from_sizes(tp_size=2)
    runtime = twinkle.initialize(global_device_mesh=mesh, seed=0)
    rank, report = runtime.rank, {}

    layout_checks(qwen2, qwen3, adapter, mesh, out, report)
    training(qwen2, qwen3, mesh, out, "tp2", report)
    vocab_parallel_loss(large, mesh, report)
    lm_head_lora(qwen2, lm_head, False, mesh, out, report)
    lm_head_lora(tied, lm_head_tied, True, mesh, out, report)

    dp_mesh = DeviceMesh.from_sizes(dp_size=2)
    state.destroy()
    state.initialize(parallel_sizes(dp_mesh), "cpu")
    report["groups_dp2"] = groups(2)
    report["mesh_dp_group"] = dp_mesh.group_ranks("dp", rank)
    training(qwen2, qwen3, dp_mesh, out, "dp2", report)
    returned_dp_loss(qwen2, dp_mesh, report)
    context_parallel_token_counts(report)

    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
