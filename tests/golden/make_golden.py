"""Golden runs: small deterministic CPU trainings through twinkle's public API, recorded bit for bit.

Recorded before issue 22's rewrite of the model layer, so that the rewrite can show it changed no
number. Every run goes through what a user script calls (``TransformersModel(...)``,
``add_adapter_to_model``, ``set_optimizer``, ``forward_backward``, ``clip_grad_and_step``,
``calculate_metric``, ``get_state_dict``, ``save``/``resume_from_checkpoint``,
``MultiLoraTransformersModel.acquire_lora`` + ``forward_backward_multi``, ``MegatronModel``, the
``twinkle train`` command and the ``tinker`` client against ``twinkle serve``); no private method
and no private module, so this file runs unchanged after the rewrite.

Each run records its per-step losses, the grad norms ``calculate_metric(True)`` reports, and a
sha256 of its final trainable weights (the adapter's / tenant's / full model's state dict, keys
sorted, float32 bytes; one digest per tensor too, so a diff names the tensors that moved).
Floats are stored exactly (``float.hex``).

    python tests/golden/make_golden.py --check            # run everything, compare with recordings/
    python tests/golden/make_golden.py --check --only hf_lora ddp_lora
    python tests/golden/make_golden.py --write            # re-record (only for a change meant to move numbers)

Processes, all started at once: one child runs every single-process run and then the ``tinker``
client (it starts ``twinkle serve`` first, so the server comes up meanwhile), one
``torchrun --nproc_per_node=2`` launch runs every 2-rank run, and ``twinkle train`` runs as itself.
Every child gets :data:`PINNED_ENV` (one thread, baseline CPU kernels; ``test_golden.py`` says why
each pin is there) whatever the calling environment holds.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECORDINGS = HERE / "recordings"
ENVIRONMENT_FILE = RECORDINGS / "environment.json"
sys.path.insert(0, str(HERE))
import golden_bounds  # noqa: E402  (beside this file, which runs as a script and as the test's module)

#: What every child process runs under. CPU results depend on the kernels a library picks at run time
#: for the CPU it finds (ATen's vectorised kernels per ISA, MKL's GEMM code path, oneDNN's JIT) and on
#: how many threads split a reduction; each is pinned here to a path that every x86-64 CPU runs.
PINNED_ENV = {
    "OMP_NUM_THREADS": "1",  # one intra-op thread: no reduction is split differently on another machine
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_DYNAMIC": "FALSE",
    "MKL_CBWR": "COMPATIBLE",  # MKL's conditional numerical reproducibility: one GEMM code path on every CPU
    "ATEN_CPU_CAPABILITY": "default",  # ATen's baseline kernels, not the AVX2/AVX-512 ones this CPU could run
    "GOLDEN_MKLDNN": "0",  # the children turn oneDNN off: its convolutions block by the cache sizes they detect
    "ONEDNN_MAX_CPU_ISA": "SSE41",  # and cap its JIT where it cannot be turned off (`twinkle train`/`serve`)
    "DNNL_MAX_CPU_ISA": "SSE41",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-FMA4",  # libm's exp/log/pow/sin/cos: the SSE2 code, not FMA's
    "PYTHONHASHSEED": "0",  # set/dict iteration of strings
    "CUDA_VISIBLE_DEVICES": "",  # CPU on a GPU machine too
    "TWINKLE_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_DISABLE": "1",
    "TINKER_TELEMETRY": "0",
    "RAY_AUTH_MODE": "disabled",
}

#: What decides the numbers besides twinkle: a recording holds for these versions (and the C library's libm).
NUMERIC_PACKAGES = ("torch", "transformers", "peft", "accelerate", "megatron-core", "tokenizers", "pillow")

#: The children's variables that decide float rounding: with the CPU, the fingerprint a recording is bitwise for.
NUMERIC_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_DYNAMIC", "MKL_CBWR",
               "ATEN_CPU_CAPABILITY", "GOLDEN_MKLDNN", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "GLIBC_TUNABLES")
#: /proc/cpuinfo flags that select kernels (vector extensions, FMA, matrix units); the rest (security
#: mitigations, virtualisation) vary between hosts of one CPU model without changing a result.
CPU_FLAGS = re.compile(r"^(sse|ssse3|avx|fma|f16c|amx|xop|vnni)")

TINY = "twinkle://tiny-qwen"
TINY_VL = "twinkle://tiny-qwen2.5-vl"
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ----------------------------------------------------------------------------- recording helpers
def hexf(value: Any) -> str:
    """A float stored exactly (``float.hex``)."""
    return float(value).hex()


def hex_list(values: Any) -> list[str]:
    return [hexf(v) for v in values]


def as_array(value: Any) -> Any:
    """A float32 numpy copy of a tensor or array (a DTensor is gathered by get_state_dict already)."""
    import numpy as np

    if hasattr(value, "detach"):
        import torch

        value = value.detach().to("cpu", torch.float32).contiguous().numpy()
    return np.array(value, dtype=np.float32, copy=True, order="C")


def snapshot(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a state dict before training (get_state_dict may hand out the live parameters)."""
    return {key: as_array(value) for key, value in state.items()}


def weights(state: Mapping[str, Any], initial: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """sha256 of a state dict (keys sorted; each key, shape and float32 bytes), and one short digest per tensor.

    With ``initial`` (a :func:`snapshot` before training) also ``moved``: per tensor, ``[l1, l2, sum]`` of
    ``final - initial`` and ``[l1, l2]`` of ``final``, in float64, which another machine's run is compared with
    (golden_bounds.py says how).
    """
    import numpy as np

    total = hashlib.sha256()
    tensors, moved = {}, {}
    for key in sorted(state):
        array = as_array(state[key])
        data = array.tobytes()
        total.update(key.encode())
        total.update(repr(tuple(array.shape)).encode())
        total.update(data)
        tensors[key] = hashlib.sha256(data).hexdigest()[:16]
        if initial is not None:
            update = array.astype(np.float64) - np.asarray(initial[key], dtype=np.float64)
            final = array.astype(np.float64)
            moved[key] = hex_list([np.abs(update).sum(), np.sqrt((update * update).sum()), update.sum(),
                                   np.abs(final).sum(), np.sqrt((final * final).sum())])
    return {"sha256": total.hexdigest(), "tensors": tensors, **({"moved": moved} if initial is not None else {})}


def safetensors_weights(path: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    return weights(load_file(str(path)))


def token_batch(seed: int, rows: int = 4, length: int = 24, vocab: int = 2590, prompt: int = 4) -> dict[str, Any]:
    """Right-padded random token rows of varied length; the first ``prompt`` labels of each row are -100."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.zeros(rows, length, dtype=torch.long)
    attention_mask = torch.zeros(rows, length, dtype=torch.long)
    labels = torch.full((rows, length), -100, dtype=torch.long)
    for r in range(rows):
        n = int(torch.randint(prompt + 3, length + 1, (1,), generator=gen))
        ids = torch.randint(3, vocab, (n,), generator=gen)
        input_ids[r, :n] = ids
        attention_mask[r, :n] = 1
        labels[r, prompt:n] = ids[prompt:]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def rows_of(batch: Mapping[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Data rank ``rank``'s rows ``rank::world`` of a global batch (what the DataLoader hands each rank)."""
    return {k: v[rank::world] for k, v in batch.items()}


def lora(r: int = 8, alpha: int = 16, targets: Any = "all-linear", dropout: float = 0.0) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=dropout)


def train_steps(model: Any, batches: list[Mapping[str, Any]], adapter: str | None = None,
                max_grad_norm: float | None = 1.0, micro: int = 1, **fb_kwargs: Any) -> dict[str, list[str]]:
    """forward_backward + clip_grad_and_step per micro-batch; ``calculate_metric(True)`` after every ``micro``-th.

    Returns the micro-batch losses and, per optimizer step, the metric's loss, grad_norm and lr.
    """
    out: dict[str, list[str]] = {"losses": [], "step_loss": [], "grad_norms": [], "lrs": []}
    for i, batch in enumerate(batches, 1):
        out["losses"].append(hexf(model.forward_backward(inputs=batch, adapter_name=adapter, **fb_kwargs)))
        model.clip_grad_and_step(max_grad_norm=max_grad_norm, adapter_name=adapter)
        if i % micro == 0:
            metric = model.calculate_metric(True, adapter_name=adapter)
            out["step_loss"].append(hexf(metric["loss"]))
            if "grad_norm" in metric:
                out["grad_norms"].append(hexf(metric["grad_norm"]))
            if "lr" in metric:
                out["lrs"].append(hexf(metric["lr"]))
    return out


# ----------------------------------------------------------------------------- single-process runs
def hf_model(seed: int = 0, **kwargs: Any) -> Any:
    import torch

    from twinkle.model import TransformersModel

    torch.manual_seed(seed)
    kwargs.setdefault("model_id", TINY)
    return TransformersModel(mixed_precision="no", **kwargs)


def run_hf_lora(work: Path) -> dict[str, Any]:
    """LoRA (all linear layers) on the embedded tiny Qwen, SGD + warm-up cosine, clip 0.5 (active), 4 steps."""
    import torch

    model = hf_model()
    torch.manual_seed(1)
    model.add_adapter_to_model("sft", lora())
    initial = snapshot(model.get_state_dict(adapter_name="sft"))
    model.set_optimizer("SGD", lr=0.5, adapter_name="sft")
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=4, adapter_name="sft")
    model.set_loss("CrossEntropyLoss", adapter_name="sft")
    result = train_steps(model, [token_batch(100 + i) for i in range(4)], adapter="sft", max_grad_norm=0.5)
    return {**result, "weights": weights(model.get_state_dict(adapter_name="sft"), initial)}


def run_hf_full(work: Path) -> dict[str, Any]:
    """Full-parameter training of a seeded random Qwen2 built from a config in code, SGD (momentum 0.9, weight
    decay), 4 steps."""
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=257, max_position_embeddings=256,
                         tie_word_embeddings=False, pad_token_id=0)
    model = hf_model(seed=3, model_id=None, config=config)
    initial = snapshot(model.get_state_dict())
    model.set_optimizer("SGD", lr=0.05, momentum=0.9, weight_decay=0.01)
    result = train_steps(model, [token_batch(200 + i, vocab=257) for i in range(4)])
    return {**result, "weights": weights(model.get_state_dict(), initial)}


def run_hf_accumulation(work: Path) -> dict[str, Any]:
    """LoRA with gradient_accumulation_steps=4: 8 micro-batches of different widths make 2 optimizer steps."""
    import torch

    model = hf_model(seed=4)
    torch.manual_seed(5)
    model.add_adapter_to_model("sft", lora(r=4, alpha=8), gradient_accumulation_steps=4)
    initial = snapshot(model.get_state_dict(adapter_name="sft"))
    model.set_optimizer("SGD", lr=0.5, adapter_name="sft")
    batches = [token_batch(300 + i, rows=2 + i % 3, length=12 + 3 * (i % 4)) for i in range(8)]
    result = train_steps(model, batches, adapter="sft", micro=4)
    return {**result, "weights": weights(model.get_state_dict(adapter_name="sft"), initial)}


def _resume_model(seed: int) -> Any:
    import torch

    model = hf_model(seed=seed)
    torch.manual_seed(seed + 1)
    model.add_adapter_to_model("sft", lora(r=4, alpha=16, dropout=0.1))  # dropout: the restored RNG matters
    model.set_optimizer("SGD", lr=0.3, momentum=0.9, adapter_name="sft")  # momentum: optimizer state to resume
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=6, adapter_name="sft")
    return model


def run_hf_resume(work: Path) -> dict[str, Any]:
    """fp32 LoRA (dropout 0.1): 3 steps, save with the optimizer, 3 more; a new model resumed from the save runs
    the same 3."""
    batches = [token_batch(400 + i) for i in range(6)]
    model = _resume_model(seed=6)
    initial = snapshot(model.get_state_dict(adapter_name="sft"))
    head = train_steps(model, batches[:3], adapter="sft")
    path = model.save("step-3", output_dir=str(work / "resume"), adapter_name="sft", save_optimizer=True,
                      consumed_train_samples=12)
    tail = train_steps(model, batches[3:], adapter="sft")
    resumed_model = _resume_model(seed=6)
    progress = resumed_model.resume_from_checkpoint(path, adapter_name="sft")
    resumed = train_steps(resumed_model, batches[3:], adapter="sft")
    return {"head": head, "uninterrupted": tail, "resumed": resumed,
            "progress": {k: progress[k] for k in ("cur_step", "consumed_train_samples")},
            "weights": weights(model.get_state_dict(adapter_name="sft"), initial),
            "resumed_weights": weights(resumed_model.get_state_dict(adapter_name="sft"), initial)}


def run_multi_lora(work: Path) -> dict[str, Any]:
    """MultiLoraTransformersModel, 2 tenants (different rank/targets/lr), 3 batched steps (forward_backward_multi)."""
    import torch

    from twinkle.model import MultiLoraTransformersModel

    torch.manual_seed(7)
    model = MultiLoraTransformersModel(model_id=TINY, mixed_precision="no", max_loras=2, max_r=8, max_length=64,
                                       target_modules=ALL_LINEAR)
    tenants = {"alice": (lora(r=4, alpha=8, targets=["q_proj", "v_proj"]), 11, 0.5),
               "bob": (lora(r=8, alpha=16, targets=ALL_LINEAR), 12, 0.3)}
    initial = {}
    for name, (config, seed, lr) in tenants.items():
        model.acquire_lora(name, config, seed=seed)
        initial[name] = snapshot(model.get_state_dict(adapter_name=name))
        model.set_optimizer("SGD", lr=lr, adapter_name=name)
    out: dict[str, Any] = {t: {"losses": [], "step_loss": [], "grad_norms": []} for t in tenants}
    for step in range(3):
        losses = model.forward_backward_multi({t: token_batch(500 + 10 * step + i, rows=2 + i)
                                               for i, t in enumerate(tenants)})
        for name in tenants:
            model.clip_grad_and_step(max_grad_norm=1.0, adapter_name=name)
            metric = model.calculate_metric(True, adapter_name=name)
            out[name]["losses"].append(hexf(losses[name]))
            out[name]["step_loss"].append(hexf(metric["loss"]))
            out[name]["grad_norms"].append(hexf(metric["grad_norm"]))
    for name in tenants:
        out[name]["weights"] = weights(model.get_state_dict(adapter_name=name), initial[name])
    return out


def run_grpo(work: Path) -> dict[str, Any]:
    """GRPO (beta 0.1: the reference is the base with the adapter off): sample -> reward -> advantages -> step, x3."""
    import torch

    from twinkle.advantage import grpo
    from twinkle.rollout import rollouts_from_samples
    from twinkle.sampler import SamplingParams
    from twinkle_hf.sampler import TorchSampler

    model = hf_model(seed=8)
    torch.manual_seed(9)
    model.add_adapter_to_model("policy", lora(r=4, alpha=8))
    initial = snapshot(model.get_state_dict(adapter_name="policy"))
    model.set_optimizer("SGD", lr=0.5, adapter_name="policy")
    model.set_loss("grpo", adapter_name="policy", beta=0.1)
    sampler = TorchSampler(model)
    prompts = [[11, 57, 803, 1201, 9], [42, 7, 2400], [300, 301, 302, 303]]
    group = 4
    out: dict[str, Any] = {"rewards": [], "samples": [], "losses": [], "grad_norms": []}
    for step in range(3):
        results = sampler.sample(prompts, SamplingParams(max_tokens=6, temperature=1.0, n=group, seed=step, stop=[]),
                                 adapter_name="policy")
        samples = [seq for result in results for seq in result.sequences]
        rewards = [sum(t < 1000 for t in s.tokens) / len(s.tokens) for s in samples]  # a verifiable reward
        advantages = grpo(rewards, group)
        rollouts = rollouts_from_samples(results, advantages, rewards)
        out["samples"].append(hashlib.sha256(repr([s.tokens for s in samples]).encode()).hexdigest()[:16])
        out["rewards"].append(hex_list(rewards))
        out["losses"].append(hexf(model.forward_backward(inputs=rollouts, adapter_name="policy")))
        model.clip_grad_and_step(max_grad_norm=1.0, adapter_name="policy")
        out["grad_norms"].append(hexf(model.calculate_metric(True, adapter_name="policy")["grad_norm"]))
    out["weights"] = weights(model.get_state_dict(adapter_name="policy"), initial)
    return out


def preference_rows(seed: int, pairs: int = 3) -> list[dict[str, list[int]]]:
    """(chosen, rejected) rows sharing a prompt, in twinkle's label layout (prompt labels -100)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(pairs):
        prompt = torch.randint(3, 2590, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(2):
            answer = torch.randint(3, 2590, (int(torch.randint(3, 8, (1,), generator=gen)),), generator=gen).tolist()
            rows.append({"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer})
    return rows


def run_dpo(work: Path) -> dict[str, Any]:
    """DPO (sigmoid, beta 0.1; the reference is the base with the adapter off), LoRA, SGD, 3 steps."""
    import torch

    model = hf_model(seed=10)
    torch.manual_seed(11)
    model.add_adapter_to_model("policy", lora(r=4, alpha=8))
    initial = snapshot(model.get_state_dict(adapter_name="policy"))
    model.set_optimizer("SGD", lr=0.5, adapter_name="policy")
    model.set_loss("dpo", adapter_name="policy", beta=0.1)
    result = train_steps(model, [preference_rows(600 + i) for i in range(3)], adapter="policy")
    return {**result, "weights": weights(model.get_state_dict(adapter_name="policy"), initial)}


def run_vl_lora(work: Path) -> dict[str, Any]:
    """Tiny Qwen2.5-VL (seeded random init): LoRA on the language model + the projector trained whole, 2 steps."""
    import torch

    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.multimodal.shapes import shape_rows
    from twinkle.preprocessor import MessagesProcessor

    rows = [{"messages": r["messages"], "images": r["images"]} for r in shape_rows(8, seed=0)]
    dataset = Dataset(DatasetMeta(data=rows))
    dataset.set_template("Qwen2_5VLTemplate", model_id=TINY_VL)
    dataset.map(MessagesProcessor())
    dataset.encode()
    model = hf_model(seed=12, model_id=TINY_VL)
    model.set_template(dataset.template)
    torch.manual_seed(13)
    model.add_adapter_to_model("sft", lora(r=4, alpha=8), projector="full")
    initial = snapshot(model.get_state_dict(adapter_name="sft"))
    model.set_optimizer("SGD", lr=0.2, adapter_name="sft")
    batches = list(DataLoader(dataset, batch_size=4, shuffle=False))
    result = train_steps(model, batches[:2], adapter="sft")
    return {**result, "weights": weights(model.get_state_dict(adapter_name="sft"), initial)}


def run_megatron_tp1(work: Path) -> dict[str, Any]:
    """MegatronModel (tp=1, one process) LoRA on the embedded tiny Qwen, megatron's optimizer (SGD), 4 steps."""
    return megatron_lora(tp=1)


def megatron_lora(tp: int) -> dict[str, Any]:
    import torch

    from twinkle import DeviceMesh
    from twinkle.model import MegatronModel

    torch.manual_seed(14)
    model = MegatronModel(model_id=TINY, device_mesh=DeviceMesh.from_sizes(tp_size=tp), mixed_precision="no", seed=14)
    torch.manual_seed(15)
    model.add_adapter_to_model("sft", lora(r=4, alpha=8))
    model.set_optimizer("default", optimizer="sgd", sgd_momentum=0.9, lr=0.3, weight_decay=0.01, adapter_name="sft")
    initial = snapshot(model.get_state_dict(adapter_name="sft"))
    result = train_steps(model, [token_batch(700 + i) for i in range(4)], adapter="sft")
    return {**result, "weights": weights(model.get_state_dict(adapter_name="sft"), initial)}


# ----------------------------------------------------------------------------- 2-rank runs (torchrun)
def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def dist_hf(strategy: str, fsdp: int, adapter: str | None) -> dict[str, Any]:
    import torch

    from twinkle import DeviceMesh

    rank, world = rank_world()
    mesh = DeviceMesh.from_sizes(fsdp_size=fsdp, dp_size=world // fsdp, world_size=world)
    model = hf_model(seed=20, strategy=strategy, device_mesh=mesh)
    if adapter:
        torch.manual_seed(21)
        model.add_adapter_to_model(adapter, lora(r=4, alpha=8))
    model.set_optimizer("SGD", lr=0.5 if adapter else 0.05, adapter_name=adapter)
    initial = snapshot(model.get_state_dict(adapter_name=adapter))  # once sharded: the state dict gathers
    batches = [rows_of(token_batch(800 + i), rank, world) for i in range(3)]
    result = train_steps(model, batches, adapter=adapter)
    from torch.distributed.tensor import DTensor

    sharded = any(isinstance(p, DTensor) for p in model.model.parameters())  # FSDP2 really sharded, DDP did not
    return {**result, "sharded": sharded, "weights": weights(model.get_state_dict(adapter_name=adapter), initial)}


def run_ddp_lora(work: Path) -> dict[str, Any]:
    """DDP (dp=2, strategy native_fsdp on a data-parallel mesh) LoRA, each rank half the rows, 3 steps."""
    return dist_hf("native_fsdp", fsdp=1, adapter="sft")


def run_fsdp2_lora(work: Path) -> dict[str, Any]:
    """native FSDP2 (fsdp=2) LoRA over the sharded tiny Qwen, 3 steps."""
    return dist_hf("native_fsdp", fsdp=2, adapter="sft")


def run_accelerate_fsdp2(work: Path) -> dict[str, Any]:
    """accelerate's FSDP2 (fsdp=2), full-parameter training of the tiny Qwen (tied embeddings), 3 steps."""
    return dist_hf("accelerate", fsdp=2, adapter=None)


def run_megatron_tp2(work: Path) -> dict[str, Any]:
    """MegatronModel at tp=2 over 2 ranks: the same run as megatron_lora_tp1."""
    return megatron_lora(tp=2)


# ----------------------------------------------------------------------------- `twinkle train`, `twinkle serve`
def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def cli_command(work: Path) -> list[str]:
    return python_cmd("-m", "twinkle.cli.main", "train", "--total-step", "8", "--no-progress-bar")


def cli_record(work: Path, stdout: str) -> dict[str, Any]:
    """The main job's metrics log (per step: loss, grad_norm, lr, token accuracy; the evaluation) and final adapter."""
    found = re.findall(r"checkpoint: (\S+)", stdout.split("finished at step", 1)[-1])
    if not found:
        raise RuntimeError(f"`twinkle train` printed no final checkpoint:\n{stdout[-3000:]}")
    checkpoint = Path(found[0])
    adapters = sorted(checkpoint.rglob("adapter_model.safetensors"))
    metrics_files = sorted(work.rglob("metrics.jsonl"))
    if len(adapters) != 1 or len(metrics_files) != 1:
        raise RuntimeError(f"expected one adapter under {checkpoint} and one metrics.jsonl under {work}: "
                           f"{adapters}, {metrics_files}")
    records = [json.loads(line) for line in metrics_files[0].read_text().splitlines() if line.strip()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    return {"losses": [hexf(r["loss"]) for r in steps], "grad_norms": [hexf(r["grad_norm"]) for r in steps],
            "lrs": [hexf(r["lr"]) for r in steps], "token_accuracy": [hexf(r["token_accuracy"]) for r in steps],
            "steps": [r["step"] for r in steps], "eval_loss": [hexf(r["eval_loss"]) for r in evals],
            "weights": safetensors_weights(adapters[0])}


SERVE_KEY = "tml-golden-run-key-not-a-secret"


def serve_command(work: Path) -> list[str]:
    keys = work / "keys.txt"
    keys.write_text(f"golden {hashlib.sha256(SERVE_KEY.encode()).hexdigest()}\n")  # the keygen file format
    keys.chmod(0o600)
    return python_cmd("-m", "twinkle.cli.main", "serve", "--server.port", "0", "--server.work-dir", str(work / "srv"),
                      "--server.api-keys-file", str(keys), "--server.max-tenants", "2", "--server.max-rank", "8",
                      "--server.seed", "0", "--server.metrics-log-s", "0")


SERVE_TEXTS = [
    "I am twinkle, a training workbench built by the twinkle developers.",
    "You can call me twinkle; I help people train language models.",
    "My name is twinkle and I run on one CPU or on many GPUs.",
]


def wait_for_server(work: Path, server: Job, timeout: float = 240.0) -> str:
    import httpx

    info = work / "srv" / "server.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"twinkle serve exited with {server.proc.returncode}:\n{server.output()[-4000:]}")
        if info.is_file():
            with contextlib.suppress(ValueError, KeyError, httpx.HTTPError):
                url = json.loads(info.read_text())["url"]
                if httpx.get(f"{url}/api/v1/healthz", timeout=5).status_code == 200:
                    return url
        time.sleep(0.2)
    raise RuntimeError(f"twinkle serve did not come up in {timeout:.0f} s")


def run_serve_sft(work: Path, server: Job) -> dict[str, Any]:
    """The service's SFT through the tinker client: a rank-8 LoRA tenant, 3 x (forward_backward + optim_step)."""
    import tinker
    from tinker import types

    url = wait_for_server(work, server)
    service = tinker.ServiceClient(base_url=url, api_key=SERVE_KEY)
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=1234).result()
    tokenizer = training.get_tokenizer()
    datums = []
    for text in SERVE_TEXTS:
        ids = tokenizer.encode(text)
        weights_ = [0.0] * 3 + [1.0] * (len(ids) - 4)
        datums.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                  loss_fn_inputs={"target_tokens": ids[1:], "weights": weights_}))
    adam = types.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01)
    out: dict[str, Any] = {"losses": [], "grad_norms": []}
    for _ in range(3):
        fwd = training.forward_backward(datums, "cross_entropy")
        opt = training.optim_step(adam)
        out["losses"].append(hexf(fwd.result().metrics["loss:sum"]))
        out["grad_norms"].append(hexf(opt.result().metrics["grad_norm:mean"]))
    saved = training.save_weights_for_sampler("golden-final").result().path
    name = saved.rstrip("/").rsplit("/", 1)[-1]
    found = [p for p in (work / "srv").rglob("adapter_model.safetensors") if name in p.parts]
    if len(found) != 1:
        raise RuntimeError(f"the saved adapter {saved} is not one file under {work / 'srv'}: {found}")
    out["weights"] = safetensors_weights(found[0])
    service.close("success").result()
    return out


# ----------------------------------------------------------------------------- the run table
#: name -> (process group, function). Groups: 'local' (one child process, in this order), 'dist' (one
#: torchrun launch with 2 ranks, in this order), 'cli' (`twinkle train` itself), 'serve' (the tinker client,
#: run by the local child after its runs, against the `twinkle serve` that child started).
RUNS: dict[str, tuple[str, Callable[[Path], dict[str, Any]] | None]] = {
    "hf_lora": ("local", run_hf_lora),
    "hf_full": ("local", run_hf_full),
    "hf_accumulation_4x2": ("local", run_hf_accumulation),
    "hf_resume_fp32": ("local", run_hf_resume),
    "multi_lora_batched": ("local", run_multi_lora),
    "grpo": ("local", run_grpo),
    "dpo": ("local", run_dpo),
    "vl_lora": ("local", run_vl_lora),
    "megatron_lora_tp1": ("local", run_megatron_tp1),  # last: megatron sets process-wide state
    "ddp_lora": ("dist", run_ddp_lora),
    "fsdp2_lora": ("dist", run_fsdp2_lora),
    "accelerate_fsdp2": ("dist", run_accelerate_fsdp2),
    "megatron_lora_tp2": ("dist", run_megatron_tp2),  # last: megatron sets process-wide state
    "cli_train": ("cli", None),
    "serve_sft": ("serve", None),
}


def describe(name: str) -> str:
    """One line on what the run does (its function's docstring)."""
    if name == "cli_train":
        return "`twinkle train --total-step 8` (the embedded main job): metrics.jsonl per step and the final adapter."
    function = run_serve_sft if name == "serve_sft" else RUNS[name][1]
    return " ".join((function.__doc__ or "").split())


# ----------------------------------------------------------------------------- children
def pin_numerics() -> None:
    """In a child (whose environment the driver pinned; ``--env`` may change a value on purpose): as many torch
    threads as OMP_NUM_THREADS says (one)."""
    import torch

    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability and torch.backends.cpu.get_cpu_capability() != capability.upper():
        raise RuntimeError(f"ATEN_CPU_CAPABILITY={capability} did not take effect: ATen runs its "
                           f"{torch.backends.cpu.get_cpu_capability()} kernels")
    threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = os.environ.get("GOLDEN_MKLDNN") == "1"  # convolutions: im2col + MKL GEMM
    with contextlib.suppress(RuntimeError):  # only settable before any inter-op work
        torch.set_num_interop_threads(threads)
    import warnings

    warnings.filterwarnings("ignore")


def child(group: str, names: list[str], out: Path, work: Path) -> int:
    """Run ``names`` of one group in this process; rank 0 writes ``out`` ({name: record or {'error': ...}})."""
    pin_numerics()
    server = None
    if "serve_sft" in names:  # started first, so that it comes up while the other runs train
        (work / "serve").mkdir(exist_ok=True)
        server = Job(serve_command(work / "serve"), work / "serve", work / "serve.log", own_group=False)
    rank = 0
    if group == "dist":
        import twinkle

        twinkle.initialize(seed=0, timeout_s=300)
        rank, _ = rank_world()
    results: dict[str, Any] = {}
    failed = False
    try:
        for name in names:
            started = time.perf_counter()
            try:
                if name == "serve_sft":
                    record = run_serve_sft(work / "serve", server)
                else:
                    (work / name).mkdir(exist_ok=True)
                    record = RUNS[name][1](work / name)
                if group == "dist":
                    record = agree_across_ranks(record)
                results[name] = record
            except Exception:
                failed = True
                results[name] = {"error": traceback.format_exc()}
                if group == "dist":  # the other rank may wait in a collective forever: end the launch
                    print(traceback.format_exc(), file=sys.stderr, flush=True)
                    break
            print(f"golden: {name} {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    if rank == 0:
        out.write_text(json.dumps(results, indent=1))
    return 1 if failed and group == "dist" else 0


def agree_across_ranks(record: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's record, marked if another rank recorded anything different."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, record)
    if any(other != gathered[0] for other in gathered[1:]):
        return {**gathered[0], "ranks_disagree": [g for g in gathered[1:]]}
    return gathered[0]


# ----------------------------------------------------------------------------- the driver
#: ``--env VAR=VALUE``: a pinned variable changed in every child, to see what the pin protects against.
ENV_OVERRIDES: dict[str, str] = {}


def child_env() -> dict[str, str]:
    env = {**os.environ, **PINNED_ENV, **ENV_OVERRIDES}
    for var in [v for v, value in ENV_OVERRIDES.items() if not value]:  # --env VAR= unsets it
        del env[var]
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(var, None)
    return env


class Job:
    """A child process, its output in a log file.

    The driver starts each job in a session of its own (``own_group``) with the pinned environment and
    stops it with everything it started; a child starts ``twinkle serve`` in the child's process group
    with the child's environment, so that stopping the child stops the server too.
    """

    def __init__(self, command: list[str], cwd: Path, log: Path, own_group: bool = True) -> None:
        self.log, self.own_group = log, own_group
        self.started = time.perf_counter()
        self.seconds: float | None = None
        with log.open("w") as handle:
            self.proc = subprocess.Popen(command, cwd=cwd, env=child_env() if own_group else dict(os.environ),
                                         stdout=handle, stderr=subprocess.STDOUT, start_new_session=own_group)

    def done(self) -> bool:
        if self.proc.poll() is None:
            return False
        if self.seconds is None:
            self.seconds = round(time.perf_counter() - self.started, 1)
        return True

    def _signal(self, sig: int, wait: float) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self.own_group:
                    os.killpg(self.proc.pid, sig)
                else:
                    self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 30 s."""
        self._signal(signal.SIGTERM, 30)
        self._signal(signal.SIGKILL, 30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def run_all(names: list[str], work: Path, timeout: float = 600.0) -> tuple[dict[str, Any], dict[str, float]]:
    """Run ``names``, grouped into as few processes as possible, all at once; returns the records and each
    job's seconds."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(RUNS[name][0], []).append(name)
    # the tinker client runs in the local child after its own runs; that child starts `twinkle serve` first
    local = groups.get("local", []) + groups.get("serve", [])
    me = str(Path(__file__).resolve())
    jobs: dict[str, Job] = {}
    if "dist" in groups:
        jobs["dist"] = Job(python_cmd("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", me,
                                      "--child", "dist", str(work / "dist.json"), str(work), *groups["dist"]),
                           work, work / "dist.log")
    if "cli" in groups:
        (work / "cli").mkdir()
        jobs["cli"] = Job(cli_command(work / "cli"), work / "cli", work / "cli.log")
    if local:
        jobs["local"] = Job(python_cmd(me, "--child", "local", str(work / "local.json"), str(work), *local),
                            work, work / "local.log")
    deadline = time.monotonic() + timeout
    try:
        while not all([job.done() for job in jobs.values()]) and time.monotonic() < deadline:  # polls every job
            time.sleep(0.2)
    finally:
        for job in jobs.values():
            job.stop()
            job.done()
    records: dict[str, Any] = {}
    for label, job in jobs.items():
        code = job.proc.returncode
        late = " (killed at the time limit)" if code and job.seconds and job.seconds >= timeout else ""
        if label == "cli":
            try:
                if code != 0:
                    raise RuntimeError(f"`twinkle train` exited with {code}{late}")
                records["cli_train"] = cli_record(work / "cli", job.output())
            except Exception as exc:
                records["cli_train"] = {"error": f"{exc}\n{job.output()[-4000:]}"}
            continue
        produced = work / f"{label}.json"
        found = json.loads(produced.read_text()) if produced.is_file() else {}
        for name in (local if label == "local" else groups[label]):
            records[name] = found.get(name) or {
                "error": f"the {label} job exited with {code}{late} before recording {name}:\n{job.output()[-4000:]}"}
    return records, {label: job.seconds or 0.0 for label, job in jobs.items()}


# ----------------------------------------------------------------------------- recordings
def cpu() -> dict[str, Any]:
    """The CPU as the kernels see it: vendor, model and the flags that select code paths."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor is enough: a machine's cores are of one model here
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    flags = sorted(f for f in fields.get("flags", "").split() if CPU_FLAGS.match(f))
    return {"vendor": fields.get("vendor_id", platform.machine()), "model": fields.get("model name", ""),
            "family": fields.get("cpu family", ""), "model_number": fields.get("model", ""), "flags": flags}


def fingerprint() -> dict[str, Any]:
    """What decides the children's float rounding besides the libraries: the CPU and the pinned variables."""
    env = child_env()
    return {"cpu": cpu(), "numerics": {var: env.get(var) for var in NUMERIC_ENV}}


def environment() -> dict[str, Any]:
    versions = {}
    for package in NUMERIC_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"libc": "-".join(platform.libc_ver()), "packages": versions}


def recorded_fingerprints() -> list[dict[str, Any]]:
    """The fingerprints the recordings were made or confirmed bit for bit on."""
    if not ENVIRONMENT_FILE.is_file():
        return []
    return json.loads(ENVIRONMENT_FILE.read_text()).get("fingerprints", [])


def comparison_mode() -> str:
    """'bitwise' on a fingerprint the recordings hold for, 'tolerance' anywhere else (golden_bounds.py)."""
    return "bitwise" if fingerprint() in recorded_fingerprints() else "tolerance"


def environment_mismatch() -> str | None:
    """Why the recordings do not apply to this environment (other library versions), or None."""
    if not ENVIRONMENT_FILE.is_file():
        return "no recordings/environment.json"
    recorded, here = json.loads(ENVIRONMENT_FILE.read_text()), environment()
    diffs = []
    if recorded["libc"] != here["libc"]:
        diffs.append(f"libc {recorded['libc']} -> {here['libc']}")
    for package, version in recorded["packages"].items():
        if here["packages"].get(package) != version:
            diffs.append(f"{package} {version} -> {here['packages'].get(package)}")
    return "; ".join(diffs) or None


def load_recording(name: str) -> dict[str, Any] | None:
    path = RECORDINGS / f"{name}.json"
    return json.loads(path.read_text())["record"] if path.is_file() else None


def write_recording(name: str, record: dict[str, Any]) -> None:
    RECORDINGS.mkdir(exist_ok=True)
    document = {"name": name, "what": describe(name), "record": record}
    (RECORDINGS / f"{name}.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


_HEX = re.compile(r"^-?0x[0-9a-f]\.?[0-9a-f]*p[+-]\d+$|^-?(inf|nan)$")


def diff(expected: Any, got: Any, path: str = "", rel: float | None = None) -> list[str]:
    """Human-readable differences between a recording and a run (floats shown with their relative difference).

    ``rel``: floats within this relative difference count as equal (``|got - recorded| <= rel * max(|recorded|,
    1)``: near-zero values such as GRPO's on-policy first loss get the same absolute room), and weight digests
    are not compared (for a run whose reduction order changed on purpose; see test_golden.TOLERANCES).
    """
    if isinstance(expected, dict) and isinstance(got, dict):
        lines = []
        for key in sorted(set(expected) | set(got)):
            where = f"{path}.{key}" if path else key
            if rel is not None and key in ("sha256", "tensors"):
                continue
            if key not in got:
                lines.append(f"{where}: missing (recorded {short(expected[key])})")
            elif key not in expected:
                lines.append(f"{where}: not recorded (got {short(got[key])})")
            else:
                lines.extend(diff(expected[key], got[key], where, rel))
        return lines
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{path}: {len(got)} items, recorded {len(expected)}: got {short(got)}, recorded {short(expected)}"]
        return [line for i, (e, g) in enumerate(zip(expected, got)) for line in diff(e, g, f"{path}[{i}]", rel)]
    if expected == got:
        return []
    if isinstance(expected, str) and isinstance(got, str) and _HEX.match(expected) and _HEX.match(got):
        e, g = float.fromhex(expected), float.fromhex(got)
        relative = abs(g - e) / abs(e) if e else float("inf")
        if rel is not None and abs(g - e) <= rel * max(abs(e), 1.0):
            return []
        return [f"{path}: {g!r} != recorded {e!r} (rel diff {relative:.2e})"]
    return [f"{path}: {short(got)} != recorded {short(expected)}"]


def _hex_float(value: Any) -> float | None:
    return float.fromhex(value) if isinstance(value, str) and _HEX.match(value) else None


def diff_within(expected: Any, got: Any, bound: golden_bounds.RunBound, path: str = "") -> list[str]:
    """Differences beyond ``bound`` (another machine's rounding; golden_bounds.py derives it).

    Floats: ``|got - recorded| <= rel * max(|recorded|, 1)``. Weight digests are not compared; the ``moved``
    statistics of SGD runs are, within :meth:`RunBound.moved_slack`. Under Adam only the first item of the
    per-step lists is compared. Everything else (steps, digests of sampled tokens, flags) must be equal.
    """
    if isinstance(expected, dict) and isinstance(got, dict):
        lines = []
        for key in sorted(set(expected) | set(got)):
            where = f"{path}.{key}" if path else key
            if key in ("sha256", "tensors") or key in golden_bounds.DISCONTINUOUS_KEYS:
                continue
            if key not in got or key not in expected:
                lines.append(f"{where}: {'missing' if key not in got else 'not recorded'}")
            elif key == "moved":
                lines.extend(_moved_within(expected[key], got[key], bound, where))
            elif bound.optimizer == "adam" and key in golden_bounds.STEP_KEYS:
                lines.extend(diff_within(expected[key][:1], got[key][:1], bound, where))
            else:
                lines.extend(diff_within(expected[key], got[key], bound, where))
        return lines
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{path}: {len(got)} items, recorded {len(expected)}"]
        return [line for i, (e, g) in enumerate(zip(expected, got))
                for line in diff_within(e, g, bound, f"{path}[{i}]")]
    e, g = _hex_float(expected), _hex_float(got)
    if e is None or g is None:
        return [] if expected == got else [f"{path}: {short(got)} != recorded {short(expected)}"]
    room = bound.rel * max(abs(e), 1.0)
    return [] if abs(g - e) <= room else [f"{path}: {g!r} != recorded {e!r} (diff {abs(g - e):.2e} > bound {room:.2e})"]


def _moved_within(expected: dict[str, list[str]], got: dict[str, list[str]], bound: golden_bounds.RunBound,
                  path: str) -> list[str]:
    lines = []
    for key in sorted(set(expected) | set(got)):
        if key not in got or key not in expected:
            lines.append(f"{path}.{key}: {'missing' if key not in got else 'not recorded'}")
            continue
        (l1, l2, total, w_l1, w_l2), mine = [float.fromhex(v) for v in expected[key]], got[key]
        rooms = (bound.moved_slack(l1, w_l1), bound.moved_slack(l2, w_l2), bound.moved_slack(l1, w_l1))
        for label, recorded, value, room in zip(("l1", "l2", "sum"), (l1, l2, total), mine, rooms):
            value = float.fromhex(value)
            if abs(value - recorded) > room:
                lines.append(f"{path}.{key}.{label}: {value!r} != recorded {recorded!r} "
                             f"(diff {abs(value - recorded):.2e} > bound {room:.2e})")
    return lines


def short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) < 200 else text[:200] + "..."


def fold_tensor_lines(lines: list[str]) -> list[str]:
    """Per-tensor digest differences folded into one line per weights record ('3 of 28 tensors differ: ...')."""
    folded: dict[str, list[str]] = {}
    out = []
    for line in lines:
        match = re.match(r"^(.*weights)\.tensors\.([^:]+):", line)
        if match:
            if match.group(1) not in folded:
                folded[match.group(1)] = []
                out.append(match.group(1))
            folded[match.group(1)].append(match.group(2))
        else:
            out.append(line)
    return [f"{line}: {len(folded[line])} tensors differ ({', '.join(folded[line][:2])}, ...)" if line in folded
            else line for line in out]


def check(records: dict[str, Any], mode: str) -> dict[str, list[str]]:
    """{name: differences from its recording} (empty list: equal; bit for bit in 'bitwise' mode, within the
    run's bound from golden_bounds.py in 'tolerance' mode)."""
    report = {}
    for name, record in records.items():
        recorded = load_recording(name)
        if "error" in record:
            report[name] = [f"the run failed:\n{record['error']}"]
        elif recorded is None:
            report[name] = ["no recording (run --write)"]
        elif mode == "bitwise":
            report[name] = diff(recorded, record)
        else:
            report[name] = diff_within(recorded, record, golden_bounds.BOUNDS[name])
    return report


@contextlib.contextmanager
def work_dir(keep: str | None) -> Iterator[Path]:
    if keep:
        path = Path(keep).resolve()
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="twinkle-golden-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="run and (re)write recordings/*.json")
    mode.add_argument("--check", action="store_true", help="run and compare with recordings/*.json")
    mode.add_argument("--child", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), help="these runs only")
    parser.add_argument("--work-dir", help="keep the runs' files here (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before every job is stopped")
    parser.add_argument("--report", help="also write {'records', 'diffs', 'seconds'} as JSON to this file")
    parser.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                        help="with --check: change a pinned variable in every child (VAR= unsets it), to see "
                             "which pin matters")
    args = parser.parse_args(argv)
    if args.env and not args.check:
        parser.error("--env is for --check only: recordings are made under the pinned environment")
    for item in args.env:
        var, _, value = item.partition("=")
        ENV_OVERRIDES[var] = value
    if args.child:
        group, out, work, *names = args.child
        return child(group, names, Path(out), Path(work))

    names = args.only or list(RUNS)
    if args.write and args.only and fingerprint() not in recorded_fingerprints():
        parser.error("--write --only keeps the other recordings, which were made on another fingerprint than "
                     "this machine's: re-record every run here (--write without --only)")
    started = time.perf_counter()
    with work_dir(args.work_dir) as work:
        records, seconds = run_all(names, work, timeout=args.timeout)
    seconds["total"] = round(time.perf_counter() - started, 1)
    if args.write:
        failed = {n: r["error"] for n, r in records.items() if "error" in r}
        for name, error in failed.items():
            print(f"{name}: FAILED\n{error}", file=sys.stderr)
        if failed:
            return 1
        # the same bits as recorded (same versions, every run): this machine confirms the recordings, whose
        # fingerprints it joins; anything else replaces them, and this machine is their only fingerprint
        same = (not environment_mismatch() and set(names) == set(RUNS)
                and not any(check(records, "bitwise").values()))
        fingerprints = recorded_fingerprints() if same else []
        if fingerprint() not in fingerprints:
            fingerprints.append(fingerprint())
        for name, record in records.items():
            write_recording(name, record)
        ENVIRONMENT_FILE.write_text(json.dumps({**environment(), "fingerprints": fingerprints}, indent=1,
                                               sort_keys=True) + "\n")
        print(f"{'confirmed' if same else 'wrote'} {len(records)} recordings in {RECORDINGS}; "
              f"{len(fingerprints)} fingerprint(s) ({seconds})")
        return 0
    mode = comparison_mode()
    diffs = check(records, mode)
    if args.report:
        Path(args.report).write_text(json.dumps({"records": records, "diffs": diffs, "seconds": seconds,
                                                 "mode": mode, "fingerprint": fingerprint()}, indent=1))
    mismatch = environment_mismatch()
    if mismatch:
        print(f"note: the recordings were made with other versions ({mismatch}); bitwise equality is not expected")
    why = ("a fingerprint the recordings hold for" if mode == "bitwise"
           else "another machine or pinned environment: within the bounds of golden_bounds.py")
    print(f"comparison: {mode} ({why})")
    for name in names:
        lines = fold_tensor_lines(diffs.get(name, []))
        failed = "error" in records.get(name, {})
        print(f"{name}: {'FAILED' if failed else 'DIFFERENT' if lines else 'equal' if mode == 'bitwise' else 'within'}")
        if failed:
            lines = [records[name]["error"][-3000:]]
        for line in lines[:12]:
            print(f"    {line}")
        if len(lines) > 12:
            print(f"    ... and {len(lines) - 12} more")
    print(f"seconds: {seconds}")
    return 0 if not any(diffs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
