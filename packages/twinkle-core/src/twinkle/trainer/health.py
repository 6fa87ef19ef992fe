"""``check_health_interval``: every rank checks its weights, gradients and communication, and all agree;
``debug``: a warning naming the first module whose output is not finite."""

from __future__ import annotations

from typing import Any

from twinkle import collective
from twinkle.errors import TwinkleError
from twinkle.log import get_logger

logger = get_logger()
#: names listed per problem at most
SHOWN = 3


class UnhealthyRankError(TwinkleError, RuntimeError):
    """A rank failed the health check; the message names each rank and what it found."""


def probe() -> float:
    """A fixed computation every rank repeats (a chain of float64 matmuls): a faulty device answers otherwise."""
    import torch

    generator = torch.Generator().manual_seed(12345)
    x = torch.rand(64, 64, generator=generator, dtype=torch.float64)
    y = x
    for _ in range(8):
        y = torch.nn.functional.normalize(x @ y, dim=0)
    return float(y.sum())


def local_problems(model: Any, adapter: str | None) -> list[str]:
    """What is wrong with this rank's trainable weights and their gradients (non-finite values)."""
    group = model.optimizer_group[adapter or next(iter(model.optimizer_group))]
    names = {id(p): n for n, p in model.model.named_parameters()}
    bad_weights, bad_grads = [], []
    for param in model.backend.parameters(group):
        local = param.to_local() if hasattr(param, "to_local") else param
        if not bool(local.detach().isfinite().all()):
            bad_weights.append(names.get(id(param), "?"))
        grad = param.grad
        if grad is not None:
            grad = grad.to_local() if hasattr(grad, "to_local") else grad
            if not bool(grad.isfinite().all()):
                bad_grads.append(names.get(id(param), "?"))
    problems = []
    for what, found in (("weights", bad_weights), ("gradients", bad_grads)):
        if found:
            more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
            problems.append(f"non-finite {what} in {', '.join(found[:SHOWN])}{more}")
    return problems


def check_health(model: Any, adapter: str | None, step: int) -> None:
    """All ranks check and agree; an unhealthy rank stops every rank with :class:`UnhealthyRankError`."""
    import torch

    mine = (collective.rank(), local_problems(model, adapter), probe())
    everyone = collective.all_gather_object(mine)
    reference = everyone[0][2]
    found = []
    sources = any(p.startswith("non-finite weights") for _, problems, _ in everyone for p in problems)
    # ranks with bad weights first: the gradient all-reduce spreads their NaN gradients to every rank
    for rank, problems, value in sorted(everyone, key=lambda e: not any(p.startswith("non-finite weights")
                                                                         for p in e[1])):
        spread = sources and not any(p.startswith("non-finite weights") for p in problems)
        found += [f"rank {rank}: {p}" + (" (received through the gradient all-reduce)" if spread else "")
                  for p in problems]
        if value != reference:
            found.append(f"rank {rank}: the check computation gave {value!r} where rank 0 got {reference!r} (a faulty "
                         "device, or corrupted communication)")
    world = collective.world_size()
    ones = collective.all_reduce(torch.ones(1), "sum")
    if float(ones.item()) != float(world):
        found.append(f"communication: an all-reduce of ones over {world} ranks gave {float(ones.item())}")
    if found:
        raise UnhealthyRankError(f"health check at step {step} failed: {'; '.join(found)}. Training stopped on every "
                                 "rank before the update; the last checkpoint is unaffected.")
    logger.info("health check passed at step %d (%d rank%s)", step, world, "" if world == 1 else "s")


class NonFiniteOutputs:
    """Forward hooks that warn once per step about the first module whose output holds NaN/inf (``debug``)."""

    def __init__(self, module: Any) -> None:
        self.reported = False
        self.handles = [m.register_forward_hook(self._hook(name)) for name, m in module.named_modules() if name]
        self.first: str | None = None

    def _hook(self, name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if self.first is None and not _finite(output):
                self.first = name
                logger.warning("debug: the first non-finite output of this forward comes from %s (%s)", name,
                               type(module).__name__)
        return hook

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _finite(output: Any) -> bool:
    import torch

    if isinstance(output, torch.Tensor):
        return not output.is_floating_point() or bool(output.detach().isfinite().all())
    if isinstance(output, (tuple, list)):
        return all(_finite(o) for o in output)
    if isinstance(output, dict):
        return all(_finite(o) for o in output.values())
    return True
