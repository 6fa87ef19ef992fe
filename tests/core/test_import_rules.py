"""The package boundaries of docs/architecture.md: cheap `import twinkle`, no cross-backend imports."""

from __future__ import annotations

import ast
import json
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
