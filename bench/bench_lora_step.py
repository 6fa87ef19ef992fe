"""LoRA SFT step time and peak memory: twinkle TransformersModel vs a hand-written peft loop vs HF Trainer.

Not a test: prints one JSON document. Each (config, variant) runs in its own fresh process (so
peak memory is its own), variants are interleaved over ``--rounds`` rounds, and the median step
time over every measured step is reported. All variants train the same LoRA (same init, same
batch of random tokens, AdamW, clip at 1.0) on the same model built from a config.

    python bench/bench_lora_step.py                       # tiny + qwen20m, seq 512, batch 8
    python bench/bench_lora_step.py --configs tiny --steps 3 --rounds 1

Targets (issue #4): twinkle <= 1.03x the hand-written loop, faster than HF Trainer, and peak
memory <= 1.05x the loop. On CPU, memory is peak RSS above the process's RSS after imports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=2048),
    # ~20M parameters, Qwen2-shaped (GQA, SwiGLU, tied embeddings)
    "qwen20m": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                    num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True),
}
VARIANTS = ("twinkle", "peft_loop", "hf_trainer")
LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
LR = 1e-4


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------- worker
def _setup(config_name: str, seq: int, batch_size: int):
    import torch
    from transformers import Qwen2Config

    config = Qwen2Config(max_position_embeddings=max(seq, 512), **CONFIGS[config_name])
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    return config, batch


def _base_model(config):
    """The same random init TransformersModel(config=...) makes (seed 0, from_config, fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _run_twinkle(config, batch, steps: int, device: str, precision: str, losses: list[float]) -> list[float]:
    import torch
    from peft import LoraConfig

    from twinkle.model import TransformersModel

    torch.manual_seed(0)
    model = TransformersModel(config=config, mixed_precision=precision)
    torch.manual_seed(2)
    model.add_adapter_to_model("bench", LoraConfig(**LORA))
    model.set_optimizer("AdamW", lr=LR)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        losses.append(float(model.forward_backward(inputs=batch)))  # one read per step, as loss.item() below
        model.clip_grad_and_step(max_grad_norm=1.0)
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _run_peft_loop(config, batch, steps: int, device: str, precision: str, losses: list[float]) -> list[float]:
    import torch
    from peft import LoraConfig, get_peft_model
    from reference_loop import timed_steps

    model = _base_model(config)
    torch.manual_seed(2)
    model = get_peft_model(model.to(device), LoraConfig(**LORA)).train()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return timed_steps(model, batch, steps, device, dtype, LR, losses)


def _run_hf_trainer(config, batch, steps: int, device: str, precision: str, losses: list[float]) -> list[float]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model = _base_model(config)
    torch.manual_seed(2)
    model = get_peft_model(model, LoraConfig(**LORA))
    rows = [{k: v[i] for k, v in batch.items()} for i in range(batch["input_ids"].shape[0])]

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(rows) * steps

        def __getitem__(self, i: int) -> dict[str, Any]:
            return rows[i % len(rows)]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync(device)
            times.append(time.perf_counter() - self.start)

    args = TrainingArguments(output_dir="/tmp/twinkle-bench-trainer", per_device_train_batch_size=len(rows),
                             max_steps=steps, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                             max_grad_norm=1.0, logging_strategy="no", save_strategy="no", report_to=[],
                             use_cpu=device == "cpu", bf16=precision == "bf16", fp16=precision == "fp16",
                             dataloader_num_workers=0, disable_tqdm=True, optim="adamw_torch",
                             weight_decay=0.01, remove_unused_columns=False)
    Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Clock()]).train()
    return times


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def worker(variant: str, config_name: str, seq: int, batch_size: int, steps: int, warmup: int,
           precision: str) -> dict[str, Any]:
    import peft  # noqa: F401  same imports for every variant, so the RSS baselines match
    import torch
    import transformers  # noqa: F401
    from transformers import Trainer  # noqa: F401

    import twinkle.model  # noqa: F401

    device = "cuda" if torch.cuda.is_available() else "cpu"
    baseline = _rss_mb()
    config, batch = _setup(config_name, seq, batch_size)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    runner = {"twinkle": _run_twinkle, "peft_loop": _run_peft_loop, "hf_trainer": _run_hf_trainer}[variant]
    losses: list[float] = []
    times = runner(config, batch, steps + warmup, device, precision, losses)[warmup:]
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else _peak_rss_mb() - baseline
    return {"variant": variant, "config": config_name, "device": device, "step_times_s": times, "peak_mem_mb": peak,
            "losses": losses[:3]}


# ------------------------------------------------------------------------------- driver
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="tiny,qwen20m")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="measured steps per process")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions of every variant")
    parser.add_argument("--precision", default=None, help="no | bf16 | fp16 (default: no on CPU, bf16 on GPU)")
    parser.add_argument("--worker", nargs=2, metavar=("VARIANT", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    precision = args.precision
    if precision is None:
        import torch

        precision = "bf16" if torch.cuda.is_available() else "no"
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.seq, args.batch_size, args.steps, args.warmup,
                                precision)))
        return

    report: dict[str, Any] = {"seq": args.seq, "batch_size": args.batch_size, "precision": precision,
                              "lora": LORA, "configs": {}}
    for config_name in args.configs.split(","):
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                cmd = [sys.executable, __file__, "--worker", variant, config_name, "--seq", str(args.seq),
                       "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup",
                       str(args.warmup), "--precision", precision]
                out = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise SystemExit(f"{variant}/{config_name} failed:\n{out.stderr[-3000:]}")
                runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
        summary = {}
        for variant, results in runs.items():
            times = [t for r in results for t in r["step_times_s"]]
            summary[variant] = {"step_s_median": statistics.median(times), "step_s_min": min(times),
                                "peak_mem_mb": max(r["peak_mem_mb"] for r in results), "steps": len(times),
                                "first_losses": results[0]["losses"]}
        loop, trainer, ours = summary["peft_loop"], summary["hf_trainer"], summary["twinkle"]
        summary["device"] = runs["twinkle"][0]["device"]
        summary["ratios"] = {
            "twinkle_vs_loop_time": ours["step_s_median"] / loop["step_s_median"],
            "twinkle_vs_trainer_time": ours["step_s_median"] / trainer["step_s_median"],
            # the fastest step is the least disturbed by other load on a shared machine
            "twinkle_vs_loop_time_min": ours["step_s_min"] / loop["step_s_min"],
            "twinkle_vs_trainer_time_min": ours["step_s_min"] / trainer["step_s_min"],
            "twinkle_vs_loop_mem": ours["peak_mem_mb"] / max(loop["peak_mem_mb"], 1e-9),
        }
        report["configs"][config_name] = summary
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
