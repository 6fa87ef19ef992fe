"""Probers (``prober_list``): per-module statistics of chosen steps (the ``profile_step`` steps), a registry kind.

A prober attaches hooks to the model's modules once; they record only while a profiled step runs. At the
end of the step its records go to ``log_dir/probes/<prober>/step-N-rank-R.jsonl`` (one JSON object per
module or parameter) and a summary to the experiment tracker (``probe/<stat>/<name>``). Built in, as xtuner
ships them: ``AccProber`` (each module's output: sum, mean, std, largest magnitude, shape; each trainable
parameter's gradient before and after clipping: norm, mean, std, and its weight's norm) and ``TimeProber``
(each module's forward time). A third party registers its own with the ``register_probers`` hook.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Prober:
    """Base class: override :meth:`attach` (hooks; record only while :attr:`active`) and the gradient events."""

    name = "Prober"

    def __init__(self) -> None:
        self.active = False
        self.step = 0
        self.rows: list[dict[str, Any]] = []
        self.summary: dict[str, float] = {}
        self.handles: list[Any] = []

    def attach(self, module: Any) -> None:
        """Register hooks on ``module`` (they run on every forward; record only when :attr:`active`)."""

    def before_clip(self, module: Any) -> None:
        """The step's gradients are complete and not clipped yet."""

    def after_clip(self, module: Any, grad_norm: float) -> None:
        """The gradients were clipped (their norm before clipping: ``grad_norm``)."""

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _tensor(output: Any) -> Any:
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return getattr(output, "logits", None)


class AccProber(Prober):
    """Activations (every module's output) and gradients (every trainable parameter, before/after clipping)."""

    name = "AccProber"

    def attach(self, module: Any) -> None:
        for name, sub in module.named_modules():
            if name:
                self.handles.append(sub.register_forward_hook(self._forward_hook(name)))

    def _forward_hook(self, name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if not self.active:
                return
            tensor = _tensor(output)
            if tensor is None or not tensor.is_floating_point():
                return
            t = tensor.detach().double()
            stats = {"sum": float(t.sum()), "mean": float(t.mean()), "std": float(t.std()) if t.numel() > 1 else 0.0,
                     "absmax": float(t.abs().max())}
            self.rows.append({"kind": "activation", "module": name, "step": self.step, "shape": list(tensor.shape),
                              "dtype": str(tensor.dtype), **stats})
            self.summary[f"probe/act_absmax/{name}"] = max(stats["absmax"],
                                                           self.summary.get(f"probe/act_absmax/{name}", 0.0))
            self.summary[f"probe/act_mean/{name}"] = stats["mean"]
        return hook

    def _gradients(self, module: Any, when: str) -> None:
        for name, param in module.named_parameters():
            if not param.requires_grad or param.grad is None:
                continue
            grad = param.grad.detach()
            grad = (grad.to_local() if hasattr(grad, "to_local") else grad).double()
            weight = param.detach()
            weight = (weight.to_local() if hasattr(weight, "to_local") else weight).double()
            stats = {"grad_norm": float(grad.norm()), "grad_mean": float(grad.mean()),
                     "grad_std": float(grad.std()) if grad.numel() > 1 else 0.0, "weight_norm": float(weight.norm())}
            self.rows.append({"kind": f"gradient_{when}", "param": name, "step": self.step,
                              "shape": list(param.shape), **stats})
            if when == "before_clip":
                self.summary[f"probe/grad_norm/{name}"] = stats["grad_norm"]

    def before_clip(self, module: Any) -> None:
        self._gradients(module, "before_clip")

    def after_clip(self, module: Any, grad_norm: float) -> None:
        self._gradients(module, "after_clip")
        self.rows.append({"kind": "grad_norm", "step": self.step, "grad_norm": grad_norm})


class TimeProber(Prober):
    """Each module's forward wall time (summed over the step's micro-batches), in milliseconds."""

    name = "TimeProber"

    def attach(self, module: Any) -> None:
        self.started: dict[str, float] = {}
        self.totals: dict[str, float] = {}
        for name, sub in module.named_modules():
            if name:
                self.handles.append(sub.register_forward_pre_hook(self._pre(name)))
                self.handles.append(sub.register_forward_hook(self._post(name)))

    def _pre(self, name: str) -> Any:
        def hook(module: Any, args: Any) -> None:
            if self.active:
                self.started[name] = time.perf_counter()
        return hook

    def _post(self, name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if self.active and name in self.started:
                elapsed = 1000.0 * (time.perf_counter() - self.started.pop(name))
                self.totals[name] = self.totals.get(name, 0.0) + elapsed
                self.summary[f"probe/forward_ms/{name}"] = self.totals[name]
        return hook

    def finish(self) -> None:
        self.rows = [{"kind": "forward_time", "module": n, "step": self.step, "ms": ms}
                     for n, ms in self.totals.items()]
        self.totals = {}


class ProberSet:
    """The Trainer's probers: built by name from the registry, active during the ``steps``."""

    def __init__(self, names: list[str], module: Any, out_dir: Path, steps: list[int], is_main: bool) -> None:
        from twinkle.model.components import build_component

        self.module, self.out_dir, self.steps = module, out_dir, set(steps)
        self.probers = [build_component("prober", name, {}) for name in names]
        for prober in self.probers:
            if not isinstance(prober, Prober):
                raise TypeError(f"prober {type(prober).__name__} is not a twinkle.trainer.probes.Prober.")
            prober.attach(module)
        self.is_main = is_main
        self._records: dict[int, dict[str, float]] = {}

    def active(self, step: int) -> bool:
        return step in self.steps

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        if step not in self.steps:
            yield
            return
        for prober in self.probers:
            prober.active, prober.step, prober.rows, prober.summary = True, step, [], {}
        try:
            yield
        finally:
            for prober in self.probers:
                prober.active = False
            self._write(step)

    def before_clip(self, step: int) -> None:
        if step in self.steps:
            for prober in self.probers:
                prober.before_clip(self.module)

    def after_clip(self, step: int, grad_norm: float) -> None:
        if step in self.steps:
            for prober in self.probers:
                prober.after_clip(self.module, grad_norm)

    def _write(self, step: int) -> None:
        from twinkle import collective

        summary: dict[str, float] = {}
        for prober in self.probers:
            if hasattr(prober, "finish"):
                prober.finish()
            directory = self.out_dir / prober.name
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"step-{step}-rank-{collective.rank()}.jsonl"
            path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in prober.rows))
            summary.update(prober.summary)
        self._records[step] = summary

    def records(self, step: int) -> dict[str, float]:
        return self._records.pop(step, {})

    def close(self) -> None:
        for prober in self.probers:
            prober.detach()
