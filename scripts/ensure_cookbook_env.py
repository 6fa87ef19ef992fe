"""Create (once) the virtual environment the server tests run tinker-cookbook recipes in: ``.venv-cookbook``.

tinker-cookbook 0.5.8 pins transformers 5.5.x, which the test environment does not have, so its
recipes run in their own environment, as a user's would, against ``twinkle serve`` over HTTP.
torch is installed first (the release on this machine's disk, a CPU build), then the cookbook
constrained to that torch, so pip never fetches a multi-GB CUDA build. ``./dev test`` runs this
before pytest; the cookbook test runs it too (a no-op when the environment is there). Prints the
environment's python.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-cookbook"
TORCH = "torch==2.13.0"
COOKBOOK = "tinker-cookbook[math-rl]==0.5.8"  # math-rl: sympy, pylatexenc, math-verify (rl_loop grades answers)


def python() -> Path:
    return VENV / "bin" / "python"


def ready() -> bool:
    if not python().is_file():
        return False
    check = subprocess.run([str(python()), "-c", "import tinker_cookbook, torch, transformers, math_verify"],
                           capture_output=True)
    return check.returncode == 0


def main() -> int:
    if ready():
        print(python())
        return 0
    print(f"ensure_cookbook_env: creating {VENV} ({COOKBOOK}; a few minutes, once)", file=sys.stderr, flush=True)
    shutil.rmtree(VENV, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(VENV)], check=True)
    pip = [str(python()), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write(TORCH + "\n")
    try:
        subprocess.run([*pip, COOKBOOK, "-c", constraints.name], check=True)
    finally:
        Path(constraints.name).unlink()
    print(python())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
