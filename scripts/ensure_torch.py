"""Install a CPU build of torch into the current environment when it has none.

Runs before the workspace packages are installed (hatch pre-install command). An unpinned
``torch`` requirement makes pip fetch a multi-GB CUDA build; pinning the release that the
machines here carry as a local CPU wheel avoids that. A torch that is already present (any
version that satisfies our ``torch>=2.9``) is left untouched.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

MIN_VERSION = (2, 9)
DEFAULT_SPEC = "torch==2.13.0"


def installed_torch_version() -> tuple[int, ...] | None:
    try:
        raw = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(p) for p in raw.split("+")[0].split(".")[:2] if p.isdigit())


def main() -> int:
    version = installed_torch_version()
    if version is not None and version >= MIN_VERSION:
        print(f"ensure_torch: keeping the installed torch {'.'.join(map(str, version))}")
        return 0
    spec = os.environ.get("TWINKLE_TORCH_SPEC", DEFAULT_SPEC)
    print(f"ensure_torch: installing {spec} (set TWINKLE_TORCH_SPEC to choose another build)")
    return subprocess.call([sys.executable, "-m", "pip", "install", spec])


if __name__ == "__main__":
    raise SystemExit(main())
