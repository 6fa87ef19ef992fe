"""loss_cfg (xtuner's CELossConfig): loss_reduction weights tokens per sample, mode chunk trains without the full
logits and gives the eager losses, and the group's options are checked together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rounding import U, chain_bound, tiny_qwen
from trainer_testing import tiny_job

from twinkle.trainer import CELossConfig, ConfigError, Trainer


@pytest.mark.parametrize("mode", ["sample", "square"])
def test_loss_reduction_weights_each_sample(mode: str) -> None:
    import torch
    import torch.nn.functional as F

    from twinkle.loss import CrossEntropyLoss

    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    labels = torch.tensor([[-100, 3, 4, 5, 6, 7], [-100, -100, -100, 1, 2, -100]])
    total, items = CrossEntropyLoss(loss_reduction=mode).compute({"labels": labels}, {"logits": logits})
    expected_sum, expected_items = 0.0, 0.0
    for row in range(2):  # by hand: position t predicts labels[t + 1]
        targets = labels[row, 1:]
        losses = F.cross_entropy(logits[row, :-1], targets, ignore_index=-100, reduction="none")[targets != -100]
        weight = 1 / len(losses) if mode == "sample" else 1 / len(losses) ** 0.5
        expected_sum += float(losses.sum()) * weight
        expected_items += weight * len(losses)
    # positive terms: a log-sum-exp over 11 classes and a sum over <= 6 tokens in another order (tests/rounding.py),
    # plus 4 u for the per-row weight's float32 rounding, power and product
    assert float(total) == pytest.approx(expected_sum, rel=chain_bound(11, 6) + 4 * U)
    assert float(items) == pytest.approx(expected_items, rel=chain_bound(6) + 4 * U)
    token_total, token_items = CrossEntropyLoss().compute({"labels": labels}, {"logits": logits})
    # rows of 4 and 2 tokens: the per-token mean differs by far more than approx's 1e-6
    assert float(total / items) != pytest.approx(float(token_total / token_items))


def test_loss_cfg_modes_resolve_and_chunk_trains_like_eager(tmp_path: Path) -> None:
    assert CELossConfig().resolved() == (None, {}, "causal_lm")  # eager: the model's default cross-entropy
    assert CELossConfig(mode="chunk", chunk_size=64).resolved() == (
        "LigerFusedLinearCrossEntropyLoss",
        {"ignore_index": -100, "chain": ["torch.fused_linear_cross_entropy"], "chunk_size": 64}, "fused_lm_ce")
    with pytest.raises(ConfigError, match="loss_reduction: 'sample' needs mode eager"):
        CELossConfig(mode="chunk", loss_reduction="sample")
    with pytest.raises(ConfigError, match="name: 'InfoNCELoss' and the cross-entropy options"):
        CELossConfig(name="InfoNCELoss", loss_reduction="square")
    with pytest.raises(ConfigError, match="a LoRA on lm_head would not train"):  # the tiny default adapts lm_head
        Trainer(total_step=1, loss_cfg=CELossConfig(mode="chunk"), work_dir=str(tmp_path / "refused"))

    # LoRA off lm_head: the fused loss reads the output layer's weight without running its forward
    lora = {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}

    shapes: dict[str, list[tuple[int, ...]]] = {}

    class Shapes:  # the input_ids shapes the model's forward gets
        def __init__(self, name: str) -> None:
            self.name = name

        def connect_trainer(self, trainer: Trainer) -> None:
            def record(module: object, args: tuple, kwargs: dict) -> None:
                shapes.setdefault(self.name, []).append(tuple(kwargs["input_ids"].shape))
            trainer.model.model.register_forward_pre_hook(record, with_kwargs=True)

        def __call__(self, **kwargs: object) -> None:
            pass

    # SGD: the second loss follows the first step's gradient linearly; AdamW's eps = 1e-8 would turn the two
    # loss paths' rounding of near-zero gradients into lr * sign(g) of weight
    sgd = {"optimizer": {"name": "SGD", "lr": 0.5}}

    def losses(name: str, **options: object) -> list[float]:
        Trainer(**tiny_job(tmp_path / name, total_step=2, lora=lora, hooks={"before_train_step": Shapes(name)},
                           **sgd, **options)).fit()
        path = tmp_path / name / "logs" / "metrics.jsonl"
        return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r]

    # chunked / packed vs eager: the same sums in other orders, 2 steps of 4 rows of <= 128 tokens, the second
    # carrying the first step's rounding twice (tests/rounding.py)
    rel = (2 * 1 + 1) * tiny_qwen(128, 4).step_bound()
    eager = losses("eager")
    assert abs(eager[1] - eager[0]) > 10 * rel * eager[0]  # the step moved the loss far beyond the bound
    assert losses("chunk", loss_cfg=CELossConfig(mode="chunk", chunk_size=16)) == pytest.approx(eager, rel=rel, abs=0)
    sample = losses("sample", loss_cfg={"loss_reduction": "sample"})
    assert sample != pytest.approx(eager, rel=rel, abs=0)
    # dataloader_cfg.pack_to_max_length: each micro-batch packed into one row, the same losses
    packed = losses("packed", dataloader={"gradient_accumulation_steps": 2, "pack_to_max_length": True})
    assert packed == pytest.approx(eager, rel=rel, abs=0)
    assert {s[0] for s in shapes["packed"]} == {1} and {s[0] for s in shapes["eager"]} == {2}  # 2 rows -> 1 row
