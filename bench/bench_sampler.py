"""TorchSampler.sample vs plain ``PeftModel.generate`` on the same batch, side by side in one process.

Not a test: prints one JSON document. Both generate on the same LoRA-wrapped model (the embedded
tiny Qwen or a ~20M Qwen2-shaped model built from a config), the same left-padded batch (every
prompt repeated ``n`` times), the same sampling settings and seed, and the same number of new
tokens (no early stop), so the difference is what the sampler adds: routing the adapter, the
per-token log-probabilities and building the results. The two are interleaved over ``--rounds``
rounds and the medians compared (``ratio``, wall time; ``cpu_ratio``, this process's CPU time, which
other processes on a shared machine disturb far less; ``ratio_of_fastest``, the fastest call of each).
The sampled tokens are compared with generate's and their logprobs with one plain forward of every
(prompt + completion) sequence.

    python bench/bench_sampler.py                        # tiny, 8 prompts x n=4, 32 new tokens
    python bench/bench_sampler.py --config qwen20m --rounds 10

Target (issue #25): ``ratio`` = sampler / generate <= 1.03.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    "qwen20m": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                    num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=2048),
}


def build(config_name: str) -> Any:
    import torch
    from peft import LoraConfig

    from twinkle.model import TransformersModel

    torch.manual_seed(0)
    if config_name == "tiny":
        model = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")
    else:
        from transformers import Qwen2Config

        model = TransformersModel(config=Qwen2Config(**CONFIGS[config_name]), mixed_precision="no")
    model.add_adapter_to_model("policy", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                    init_lora_weights=False))
    return model


def prompts(count: int, vocab: int, seed: int = 1) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 25, (count,), generator=gen).tolist()
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", choices=["tiny", *CONFIGS])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from transformers import GenerationConfig

    from twinkle.sampler import SamplingParams
    from twinkle_hf.sampler import TorchSampler

    torch.set_num_threads(args.threads)
    model = build(args.config)
    peft_model = model.model
    vocab = peft_model.get_input_embeddings().num_embeddings
    batch = prompts(args.prompts, vocab)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, n=args.n, seed=0, stop=[])
    sampler = TorchSampler(model)

    rows = [p for p in batch for _ in range(args.n)]
    width = max(map(len, rows))
    pad = 0
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    plain_config = GenerationConfig(max_new_tokens=args.max_tokens, do_sample=True, temperature=1.0, top_p=1.0,
                                    top_k=0, pad_token_id=pad, eos_token_id=None)
    peft_model.generation_config = GenerationConfig()
    peft_model.eval()

    def plain() -> Any:
        torch.manual_seed(0)
        with torch.no_grad():
            return peft_model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                       generation_config=plain_config)

    def twinkle() -> Any:
        return sampler.sample(batch, params, adapter_name="policy")

    for fn in (plain, twinkle, plain, twinkle):  # warm-up
        fn()
    times: dict[str, list[float]] = {"generate": [], "sampler": []}
    cpu: dict[str, list[float]] = {"generate": [], "sampler": []}
    for _ in range(args.rounds):
        for name, fn in (("generate", plain), ("sampler", twinkle)):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)

    # the sampled tokens equal plain generate's (same seed, same processing) and their logprobs a full forward's
    results = twinkle()
    sampled = [r.prompt + s.tokens for r in results for s in r.sequences]
    same_tokens = plain()[:, width:].tolist() == [s.tokens for r in results for s in r.sequences]
    worst = 0.0
    with torch.no_grad():
        for sequence, (result, seq) in zip(sampled, [(r, s) for r in results for s in r.sequences]):
            logits = peft_model(input_ids=torch.tensor([sequence])).logits[0].double()
            full = torch.log_softmax(logits, -1)[torch.arange(len(sequence) - 1), torch.tensor(sequence[1:])]
            got = torch.tensor(seq.logprobs, dtype=torch.float64)
            worst = max(worst, float((got - full[len(result.prompt) - 1:]).abs().max()))
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "config": args.config, "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
        "rounds": args.rounds, "threads": args.threads,
        "generate_ms": round(medians["generate"] * 1e3, 2), "sampler_ms": round(medians["sampler"] * 1e3, 2),
        "ratio": round(medians["sampler"] / medians["generate"], 4),
        "ratio_of_fastest": round(min(times["sampler"]) / min(times["generate"]), 4),
        "generate_cpu_ms": round(statistics.median(cpu["generate"]) * 1e3, 2),
        "sampler_cpu_ms": round(statistics.median(cpu["sampler"]) * 1e3, 2),
        "cpu_ratio": round(statistics.median(cpu["sampler"]) / statistics.median(cpu["generate"]), 4),
        "same_tokens_as_generate": same_tokens, "max_logprob_error_vs_full_forward": worst,
    }, indent=2))


if __name__ == "__main__":
    main()
