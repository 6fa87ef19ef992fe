"""Shared fixtures for the twinkle-megatron CPU tests (helpers live in megatron_testing.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # megatron_testing, imported by the test modules

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pytest_configure(config: pytest.Config) -> None:
    # megatron-core warns at import that Apex/Transformer Engine are absent; that is this machine, not a bug
    config.addinivalue_line("filterwarnings", "ignore:Transformer Engine and Apex are not installed:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning:megatron")


@pytest.fixture(autouse=True, scope="package")
def _leave_torch_cuda_as_found():
    """MegatronModel's CPU-compatibility module patches torch.cuda.current_device; undo it after this package."""
    yield
    from twinkle_megatron import cpu_compat

    cpu_compat.disable()


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TWINKLE_DEVICE"):
        monkeypatch.delenv(var, raising=False)


class _Launch:
    """A subprocess started in the background (``start_background``, tests/conftest.py); ``wait()`` returns
    its CompletedProcess-like result."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self._out: tuple[int, str, str] | None = None

    def wait(self, timeout: float = 300) -> tuple[int, str, str]:
        if self._out is None:
            stdout, stderr = self.proc.communicate(timeout=timeout)
            self._out = (self.proc.returncode, stdout, stderr)
        return self._out


class _Launches:
    """The two subprocess checks (torchrun TP/DP=2, simulated CUDA path), each started on first use.

    ``launches["tp2"]`` / ``launches["simulated"]``: ``(launch, output directory)``; ``launches["qwen2"]``,
    ``["qwen3"]``, ``["large"]``: the saved HF models they (and the in-process comparisons) read. A run on
    one process starts both with the session's first test so that they overlap the in-process tests;
    under pytest-xdist each starts in the worker whose test asks for it (no launch runs twice).
    """

    def __init__(self, root: Path, start: Any) -> None:
        self.root = root
        self.start = start
        self._models: dict[str, Path] | None = None
        self._started: dict[str, tuple[_Launch, Path]] = {}

    def _saved_models(self) -> dict[str, Path]:
        if self._models is None:
            from megatron_testing import VOCAB_LARGE, hf_model, save_hf, shared_a_adapter

            root = self.root
            self._models = {
                "qwen2": save_hf(hf_model("qwen2"), root / "qwen2"),
                "qwen3": save_hf(hf_model("qwen3"), root / "qwen3"),
                "large": save_hf(hf_model("qwen2", vocab_size=VOCAB_LARGE), root / "qwen2-large-vocab"),
                "adapter": shared_a_adapter(root / "adapter"),
                "tied": save_hf(hf_model("qwen2", tie_word_embeddings=True), root / "qwen2-tied"),
                # saved by peft: with its base lm_head copy
                "lm_head": shared_a_adapter(root / "adapter-lm-head", lm_head=True),
                "lm_head_tied": shared_a_adapter(root / "adapter-lm-head-tied", lm_head=True,
                                                 tie_word_embeddings=True),
            }
        return self._models

    def _start(self, name: str) -> tuple[_Launch, Path]:
        m = self._saved_models()
        scripts = Path(__file__).parent / "scripts"
        out = self.root / name
        out.mkdir()
        if name == "tp2":
            return _Launch(self.start([
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                str(scripts / "tp2_checks.py"), str(m["qwen2"]), str(m["qwen3"]), str(m["adapter"]), str(m["large"]),
                str(out), str(m["tied"]), str(m["lm_head"]), str(m["lm_head_tied"])])), out
        return _Launch(self.start([sys.executable, str(scripts / "simulated_cuda.py"), str(m["qwen2"]),
                                   str(out / "report.json")])), out

    def __getitem__(self, name: str):
        if name in ("tp2", "simulated"):
            if name not in self._started:
                self._started[name] = self._start(name)
            return self._started[name]
        return self._saved_models()[name]

    def start_all(self) -> None:
        for name in ("tp2", "simulated"):
            self[name]


@pytest.fixture(scope="session")
def launches(tmp_path_factory, start_background):
    """The subprocess checks of test_tensor_parallel.py and test_gpu_path_simulated.py (see _Launches)."""
    return _Launches(tmp_path_factory.mktemp("launches"), start_background)


_NEEDS_LAUNCHES = ("test_tensor_parallel.py", "test_gpu_path_simulated.py")


@pytest.fixture(autouse=True, scope="session")
def _start_launches_early(request):
    """Start the subprocess checks with the first test when the session includes their modules, so they run
    while the in-process tests do."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sees every item; the tests start what they use
        return
    if any(Path(str(item.fspath)).name in _NEEDS_LAUNCHES for item in request.session.items):
        request.getfixturevalue("launches").start_all()
