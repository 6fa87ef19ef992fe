"""Run under torchrun (2 ranks): the Trainer's backend, mesh-derived accumulation and health check.

Scenarios, one after another in the same processes (the process group is made once, by the first):
  backend: backend='nccl' on a CPU machine is refused naming the option; the run then starts with
           backend='gloo', check_health_interval=1 and dataloader.micro_batch_size=2 (global 8 over 2 ranks).
  nan:     rank 1 puts a NaN into a weight at step 2: the health check stops every rank, naming rank 1.
  probe:   rank 1's check computation answers differently (a faulty device): every rank stops, naming rank 1.
Each rank appends one JSON line per scenario to its own file ``results-<rank>.jsonl`` in the root (two ranks
printing to one pipe can interleave their lines).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_testing import tiny_job  # noqa: E402

from twinkle.trainer import (  # noqa: E402
    ConfigError,
    Trainer,
    health,  # noqa: E402
)

RANK = int(os.environ["RANK"])
root = Path(sys.argv[1])


def report(**data: object) -> None:
    with open(root / f"results-{RANK}.jsonl", "a") as f:
        f.write(json.dumps({"rank": RANK, **data}) + "\n")


def poison_rank1(step: int, **kwargs: object) -> None:
    import torch

    if RANK == 1 and step == 2:
        params = dict(poison_rank1.trainer.model.model.named_parameters())
        (name,) = [n for n in params if n.endswith("layers.0.self_attn.q_proj.lora_A.default.weight")]
        with torch.no_grad():
            params[name][0, 0] = float("nan")


poison_rank1.connect_trainer = lambda trainer: setattr(poison_rank1, "trainer", trainer)

try:
    Trainer(**tiny_job(root / "nccl", total_step=1, backend="nccl")).fit()
    report(scenario="nccl", error=None)
except ConfigError as exc:
    report(scenario="nccl", error=str(exc))

import torch.distributed as dist  # noqa: E402

trainer = Trainer(**tiny_job(root / "ok", total_step=2, global_batch_size=8, backend="gloo", check_health_interval=1,
                             dataloader={"micro_batch_size": 2, "gradient_accumulation_steps": 1}))
result = trainer.fit()
report(scenario="backend", backend=dist.get_backend(), gas=trainer.gas, step=result.step)

for scenario, hooks in (("nan", {"before_train_step": poison_rank1}), ("probe", {})):
    if scenario == "probe" and RANK == 1:
        health.probe = lambda: 0.5  # a device that computes wrong
    try:
        Trainer(**tiny_job(root / scenario, total_step=3, check_health_interval=1, hooks=hooks)).fit()
        report(scenario=scenario, error=None)
    except health.UnhealthyRankError as exc:
        report(scenario=scenario, error=str(exc))
