"""twinkle.collective: the one module that calls torch.distributed collectives.

A static check walks every package's sources and fails when a module other than
``twinkle/collective.py`` calls a collective itself. The single-process behaviour of the layer
(no-ops returning local values, argument checks) is tested here; its two-rank behaviour and the
device of what it sends are in tests/distributed/test_collective_placement.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from twinkle import collective

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
LAYER = PACKAGES / "twinkle-core" / "src" / "twinkle" / "collective.py"
#: torch.distributed functions that communicate (tensor, object and point-to-point collectives).
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
    "all_gather_object", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
    "recv_object_list",
})
DIST_MODULES = ("torch.distributed", "torch.distributed._functional_collectives", "torch.distributed.nn.functional")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def direct_collective_calls(source: str) -> list[str]:
    """``line: call`` for every call of a torch.distributed collective in ``source``."""
    tree = ast.parse(source)
    modules, functions = set(DIST_MODULES), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in DIST_MODULES and alias.asname:
                    modules.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in DIST_MODULES:
                    modules.add(alias.asname or alias.name)
                elif node.module in DIST_MODULES and alias.name in COLLECTIVES:
                    functions.add(alias.asname or alias.name)
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in COLLECTIVES and _dotted(func.value) in modules:
            calls.append(f"{node.lineno}: {_dotted(func)}")
        elif isinstance(func, ast.Name) and func.id in functions:
            calls.append(f"{node.lineno}: {func.id}")
    return calls


@pytest.mark.parametrize("code", [
    "import torch.distributed as dist\ndist.all_reduce(t)",
    "import torch\ntorch.distributed.broadcast(t, src=0)",
    "import torch.distributed\ntorch.distributed.barrier()",
    "from torch import distributed\ndistributed.all_gather(out, t)",
    "from torch.distributed import all_gather_object as gather_all\ngather_all(out, obj)",
    "def f():\n    import torch.distributed as d\n    return d\n\ndef g(d):\n    d.broadcast_object_list(box, src=0)",
    "import torch.distributed._functional_collectives as funcol\nfuncol.all_reduce(t, 'sum', group)",
])
def test_the_checker_finds_direct_calls(code):
    assert len(direct_collective_calls(code)) == 1


@pytest.mark.parametrize("code", [
    "from twinkle import collective\ncollective.all_reduce(t)",
    "import torch.distributed as dist\ndist.get_rank(); dist.is_initialized(); dist.init_process_group('gloo')",
    "model.all_reduce(t)\nbarrier()",
    "from torch.distributed import get_world_size\nget_world_size()",
])
def test_the_checker_leaves_other_calls(code):
    assert direct_collective_calls(code) == []


def test_no_module_outside_the_collective_layer_calls_a_collective():
    sources = sorted(PACKAGES.glob("*/src/**/*.py"))
    assert LAYER in sources and len(sources) > 100
    offenders = {str(path.relative_to(PACKAGES)): calls for path in sources if path != LAYER
                 for calls in [direct_collective_calls(path.read_text(encoding="utf-8"))] if calls}
    assert offenders == {}, "call twinkle.collective instead (tensors on the communication device)"
    assert direct_collective_calls(LAYER.read_text(encoding="utf-8"))  # the layer itself is seen by the checker


# ------------------------------------------------------------ one process
def test_every_collective_is_the_identity_on_one_process():
    t = torch.tensor([1.0, 2.0])
    assert collective.active() is False and collective.rank() == 0 and collective.world_size() == 1
    assert collective.all_reduce(t) is t and collective.broadcast_(t) is t
    assert collective.all_gather(t) == [t]
    assert collective.broadcast_object({"a": 1}) == {"a": 1}
    assert collective.all_gather_object(3) == [3] and collective.gather_object(3) == [3]
    collective.barrier()
    assert collective.failed_ranks(True) == [] and collective.failed_ranks(False) == [0]
    collective.agree(False, "alone")  # the failing rank raises its own error, not agree
    assert str(collective.comm_device()) == "cpu"


def test_sum_values_packs_numbers_and_tensors_without_leaving_their_device():
    packed = collective.sum_values([torch.tensor(2, dtype=torch.int64), 1.5, torch.tensor([0.25]), True])
    assert packed.dtype == torch.float64 and packed.device.type == "cpu"
    assert packed.tolist() == [2.0, 1.5, 0.25, 1.0]
    assert collective.sum_floats([3, torch.tensor(0.5)]) == [3.0, 0.5]


def test_bad_arguments_are_refused_on_one_process_too():
    with pytest.raises(ValueError, match="op='avg' is not one of sum, max, min"):
        collective.all_reduce(torch.ones(1), op="avg")
    with pytest.raises(ValueError, match="at least one value"):
        collective.sum_values([])
    with pytest.raises(ValueError, match=r"one-element tensors, got a tensor of shape \(2,\)"):
        collective.sum_values([torch.ones(2)])


def test_data_group_is_registered_and_reset():
    marker = object()
    collective.set_data_group(marker)
    try:
        assert collective.data_group() is marker
    finally:
        collective.set_data_group(None)
    assert collective.data_group() is None
