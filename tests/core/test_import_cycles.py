"""No import circles in twinkle-core and twinkle-hf (a static test; docs/architecture.md, "Import rules").

Every module of ``twinkle`` and ``twinkle_hf`` is parsed with :mod:`ast` and the module import graph is
built from what the source says, wherever it says it:

- ``import a.b`` and ``from a.b import name`` anywhere in the file, inside functions and methods too:
  a function-level import is still a dependency, it only runs later;
- ``from a import b`` where ``a.b`` is a module is an edge to ``a.b``; where ``b`` is a name defined
  in ``a`` it is an edge to ``a`` (a package's ``__init__`` is its own module, ``a``);
- relative imports are resolved against the importing module's package;
- ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name, and a package's lazy
  re-export table (a module that defines ``__getattr__`` and names a module of ours in a string) are
  imports too, so a lazy import cannot hide a circle;
- imports under ``if TYPE_CHECKING:`` do not count (they never run);
- the parent packages that Python initialises before a submodule are not edges of their own:
  ``import a.b.c`` depends on ``a.b.c``. Otherwise every package whose ``__init__`` re-exports its
  submodules would be a circle with each submodule that imports a sibling. A submodule that imports
  a *name* from its own package's ``__init__`` (``from a import helper`` or ``from . import helper``)
  while that ``__init__`` imports the submodule is an edge each way, and so a circle: import the name
  from the module that defines it.
- registry specs (``"twinkle.loss:CrossEntropyLoss"``) are data, resolved on first use by the registry
  (docs/plugins.md), not imports of the module that lists them.

A circle is a strongly connected component of more than one module, or a module that imports itself
(an ``__init__`` importing a name from its own package). The failure lists each one with the import
lines that close it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
ROOTS = {
    "twinkle": PACKAGES / "twinkle-core" / "src" / "twinkle",
    "twinkle_hf": PACKAGES / "twinkle-hf" / "src" / "twinkle_hf",
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int
    text: str

    def __str__(self) -> str:
        where = f"{self.path.relative_to(PACKAGES)}:{self.line}"
        return f"{self.source} -> {self.target}    {where}: {self.text}"


def discover_modules(roots: dict[str, Path] = ROOTS) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package) for every .py file under the roots."""
    modules: dict[str, tuple[Path, bool]] = {}
    for top, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = (path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _statements(tree: ast.AST):
    """Every node of the tree except those under ``if TYPE_CHECKING:`` (its ``else`` still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            stack.append(node.test)
            continue
        stack.extend(ast.iter_child_nodes(node))


class _Resolver:
    def __init__(self, modules: dict[str, tuple[Path, bool]]) -> None:
        self.modules = modules

    def owner(self, dotted: str) -> str | None:
        """The longest prefix of ``dotted`` that is one of our modules (``twinkle.x.y`` -> ``twinkle.x``)."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            name = ".".join(parts[:end])
            if name in self.modules:
                return name
        return None

    def package_of(self, module: str) -> str:
        return module if self.modules[module][1] else module.rpartition(".")[0]

    def from_base(self, module: str, node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        base = self.package_of(module)
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        return f"{base}.{node.module}" if node.module else base

    def targets(self, module: str, node: ast.AST) -> list[str]:
        found: list[str | None] = []
        if isinstance(node, ast.Import):
            found = [self.owner(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = self.from_base(module, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append(submodule if submodule in self.modules else self.owner(base))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found = [self.owner(node.args[0].value)]
        return sorted({t for t in found if t is not None})


def _module_edges(module: str, path: Path, resolver: _Resolver) -> list[Edge]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    lazy_table = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
    edges: dict[tuple[str, int], Edge] = {}
    for node in _statements(tree):
        targets = resolver.targets(module, node)
        if lazy_table and isinstance(node, ast.Constant) and node.value in resolver.modules and node.value != module:
            targets.append(node.value)
        for target in targets:
            text = " ".join((ast.get_source_segment(source, node) or "").split())
            edges.setdefault((target, node.lineno), Edge(module, target, path, node.lineno, text))
    return sorted(edges.values(), key=lambda e: (e.line, e.target))


def import_graph(modules: dict[str, tuple[Path, bool]] | None = None) -> dict[str, list[Edge]]:
    """Module -> the edges (one per import statement and target) leaving it, to modules of ours."""
    modules = discover_modules() if modules is None else modules
    resolver = _Resolver(modules)
    return {module: _module_edges(module, path, resolver) for module, (path, _) in modules.items()}


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted({e.target for e in graph[root]})))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({e.target for e in graph.get(child, [])}))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return sorted(components)


def import_cycles(graph: dict[str, list[Edge]] | None = None) -> list[list[Edge]]:
    """Each circle as the import edges inside it (an SCC of >1 module, or a module importing itself)."""
    graph = import_graph() if graph is None else graph
    cycles = []
    for component in strongly_connected(graph):
        members = set(component)
        inside = [e for m in component for e in graph[m] if e.target in members]
        if len(component) > 1 or inside:
            cycles.append(inside)
    return cycles


def _report(cycles: list[list[Edge]]) -> str:
    blocks = []
    for edges in cycles:
        members = sorted({e.source for e in edges})
        blocks.append(" <-> ".join(members) + "\n" + "\n".join(f"    {e}" for e in edges))
    return f"{len(cycles)} import circle(s):\n" + "\n".join(blocks)


def test_the_graph_holds_both_packages_and_every_kind_of_edge():
    graph = import_graph()
    assert {"twinkle", "twinkle.registry", "twinkle_hf", "twinkle_hf.plugin"} <= set(graph)
    assert len(graph) > 150
    edges = {(e.source, e.target) for edges in graph.values() for e in edges}
    assert ("twinkle.model", "twinkle.model.base") in edges  # module level
    assert ("twinkle.model", "twinkle.registry") in edges  # inside the package's __getattr__
    assert ("twinkle.kernel", "twinkle.kernel.fused_linear_ce") in edges  # the lazy re-export table
    assert ("twinkle.plugins", "twinkle._builtin") in edges  # ``from twinkle import _builtin``: a submodule
    assert ("twinkle.hookspecs", "twinkle.registry") not in edges  # under ``if TYPE_CHECKING:``
    assert any(src.startswith("twinkle_hf") and dst.startswith("twinkle.") for src, dst in edges)


def test_the_detector_finds_circles_of_every_shape(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.sub import thing\n",
        "a.py": "def f():\n    from pkg import b\n",          # function level, submodule by name
        "b.py": "from .a import f\n",                            # relative
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "d.py": "import pkg.c\n",                                # only one way: no circle
        "sub/__init__.py": "from .thing import X\nfrom pkg.sub import helper\n",  # __init__ importing itself
        "sub/thing.py": "from pkg import sub\nX = 1\n",          # sub is a package: edge to its __init__
        "e.py": "import importlib\nimportlib.import_module('pkg.f')\n",
        "f.py": "from pkg.e import nothing\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(discover_modules({"pkg": pkg}))
    found = [sorted({e.source for e in edges}) for edges in import_cycles(graph)]
    assert found == [["pkg.a", "pkg.b"], ["pkg.e", "pkg.f"], ["pkg.sub", "pkg.sub.thing"]]
    sub_edges = {(e.source, e.target, e.line) for e in import_cycles(graph)[2]}
    assert ("pkg.sub", "pkg.sub", 2) in sub_edges


def test_no_import_circles_in_core_and_hf():
    cycles = import_cycles()
    assert not cycles, _report(cycles)


if __name__ == "__main__":
    print(_report(import_cycles()))
