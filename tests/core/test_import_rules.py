"""The package boundaries of docs/architecture.md: cheap `import twinkle`, no cross-backend imports."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
HEAVY = ("torch", "transformers", "peft", "accelerate", "megatron", "datasets", "ray", "liger_kernel")
BACKENDS = {"twinkle-hf": "twinkle_hf", "twinkle-megatron": "twinkle_megatron", "twinkle-npu": "twinkle_npu"}


def test_import_twinkle_and_listing_components_import_nothing_heavy():
    code = (
        "import sys, json, twinkle, twinkle.model, twinkle.registry, twinkle.cli.main\n"
        "rows = twinkle.registry.list_components()\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "print(json.dumps({'n': len(rows), 'loaded': sorted(top & set(sys.argv[1:]))}))"
    )
    proc = subprocess.run([sys.executable, "-c", code, *HEAVY], capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    assert out["n"] > 30
    assert out["loaded"] == []


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _sources(package_dir: str) -> list[Path]:
    return sorted((PACKAGES / package_dir / "src").rglob("*.py"))


def test_core_never_imports_a_backend():
    offenders = {str(p.relative_to(PACKAGES)): sorted(_imported_modules(p) & set(BACKENDS.values()))
                 for p in _sources("twinkle-core")}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("package", sorted(BACKENDS))
def test_backend_imports_core_but_no_other_backend(package):
    others = set(BACKENDS.values()) - {BACKENDS[package]}
    files = _sources(package)
    assert files, f"{package} has no sources"
    offenders = {str(p.relative_to(PACKAGES)): sorted(_imported_modules(p) & others) for p in files}
    assert {k: v for k, v in offenders.items() if v} == {}
    plugin = PACKAGES / package / "src" / BACKENDS[package] / "plugin.py"
    assert "twinkle" in _imported_modules(plugin)


def test_the_server_reaches_models_through_the_registry_only():
    """twinkle-server calls the TwinkleModel API of whatever model class is registered: no backend imports."""
    files = _sources("twinkle-server")
    assert files, "twinkle-server has no sources"
    offenders = {str(p.relative_to(PACKAGES)): sorted(_imported_modules(p) & set(BACKENDS.values())) for p in files}
    assert {k: v for k, v in offenders.items() if v} == {}


PACKAGE_MODULES = {"twinkle-core": "twinkle", **BACKENDS, "twinkle-server": "twinkle_server"}
# a dotted reference in a string: importlib.import_module("twinkle.x._y"), a lazy spec "twinkle_hf.x:_Y"
_REFERENCE = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)(?::([A-Za-z_]\w*))?$")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_references(source: str, own: str) -> list[str]:
    """Where ``source`` (of package ``own``) reaches into another package's private modules or names.

    Counted: ``import``/``from ... import`` of a module path with an underscore part or of an underscore
    name, attribute reads of underscore names on what was imported from another package, and strings
    naming such a module or name (``importlib.import_module``, lazy registry specs).
    """
    others = set(PACKAGE_MODULES.values()) - {own}
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> what it was imported as, for names from other packages
    tree = ast.parse(source)

    def foreign(module: str) -> bool:
        return module.split(".")[0] in others

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if foreign(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and foreign(node.module):
            for alias in node.names:
                if any(_private(part) for part in node.module.split(".")) or _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _REFERENCE.match(node.value.strip())
            if match and "." in match.group(1) and foreign(match.group(1)):
                parts = [*match.group(1).split("."), *(match.groups()[1:] if match.group(2) else [])]
                if any(_private(part) for part in parts):
                    found.append(f"{node.lineno}: {node.value!r}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.append(f"{node.lineno}: {ast.unparse(node)} ({base.id} is {bound[base.id]})")
    return found


def test_the_private_reference_check_finds_each_form():
    bad = ("from twinkle.trainer import _infra\nfrom twinkle.trainer._validate import ConfigError\n"
           "import twinkle.x._y\nfrom twinkle.runtime import _runtime\nfrom twinkle import runtime\n"
           "runtime._stop_cluster()\nimport importlib\nimportlib.import_module('twinkle.trainer._infra')\n"
           "SPEC = 'twinkle.model.x:_Hidden'\n")
    assert len(private_references(bad, "twinkle_server")) == 7
    fine = ("from twinkle_server._x import y\nfrom twinkle.config import ConfigError\nfrom twinkle import launch\n"
            "launch.start(cfg)\nSPEC = 'twinkle_hf.model:TransformersModel'\nx.__class__\n")
    assert private_references(fine, "twinkle_server") == []


def test_no_package_imports_another_packages_private_modules_or_names():
    """A package uses what another publishes; an underscore module or name is that package's own business."""
    offenders = {}
    for package, module in PACKAGE_MODULES.items():
        for path in _sources(package):
            hits = private_references(path.read_text(encoding="utf-8"), module)
            if hits:
                offenders[str(path.relative_to(PACKAGES))] = hits
    assert offenders == {}
