"""DPO with LoRA on CPU: a synthetic preference set, the sigmoid DPO loss, margin and accuracy per step.

Every pair answers the same question twice: the chosen answer is made of friendly words, the
rejected one of curt words (made in code below, with held-out pairs for evaluation). The reference
policy is the base model under the adapter, switched off by the model itself (no second copy):

    ./dev run cookbook/dpo.py       # or python cookbook/dpo.py: held-out accuracy 0.00 -> 1.00, margin 0 -> 1.49

Each step prints the loss, the chosen-minus-rejected margin of the implicit rewards
``beta * (log pi - log ref)`` and the preference accuracy. ``--loss ipo|simpo|orpo`` trains the other
preference losses on the same data.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from peft import LoraConfig
from tqdm import tqdm

import twinkle
from twinkle import get_logger, known_warnings
from twinkle.model import TransformersModel
from twinkle.template import Template

logger = get_logger()
TINY_MODEL = "twinkle://tiny-qwen"  # random weights: the learning is all DPO's
QUESTIONS = ("Can you help me move?", "Will you join us?", "May I borrow a pen?", "Could you check this?",
             "Do you have a minute?", "Can we meet later?", "Would you read my draft?", "Can I ask something?")
FRIENDLY = ("sure", "gladly", "of course", "happy to help", "with pleasure", "absolutely", "thank you", "yes please")
CURT = ("no", "busy", "not now", "go away", "whatever", "leave me", "stop asking", "nope")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-id", default=TINY_MODEL)
    p.add_argument("--loss", default="dpo", choices=["dpo", "ipo", "simpo", "orpo"])
    p.add_argument("--beta", type=float, default=None, help="the loss's beta (default: the loss's own)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--pairs-per-step", type=int, default=8)
    p.add_argument("--eval-pairs", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results-json", default=None, help="also write the curves to this JSON file")
    return p.parse_args(argv)


def make_pair(rng: random.Random) -> dict:
    """One synthetic preference: a question, a friendly answer (chosen) and a curt one (rejected)."""
    def answer(words: tuple[str, ...]) -> str:
        return ", ".join(rng.sample(words, 2)) + "."

    return {"prompt": rng.choice(QUESTIONS), "chosen": answer(FRIENDLY), "rejected": answer(CURT)}


def encode(template: Template, pairs: list[dict]) -> list[dict]:
    """Consecutive (chosen, rejected) rows, the layout the preference losses read."""
    return [row for pair in pairs for row in template.encode_preference(pair)]


def margin_and_accuracy(model: TransformersModel) -> tuple[float, float]:
    """From the last loss's per-sequence implicit rewards: mean chosen-minus-rejected margin, share of pairs won."""
    rewards = torch.stack([sample["reward"] for sample in model.get_loss_outputs(adapter_name="policy")])
    margins = rewards[0::2] - rewards[1::2]
    return float(margins.mean()), float((margins > 0).float().mean())


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    known_warnings.silence(args.model_id)  # dependencies' notes that do not apply here (see the module)
    twinkle.initialize(seed=args.seed)
    # data: the tokenizer's chat template renders each pair; held-out pairs come from other seeds
    template = Template(args.model_id)
    held_out = encode(template, [make_pair(random.Random(10_000 + k)) for k in range(args.eval_pairs)])
    train_rng = random.Random(args.seed)
    # the policy: a LoRA adapter; the loss computes the reference itself with the adapter switched off
    model = TransformersModel(model_id=args.model_id, mixed_precision="no")
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear")
    model.add_adapter_to_model("policy", lora)
    model.set_optimizer("AdamW", lr=args.lr, adapter_name="policy")
    model.set_loss(args.loss, adapter_name="policy", **({} if args.beta is None else {"beta": args.beta}))

    def evaluate() -> tuple[float, float]:
        model.forward_only(inputs=held_out, adapter_name="policy")
        model.calculate_loss(adapter_name="policy")
        return margin_and_accuracy(model)

    history = {"margin": [], "accuracy": [], "eval": [evaluate()]}
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc=args.loss, dynamic_ncols=True)
    for _ in bar:
        rows = encode(template, [make_pair(train_rng) for _ in range(args.pairs_per_step)])
        loss = model.forward_backward(inputs=rows, adapter_name="policy")
        margin, accuracy = margin_and_accuracy(model)
        model.clip_grad_and_step(max_grad_norm=1.0, adapter_name="policy")
        history["margin"].append(margin)
        history["accuracy"].append(accuracy)
        bar.set_postfix(loss=f"{loss:.3f}", margin=f"{margin:.3f}", acc=f"{accuracy:.2f}")
    history["eval"].append(evaluate())
    history["seconds"] = time.perf_counter() - start
    (m0, a0), (m1, a1) = history["eval"]
    logger.info("held-out margin %.3f -> %.3f, accuracy %.2f -> %.2f (%d steps, %.0f s)", m0, m1, a0, a1, args.steps,
                history["seconds"])
    if args.results_json:
        Path(args.results_json).write_text(json.dumps(history))
    return history


if __name__ == "__main__":
    main()
