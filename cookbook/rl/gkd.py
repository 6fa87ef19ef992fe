"""GKD distillation on CPU: a teacher that knows a set of facts teaches them to a LoRA student.

The teacher is the tiny model with a LoRA adapter fine-tuned on synthetic question/answer facts; it
then runs forward-only. The student is the same base model with a fresh LoRA adapter, trained with ``GKDLoss`` on the
teacher's logits over the same conversations (off-policy distillation: the tokens come from the data,
not sampled from the student). The student's forward ``KL(teacher || student)`` on the answers falls:

    ./dev run cookbook/rl/gkd.py     # or python cookbook/rl/gkd.py: KL(T||S) falls several-fold

``--beta`` interpolates the divergence (0: forward KL, 1: reverse KL, between: the generalised
Jensen-Shannon divergence of GKD); ``--temperature`` softens both distributions.
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
from twinkle.loss import GKDLoss
from twinkle.model import TransformersModel
from twinkle.processor import InputProcessor
from twinkle.template import Template

logger = get_logger()
TINY_MODEL = "twinkle://tiny-qwen"  # random weights: what the student learns is all the teacher's
COUNTRIES = ("Aland", "Borovia", "Caldera", "Dunmore", "Elbonia", "Fenwick", "Grelland", "Hollis")
CITIES = ("Ash", "Brook", "Cedar", "Dale", "Elm", "Fern", "Glen", "Heath")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-id", default=TINY_MODEL)
    p.add_argument("--teacher-steps", type=int, default=30, help="SFT steps that make the teacher")
    p.add_argument("--steps", type=int, default=30, help="distillation steps")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results-json", default=None, help="also write the curves to this JSON file")
    return p.parse_args(argv)


def facts() -> list[dict]:
    """The conversations both models see: each country's capital, in one fixed wording."""
    return [{"messages": [{"role": "user", "content": f"What is the capital of {country}?"},
                          {"role": "assistant", "content": f"The capital of {country} is {city}."}]}
            for country, city in zip(COUNTRIES, CITIES)]


def logits_of(model: TransformersModel, rows: list[dict], adapter_name: str | None = None) -> torch.Tensor:
    """The model's logits on ``rows`` (eval mode, no gradients)."""
    kwargs = {} if adapter_name is None else {"adapter_name": adapter_name}
    return model.forward_only(inputs=rows, **kwargs)["logits"].detach()


def forward_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, rows: list[dict],
               processor: InputProcessor) -> float:
    """The mean ``KL(teacher || student)`` over the answer tokens of ``rows``."""
    batch = processor(rows)
    return float(GKDLoss(beta=0.0)(batch, {"logits": student_logits}, teacher_logits=teacher_logits)["loss"])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    known_warnings.silence(args.model_id)
    twinkle.initialize(seed=args.seed)
    template = Template(args.model_id)
    processor = InputProcessor.for_template(template)
    rows = [template.encode(row) for row in facts()]
    rng = random.Random(args.seed)

    # the teacher: the base model with a LoRA adapter fine-tuned on the facts, then only run forward. A
    # full fine-tune would move the embeddings and the LM head, which the student's LoRA (linear layers
    # only) cannot follow: its KL then stalls at what those layers account for
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear")
    teacher = TransformersModel(model_id=args.model_id, mixed_precision="no")
    teacher.add_adapter_to_model("teacher", lora)
    teacher.set_optimizer("AdamW", lr=args.lr, adapter_name="teacher")
    for _ in tqdm(range(args.teacher_steps), desc="teacher SFT", dynamic_ncols=True):
        teacher.forward_backward(inputs=rng.sample(rows, args.batch_size), adapter_name="teacher")
        teacher.clip_grad_and_step(max_grad_norm=1.0, adapter_name="teacher")

    # the student: the untouched base model under a LoRA adapter, distilled with GKD
    student = TransformersModel(model_id=args.model_id, mixed_precision="no")
    student.add_adapter_to_model("student", lora)
    student.set_optimizer("AdamW", lr=args.lr, adapter_name="student")
    student.set_loss("GKDLoss", adapter_name="student", beta=args.beta, temperature=args.temperature)

    def kl() -> float:
        return forward_kl(logits_of(teacher, rows, "teacher"), logits_of(student, rows, "student"), rows, processor)

    history = {"loss": [], "kl": [kl()]}
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc="GKD", dynamic_ncols=True)
    for _ in bar:
        batch = rng.sample(rows, args.batch_size)
        teacher_logits = logits_of(teacher, batch, "teacher")
        # forward, then the loss with the teacher's logits as its call argument, then backward
        student.forward(inputs=batch, adapter_name="student")
        loss = student.calculate_loss(adapter_name="student", teacher_logits=teacher_logits)
        student.backward(adapter_name="student")
        student.clip_grad_and_step(max_grad_norm=1.0, adapter_name="student")
        history["loss"].append(float(loss))
        bar.set_postfix(loss=f"{float(loss):.4f}")
    history["kl"].append(kl())
    history["seconds"] = time.perf_counter() - start
    logger.info("KL(teacher || student) on the answers %.4f -> %.4f (%d steps, %.0f s)", history["kl"][0],
                history["kl"][-1], args.steps, history["seconds"])
    if args.results_json:
        Path(args.results_json).write_text(json.dumps(history))
    return history


if __name__ == "__main__":
    main()
