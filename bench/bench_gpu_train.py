"""Tokens/s and MFU on one GPU: twinkle TransformersModel vs a hand-written transformers+peft loop, bf16.

Not a test: prints a table and one JSON document (also written to ``--out``). Both variants train
the same model built from a config (default ``qwen2.5-0.5b``: 494M parameters, Qwen2.5-0.5B's shape)
on the same batch of random tokens, in the same process, one after the other, with the same
optimizer (AdamW), clipping (1.0) and precision. Modes: ``lora`` (r=16 on every linear layer;
the frozen base in bf16, adapters in fp32, autocast) and ``full`` (fp32 master weights, autocast).

MFU = achieved FLOP/s / the GPU's peak dense bf16 FLOP/s. FLOPs per token follow PaLM's appendix:
``6 N + 12 L H S`` for full training (N weights used in matmuls: all but the input embedding
table, the LM head counted; L layers, H hidden size, S sequence length; no causal-mask discount)
and ``4 N + 12 L H S`` for LoRA (frozen weights need no weight-gradient GEMM; the adapters' own
FLOPs are < 1% and ignored).

    python bench/bench_gpu_train.py                         # lora + full, seq 2048, batch 4
    python bench/bench_gpu_train.py --modes lora --steps 5
    python bench/bench_gpu_train.py --check                 # CPU: arguments, config, FLOP formula

Variants: ``twinkle`` (the defaults), ``twinkle_fast`` (``kernelize`` with the installed kernels, liger on
CUDA, and ``task='fused_lm_ce'``), ``hand_written``; ``--variants`` picks some.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024),
}
#: Peak dense bf16 TFLOP/s by a substring of ``torch.cuda.get_device_name()`` (vendor data sheets, SXM parts).
PEAK_BF16_TFLOPS = {"H200": 989.5, "H100": 989.5, "H800": 989.5, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
                    "L4": 121.0, "A10G": 125.0, "RTX 4090": 165.2, "RTX 3090": 71.0}
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
LR = 1e-5


def model_config(name: str, seq: int) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(max_position_embeddings=max(seq, 4096), **CONFIGS[name])


def flops_per_token(config: Any, seq: int, mode: str) -> tuple[int, float]:
    """(parameters, training FLOPs per token) for ``mode`` (see the module docstring).

    N counts the weights used in matmuls: every parameter but the input embedding table, plus the
    LM head's vocab x hidden matmul (the same table when tied).
    """
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # the meta context unties a tied head
    params = sum(p.numel() for p in model.parameters())
    matmul = params if config.tie_word_embeddings else params - model.get_input_embeddings().weight.numel()
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq
    return params, (6 if mode == "full" else 4) * matmul + attention


def peak_tflops(device_name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


def make_batch(config: Any, seq: int, batch_size: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


# ------------------------------------------------------------------------------------------- variants
def run_twinkle(config: Any, batch: dict[str, Any], mode: str, steps: int,
                fast: bool = False) -> tuple[list[float], list[float]]:
    """``fast``: the installed kernels through ``kernelize`` (liger on CUDA) and the fused linear cross entropy
    (``task='fused_lm_ce'``: the logits are never materialised)."""
    import torch
    from peft import LoraConfig

    from twinkle.kernel import kernelize
    from twinkle.model import TransformersModel

    torch.manual_seed(0)
    model = TransformersModel(config=config, mixed_precision="bf16", kernelize=False)  # the default is on CUDA
    if mode == "lora":
        torch.manual_seed(2)
        model.add_adapter_to_model("bench", LoraConfig(**LORA))
    if fast:
        kernelize(model)
    model.set_optimizer("AdamW", lr=LR)
    task = "fused_lm_ce" if fast else "causal_lm"
    times, losses = [], []
    for _ in range(steps):
        start = time.perf_counter()
        losses.append(model.forward_backward(inputs=batch, task=task))
        model.clip_grad_and_step(max_grad_norm=1.0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times, losses


def run_hand_written(config: Any, batch: dict[str, Any], mode: str, steps: int) -> tuple[list[float], list[float]]:
    """What an ML engineer writes by hand: the base in bf16 under LoRA (fp32 for full training), autocast."""
    import torch
    from peft import LoraConfig, get_peft_model
    from reference_loop import timed_steps
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if mode == "lora":
        model = model.to(torch.bfloat16)
        torch.manual_seed(2)
        model = get_peft_model(model, LoraConfig(**LORA))  # peft keeps the adapters in fp32
    losses: list[float] = []
    times = timed_steps(model.cuda().train(), batch, steps, "cuda", torch.bfloat16, LR, losses)
    return times, losses


VARIANTS = {"twinkle": run_twinkle, "twinkle_fast": functools.partial(run_twinkle, fast=True),
            "hand_written": run_hand_written}


def measure(variant: str, config: Any, batch: dict[str, Any], mode: str, steps: int, warmup: int,
            flops: float, peak: float | None) -> dict[str, Any]:
    import gc

    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    times, losses = VARIANTS[variant](config, batch, mode, steps + warmup)
    step_s = statistics.median(times[warmup:])
    tokens = batch["input_ids"].numel()
    achieved = flops * tokens / step_s
    result = {"variant": variant, "mode": mode, "step_s": step_s, "tokens_per_s": tokens / step_s,
              "tflops": achieved / 1e12, "mfu": achieved / (peak * 1e12) if peak else None,
              "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "first_losses": losses[:3]}
    gc.collect()
    return result


# ------------------------------------------------------------------------------------------- driver
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="qwen2.5-0.5b", choices=sorted(CONFIGS))
    parser.add_argument("--modes", default="lora,full", help="comma-separated: lora, full")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: table)")
    parser.add_argument("--out", default="bench_gpu_train.json", help="where the JSON is written")
    parser.add_argument("--variants", default="twinkle,twinkle_fast,hand_written",
                        help=f"comma-separated, of {', '.join(VARIANTS)} (twinkle_fast: kernelize + fused linear CE)")
    parser.add_argument("--check", action="store_true", help="check arguments, config and FLOP formula (no GPU)")
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.variants or set(args.variants) - set(VARIANTS):
        parser.error(f"--variants takes {', '.join(VARIANTS)}, got {','.join(args.variants)!r}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - {"lora", "full"})
    if unknown or not modes:
        parser.error(f"--modes takes lora and/or full, got {args.modes!r}")
    args.modes = modes
    return args


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'mode':<5} {'variant':<13} {'step s':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9}"]
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(f"{r['mode']:<5} {r['variant']:<13} {r['step_s']:>8.3f} {r['tokens_per_s']:>10.0f} "
                     f"{r['tflops']:>8.1f} {mfu:>6} {r['peak_mem_gib']:>9.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = model_config(args.config, args.seq)
    formula = {mode: flops_per_token(config, args.seq, mode) for mode in args.modes}
    params = next(iter(formula.values()))[0]
    if args.check:
        import peft  # noqa: F401

        import twinkle.model  # noqa: F401

        print(json.dumps({"check": "ok", "config": args.config, "params": params, "variants": args.variants,
                          "flops_per_token": {m: f for m, (_, f) in formula.items()}}))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu_train.py needs a CUDA GPU (use --check on CPU).", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0)
    peak = peak_tflops(device, args.peak_tflops)
    batch = make_batch(config, args.seq, args.batch_size)
    rows = []
    for mode in args.modes:
        for variant in args.variants:
            rows.append(measure(variant, config, batch, mode, args.steps, args.warmup, formula[mode][1], peak))
    for mode in args.modes:
        ref = next((r for r in rows if r["mode"] == mode and r["variant"] == "hand_written"), None)
        for mine in (r for r in rows if r["mode"] == mode and r["variant"] != "hand_written" and ref):
            mine["speed_vs_hand_written"] = ref["step_s"] / mine["step_s"]
            mine["memory_vs_hand_written"] = mine["peak_mem_gib"] / ref["peak_mem_gib"]
    report = {"device": device, "peak_bf16_tflops": peak, "config": args.config, "params": params,
              "seq": args.seq, "batch_size": args.batch_size, "tokens_per_step": args.seq * args.batch_size,
              "torch": torch.__version__, "rows": rows}
    print(table(rows))
    text = json.dumps(report, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
