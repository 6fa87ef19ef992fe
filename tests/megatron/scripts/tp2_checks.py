"""Run under ``torchrun --nproc_per_node=2`` (gloo): every TP=2 check in one launch; each rank writes rank<N>.json.

argv: <qwen2 dir> <qwen3 dir> <peft adapter dir (on qwen2)> <output dir>
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceMesh  # noqa: E402
from twinkle.model import MegatronModel  # noqa: E402
from twinkle_megatron.errors import MegatronConfigError  # noqa: E402


def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 125, (3, 10), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def max_diff(ours: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> float:
    return float((ours[mask.bool()] - ref[mask.bool()]).abs().max())


def hf_logits(model: torch.nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits


def groups(world: int) -> dict[str, list[int]]:
    from megatron.core import parallel_state as ps

    return {"tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
            "dp": dist.get_process_group_ranks(ps.get_data_parallel_group())}


def main() -> None:
    qwen2, qwen3, adapter, out = (Path(p) for p in sys.argv[1:5])
    mesh = DeviceMesh.from_sizes(tp_size=2)
    runtime = twinkle.initialize(global_device_mesh=mesh, seed=0)
    rank, report = runtime.rank, {}
    b = batch()

    model = MegatronModel(model_id=str(qwen2), device_mesh=mesh, mixed_precision="no")
    report["tp_rank"] = model.ranks.tp
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

    try:
        model.set_optimizer("default", lr=1e-3)
        report["cpu_training_refused"] = False
    except MegatronConfigError as exc:
        report["cpu_training_refused"] = "trains on one process only" in str(exc)

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

    from twinkle_megatron.parallel import state
    from twinkle_megatron.parallel.mesh import parallel_sizes

    dp_mesh = DeviceMesh.from_sizes(dp_size=2)
    state.destroy()
    state.initialize(parallel_sizes(dp_mesh), "cpu")
    report["groups_dp2"] = groups(2)
    report["mesh_dp_group"] = dp_mesh.group_ranks("dp", rank)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
