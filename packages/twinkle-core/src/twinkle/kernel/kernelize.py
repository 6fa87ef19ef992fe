"""kernelize / unkernelize: swap a model's modules for the first available kernel of each op's chain.

``kernelize(model)`` walks the model, matches modules to ops (:mod:`twinkle.kernel.ops`), and for
each matched module takes the first choice of the op's chain that is available on the model's
device and accepts that module. It logs one line per op, records what it did, and returns what it
was given. Everything is per instance and reversible: :func:`unkernelize` (or leaving the
:func:`kernelized` context) puts every module back exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from twinkle.kernel.choice import KernelChoice
from twinkle.kernel.config import DEFAULT_KERNEL_CONFIG, Chain, ConfigLike, normalize_config
from twinkle.kernel.ops import OPS
from twinkle.kernel.patching import ModulePatch, apply_patch, can_patch, forward_global, restore
from twinkle.log import get_logger

BASELINE_ENV = "TWINKLE_TORCH_BASELINE"
M = TypeVar("M")
logger = get_logger("twinkle.kernel")


@dataclass
class OpResult:
    """What kernelize chose for one op: modules per choice name, or the function choice."""

    op: str
    modules: dict[str, int] = field(default_factory=dict)
    function: str | None = None
    unmatched: int = 0  # matched modules no available choice accepted (left as they are)
    replaced: int = 0  # modules actually patched


@dataclass
class KernelReport:
    device: str
    ops: dict[str, OpResult]

    @property
    def changed(self) -> bool:
        """True when at least one module was patched."""
        return any(r.replaced for r in self.ops.values())

    def chosen(self, op: str) -> list[str]:
        """Names of the choices used for ``op`` (modules first by count, or the function)."""
        result = self.ops.get(op)
        if result is None:
            return []
        return [result.function] if result.function else [n for n, _ in Counter(result.modules).most_common()]


@dataclass
class _Plan:
    report: KernelReport
    patches: list[ModulePatch]


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def torch_baseline() -> bool:
    """``TWINKLE_TORCH_BASELINE=1``: no kernel anywhere, the plain torch model (for A/B runs)."""
    return os.environ.get(BASELINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _module_of(model: Any) -> Any:
    import torch

    if isinstance(model, torch.nn.Module):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, torch.nn.Module):
        return inner
    raise TypeError(f"kernelize takes a torch.nn.Module or an object with a .model module (a TwinkleModel); "
                    f"got {type(model).__name__}.")


def _device_of(model: Any, module: Any) -> str:
    """Whose kernel chains apply: a TwinkleModel's device (its module may still be on the meta device, or on
    the CPU until FSDP2 places its shards), else the device of the module's tensors; a module on meta takes
    the platform's device (a meta tensor runs no kernel, so choosing for 'meta' would apply none, silently)."""
    import torch

    if not isinstance(model, torch.nn.Module) and isinstance(getattr(model, "device", None), torch.device):
        return model.device.type
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type != "meta":
            return tensor.device.type
        break
    else:
        return "cpu"
    from twinkle.platform import detect_platform
    from twinkle.runtime import get_runtime

    runtime = get_runtime()
    return detect_platform(runtime.platform if runtime.initialized else None).device_type


class _Selector:
    """Per-call caches: availability of each choice, and the loaded callables (a failed load skips it)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._available: dict[int, bool] = {}
        self._loaded: dict[int, Any] = {}

    def available(self, chain: Chain) -> list[KernelChoice]:
        for c in chain:
            if id(c) not in self._available:
                self._available[id(c)] = c.is_available(self.device)
        return [c for c in chain if self._available[id(c)]]

    def loaded(self, choice: KernelChoice) -> Any:
        if id(choice) not in self._loaded:
            try:
                value = choice.load_forward() or choice.load_class() or choice.load_function()
            except Exception as exc:
                logger.warning("kernelize[%s]: %s is available but failed to load (%s: %s); using the next "
                               "choice.", self.device, choice.name, type(exc).__name__, exc)
                value = None
            self._loaded[id(choice)] = value
        return self._loaded[id(choice)]

    def pick(self, chain: Chain, module: Any) -> KernelChoice | None:
        for choice in self.available(chain):
            if choice.accepts_module(module) and (choice.is_reference or self.loaded(choice) is not None):
                return choice
        return None


def _matches(spec: Any, module: Any) -> bool:
    try:
        return bool(spec.matches(module))
    except Exception:
        return False


def _plan_op(op: str, chain: Chain, root: Any, selector: _Selector, edits: dict[Any, dict[str, Any]]) -> OpResult:
    spec = OPS[op]
    result = OpResult(op)
    if spec.level == "function":
        choice = next((c for c in selector.available(chain) if c.function is not None
                       and selector.loaded(c) is not None), None)
        result.function = choice.name if choice else None
        return result
    counts: Counter = Counter()
    wrapped: dict[tuple[int, int], Any] = {}
    for module in root.modules():
        if not _matches(spec, module):
            continue
        choice = selector.pick(chain, module)
        if choice is None:
            result.unmatched += 1
            continue
        edit = edits.get(module, {})
        if not choice.is_reference:
            if not can_patch(module) or "forward" in edit or "module_class" in edit or (
                    spec.level == "module" and edit.get("overrides")):
                result.unmatched += 1  # someone else's forward, or another op already replaced it
                continue
            edit = edits.setdefault(module, {"overrides": {}, "ops": {}})
            value = selector.loaded(choice)
            if spec.level == "module":
                edit["forward" if choice.forward is not None else "module_class"] = value
            else:
                original = forward_global(type(module), spec.global_name)
                key = (id(choice), id(original))
                if key not in wrapped:
                    wrapped[key] = spec.wrap(value, original) if spec.wrap else value
                edit["overrides"][spec.global_name] = wrapped[key]
            edit["ops"][op] = choice.name
            result.replaced += 1
        counts[choice.name] += 1
    result.modules = dict(counts)
    return result


def _log(device: str, result: OpResult, chain: Chain) -> None:
    prefix = f"kernelize[{device}] {result.op}:"
    if OPS[result.op].level == "function":
        if result.function:
            logger.info("%s %s (function, used by the losses)", prefix, result.function)
        else:
            logger.info("%s no available choice among [%s]", prefix, ", ".join(c.name for c in chain))
        return
    if not result.modules and not result.unmatched:
        logger.info("%s no module matched", prefix)
        return
    reference = {c.name for c in chain if c.is_reference}
    parts = [f"{name} x{n}" + (" (reference: unchanged)" if name in reference else "")
             for name, n in Counter(result.modules).most_common()]
    if result.unmatched:
        parts.append(f"{result.unmatched} left as they are (no available choice accepts them, or already patched)")
    logger.info("%s %s", prefix, ", ".join(parts))


def kernelize(model: M, config: ConfigLike | None = None, *, device: str | None = None) -> M:
    """Apply the first available kernel of each op's chain to ``model``; returns ``model``.

    ``model``: an ``nn.Module`` or an object with a ``.model`` module (a TwinkleModel).
    ``config``: ``{op: [KernelChoice or registered kernel name, ...]}``; only its ops are
    kernelized (default :data:`DEFAULT_KERNEL_CONFIG`: every installed plugin's choices).
    ``device``: whose chains to use (default: the device of the model's parameters).
    A no-op when ``TWINKLE_TORCH_BASELINE=1``. Kernelizing again first undoes the previous call.
    A model built in ray mode (a proxy of its actors) is kernelized in every actor.
    """
    if torch_baseline():
        logger.info("kernelize: %s=1, the model keeps its torch implementation (no-op).", BASELINE_ENV)
        return model
    if callable(getattr(type(model), "run_on_ranks", None)):  # ray mode: the modules live in the actors
        model.run_on_ranks(_kernelize_in_place, config, device)
        return model
    root = _module_of(model)
    if root in _PLANS:
        unkernelize(root)
    device = device or _device_of(model, root)
    chains = dict(DEFAULT_KERNEL_CONFIG) if config is None else normalize_config(config)
    selector = _Selector(device)
    edits: dict[Any, dict[str, Any]] = {}
    results: dict[str, OpResult] = {}
    for op, chain in chains.items():
        results[op] = _plan_op(op, chain, root, selector, edits)
        _log(device, results[op], chain)
    clone_cache: dict = {}
    patches = []
    for module, edit in edits.items():
        patch = apply_patch(module, forward=edit.get("forward"), module_class=edit.get("module_class"),
                            overrides=edit["overrides"], clone_cache=clone_cache)
        patch.applied = dict(edit["ops"])
        patches.append(patch)
    report = KernelReport(device, results)
    _PLANS[root] = _Plan(report, patches)
    if not report.changed:
        providers = sorted({c.provider for chain in chains.values() for c in chain})
        logger.info("kernelize[%s]: nothing replaced; no kernel from the installed providers (%s) applies on %s, "
                    "so the model is unchanged.", device, ", ".join(providers) or "none", device)
    return model


def _kernelize_in_place(model: Any, config: ConfigLike | None, device: str | None) -> None:
    """:func:`kernelize` in an actor; returns nothing (the model itself does not travel back)."""
    kernelize(model, config, device=device)


def unkernelize(model: M) -> M:
    """Undo :func:`kernelize` on ``model``: every patched module back to its original class and forward."""
    root = _module_of(model)
    plan = _PLANS.pop(root, None)
    if plan is not None:
        for patch in reversed(plan.patches):
            restore(patch)
        logger.info("unkernelize: restored %d modules.", len(plan.patches))
    return model


@contextlib.contextmanager
def kernelized(model: M, config: ConfigLike | None = None, *, device: str | None = None) -> Iterator[M]:
    """``with kernelized(model): ...`` — kernelize for the block, restore on exit (even on error)."""
    result = kernelize(model, config, device=device)
    try:
        yield result
    finally:
        unkernelize(model)


def kernel_report(model: Any) -> KernelReport | None:
    """What the last :func:`kernelize` of ``model`` chose (None if it is not kernelized)."""
    plan = _PLANS.get(_module_of(model))
    return plan.report if plan is not None else None
