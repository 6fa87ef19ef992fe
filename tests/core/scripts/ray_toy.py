"""A toy data-parallel trainer used by the Ray runtime tests: plain torch + torch.distributed."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import twinkle
from twinkle import remote_class, remote_function


@remote_class()
class ToyTrainer:
    def __init__(self, dim: int, lr: float = 0.1) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(dim, 1)
        self.lr = lr
        self.steps = 0

    @remote_function(dispatch="slice_dp", collect="mean")
    def forward_backward(self, batch: dict) -> float:
        loss = torch.nn.functional.mse_loss(self.model(batch["x"]), batch["y"])
        loss.backward()
        if dist.is_initialized():
            for p in self.model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        return loss.item()

    @remote_function()
    def step(self) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p -= self.lr * p.grad
                p.grad = None
        self.steps += 1

    @remote_function(collect="list")
    def whoami(self) -> dict:
        rt = twinkle.get_runtime()
        return {"rank": rt.rank, "data_rank": rt.data_rank, "pid": os.getpid(), "rows": None}

    @remote_function(dispatch="slice", collect="flatten")
    def double(self, xs: list) -> list:
        return [2 * x for x in xs]

    @remote_function(execute="first")
    def weights(self) -> list:
        return [p.detach().clone() for p in self.model.parameters()]

    @remote_function()
    def fail_on(self, rank: int) -> None:
        if twinkle.get_runtime().rank == rank:
            raise ValueError(f"rank {rank} hit a bad batch")
        dist.all_reduce(torch.ones(1))  # the healthy rank now waits for a peer that will never come
