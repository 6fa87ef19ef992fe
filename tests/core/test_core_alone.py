"""twinkle-core built and installed by itself: it works, and names the backends it lacks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pluggy
import pytest

CORE = Path(__file__).resolve().parents[2] / "packages" / "twinkle-core"


@pytest.fixture(scope="module")
def core_only(tmp_path_factory) -> Path:
    """A directory holding a wheel install of twinkle-core plus pluggy, and nothing else."""
    target = tmp_path_factory.mktemp("core_only")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(CORE)], check=True)
    package = Path(pluggy.__file__).parent
    shutil.copytree(package, target / "pluggy")
    for info in package.parent.glob("pluggy-*.dist-info"):
        shutil.copytree(info, target / info.name)
    return target


def run_alone(target: Path, *args: str) -> subprocess.CompletedProcess:
    # -S: no site-packages, so neither the backends nor their entry points are visible
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})


def test_core_lists_only_its_own_components(core_only):
    proc = run_alone(core_only, "-m", "twinkle.cli.main", "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    assert {row["distribution"] for row in listing["components"]} == {"twinkle-core"}
    assert listing["failed_plugins"] == {}
    assert (core_only / "twinkle" / "hookspecs.py").is_file()
    assert any(core_only.glob("twinkle_core-*.dist-info"))


def test_core_alone_names_the_missing_backend(core_only):
    code = (
        "import twinkle\n"
        "try:\n    from twinkle.model import TransformersModel\n"
        "except ImportError as e:\n    print(type(e).__name__, '|', e)\n"
    )
    proc = run_alone(core_only, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "MissingBackendError | TransformersModel is provided by twinkle-hf, "
        "which is not installed: pip install twinkle-hf"
    )


def test_console_script_is_installed(core_only):
    script = core_only / "bin" / "twinkle"
    assert script.is_file()
    proc = run_alone(core_only, str(script), "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "twinkle-core 0.1.0"
