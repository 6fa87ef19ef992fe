"""Fixtures of the family matrix: every seed-001 language family written once as a tiny model directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# remote code (GLM-4 / InternLM2 tokenizers, the InternLM2 model) is copied into transformers' modules
# cache; keep it out of the user's home
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="twinkle-families-modules-"))
sys.path.insert(0, str(Path(__file__).parent))  # family_testing, imported by the test modules


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:Transformer Engine and Apex are not installed:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore:.*is_gradient_checkpointing.*:FutureWarning")


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TWINKLE_DEVICE", "cpu")


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    """``{family key: model directory}`` for every family of :data:`family_testing.FAMILIES`."""
    from family_testing import FAMILIES, write_model

    root = tmp_path_factory.mktemp("families")
    return {key: write_model(family, root / key) for key, family in FAMILIES.items()}


@pytest.fixture(autouse=True, scope="package")
def _leave_torch_cuda_as_found():
    """MegatronModel's CPU-compatibility module patches torch.cuda.current_device; undo it after this package."""
    yield
    if "twinkle_megatron" in sys.modules:
        from twinkle_megatron import cpu_compat

        cpu_compat.disable()


@pytest.fixture(scope="session")
def megatron_dirs(family_dirs, tmp_path_factory) -> dict[str, Path]:
    from family_testing import MEGATRON_CPU, megatron_dir

    root = tmp_path_factory.mktemp("megatron-families")
    return {name: megatron_dir(name, root, family_dirs) for name in MEGATRON_CPU}


class _Launch:
    """The torchrun launch of scripts/megatron_tp2.py, in the background (``start_background``,
    tests/conftest.py); ``reports()`` waits for its rank files."""

    def __init__(self, proc: subprocess.Popen, out: Path) -> None:
        self.out = out
        self.proc = proc
        self._reports: list[dict] | None = None

    def reports(self) -> list[dict]:
        if self._reports is None:
            _, stderr = self.proc.communicate(timeout=500)
            (self.out / "stderr.log").write_text(stderr)
            errors = "\n".join(line for line in stderr.splitlines() if "Error" in line)
            assert self.proc.returncode == 0, f"{errors[-3000:]}\n...\n{stderr[-3000:]}"
            self._reports = [json.loads((self.out / f"rank{r}.json").read_text()) for r in range(2)]
        return self._reports


@pytest.fixture(scope="session")
def tp2(megatron_dirs, tmp_path_factory, start_background):
    out = tmp_path_factory.mktemp("families-tp2")
    (out / "dirs.json").write_text(json.dumps({k: str(v) for k, v in megatron_dirs.items()}))
    script = Path(__file__).parent / "scripts" / "megatron_tp2.py"
    return _Launch(start_background([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     "--nproc_per_node=2", str(script), str(out), str(out / "dirs.json")]), out)


@pytest.fixture(autouse=True, scope="session")
def _start_tp2_early(request):
    """Start the TP=2 launch with the first test when the session includes the Megatron checks (one process;
    under pytest-xdist every worker sees every item, and the worker that runs them starts it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any(Path(str(item.fspath)).name == "test_family_megatron.py" for item in request.session.items):
        request.getfixturevalue("tp2")
