"""The model layer's shape (issue 22, DESIGN.md §4b), checked statically.

* The training step lives in the core engine only: outside ``twinkle/engine`` no package code
  back-propagates (``x.backward()``), closes an accumulation window, skips or counts a step, or
  advances an lr scheduler. Backends run a task on a batch and apply what the engine decides.
* Every model class is a thin facade: at most 4 twinkle classes in its MRO, and no public method is
  defined at more than 2 levels of it (the protocol's stub and one implementation).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = REPO / "packages"
ENGINE = PACKAGES / "twinkle-core" / "src" / "twinkle" / "engine"
#: the group's state the engine drives: it defines the bookkeeping below
GROUP_STATE = PACKAGES / "twinkle-core" / "src" / "twinkle" / "model" / "optimizer_group.py"
#: the step's bookkeeping: only the engine calls these (OptimizerGroup defines them); ``x.backward()`` without
#: positional arguments is autograd's (``model.backward(adapter_name=...)`` of the API is allowed)
STEP_CALLS = {"backward", "record_backward", "record_forward", "record_loss", "finish_step", "skip_step",
              "finish_zero_grad", "backward_divisor"}
#: the accumulation decisions: only the engine reads these
STEP_READS = {"is_boundary", "zero_grad_due", "lr_step_pending"}
MODELS = [("twinkle_hf.model", "TransformersModel"), ("twinkle_hf.multi_lora", "MultiLoraTransformersModel"),
          ("twinkle_megatron.model", "MegatronModel"), ("twinkle_megatron.model", "MultiLoraMegatronModel")]


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGES.glob("*/src/**/*.py"))


def _step_uses(path: Path, root: Path = PACKAGES) -> list[str]:
    """``file:line name`` of every step call or accumulation read in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STEP_CALLS \
                and not (node.func.attr == "backward" and node.args):
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}()")
        elif isinstance(node, ast.Attribute) and node.attr in STEP_READS and isinstance(node.ctx, ast.Load):
            found.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "lr_scheduler"):
            found.append(f"{path.relative_to(root)}:{node.lineno} lr_scheduler.step()")
    return found


def test_the_step_sequence_lives_in_the_engine_only() -> None:
    outside = [use for path in _sources() if ENGINE not in path.parents and path != GROUP_STATE
               for use in _step_uses(path)]
    assert outside == [], ("the training step (backward, accumulation, skip, lr step) is written outside "
                           "twinkle/engine:\n" + "\n".join(outside))


def test_the_rule_sees_what_it_forbids(tmp_path: Path) -> None:
    """The checker itself: a backend that back-propagates and gates its own step is caught."""
    module = tmp_path / "backend.py"
    module.write_text("def step(self, group, loss):\n"
                      "    (loss / 2).backward()\n"
                      "    if group.is_boundary:\n"
                      "        group.finish_step()\n"
                      "        group.lr_scheduler.step()\n", encoding="utf-8")
    found = _step_uses(module, tmp_path)
    assert [f.split(" ", 1)[1] for f in found] == ["backward()", ".is_boundary", "finish_step()",
                                                   "lr_scheduler.step()"]


def _twinkle_classes(cls: type) -> list[type]:
    return [c for c in cls.__mro__ if c.__module__.split(".")[0].startswith("twinkle")]


@pytest.mark.parametrize("module,name", MODELS, ids=[m[1] for m in MODELS])
def test_model_classes_are_thin_facades(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    chain = _twinkle_classes(cls)
    assert len(chain) <= 4, f"{name} has {len(chain)} twinkle classes in its MRO: {[c.__name__ for c in chain]}"
    levels: dict[str, list[str]] = {}
    for klass in chain:
        for attr, value in vars(klass).items():
            if not attr.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                levels.setdefault(attr, []).append(klass.__name__)
    deep = {attr: where for attr, where in levels.items() if len(where) > 2}
    assert deep == {}, f"public methods of {name} defined at more than 2 levels: {deep}"
