"""Scaling TransformersModel out: strategy choice, wrapping (DDP / FSDP2 / accelerate FSDP2),
cross-rank reductions, sharded checkpoints and memory-efficient initialisation."""

from __future__ import annotations

from twinkle_hf.distributed.plan import DistributedPlan, make_plan

__all__ = ["DistributedPlan", "make_plan"]
