"""Shared fixtures for the twinkle-megatron CPU tests (helpers live in megatron_testing.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
    """A subprocess started in the background; ``wait()`` returns its CompletedProcess-like result."""

    def __init__(self, args: list[str]) -> None:
        import subprocess

        self.args = args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._out: tuple[int, str, str] | None = None

    def wait(self, timeout: float = 300) -> tuple[int, str, str]:
        if self._out is None:
            stdout, stderr = self.proc.communicate(timeout=timeout)
            self._out = (self.proc.returncode, stdout, stderr)
        return self._out


@pytest.fixture(scope="session")
def launches(tmp_path_factory):
    """The two subprocess checks (torchrun TP/DP=2, simulated CUDA path), started together so they overlap.

    Returns ``{name: (launch, output directory)}``; each test module waits for its own launch.
    """

    from megatron_testing import VOCAB_LARGE, hf_model, save_hf, shared_a_adapter

    root = tmp_path_factory.mktemp("launches")
    qwen2 = save_hf(hf_model("qwen2"), root / "qwen2")
    qwen3 = save_hf(hf_model("qwen3"), root / "qwen3")
    large = save_hf(hf_model("qwen2", vocab_size=VOCAB_LARGE), root / "qwen2-large-vocab")
    adapter = shared_a_adapter(root / "adapter")
    tied = save_hf(hf_model("qwen2", tie_word_embeddings=True), root / "qwen2-tied")
    lm_head = shared_a_adapter(root / "adapter-lm-head", lm_head=True)  # saved by peft: with its base lm_head copy
    lm_head_tied = shared_a_adapter(root / "adapter-lm-head-tied", lm_head=True, tie_word_embeddings=True)
    scripts = Path(__file__).parent / "scripts"
    (root / "tp2").mkdir()
    (root / "simulated").mkdir()
    started = {
        "tp2": (_Launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                         str(scripts / "tp2_checks.py"), str(qwen2), str(qwen3), str(adapter), str(large),
                         str(root / "tp2"), str(tied), str(lm_head), str(lm_head_tied)]),
                root / "tp2"),
        "simulated": (_Launch([sys.executable, str(scripts / "simulated_cuda.py"), str(qwen2),
                               str(root / "simulated" / "report.json")]), root / "simulated"),
    }
    yield {**started, "qwen2": qwen2, "qwen3": qwen3, "large": large}
    for launch, _ in started.values():
        if launch.proc.poll() is None:
            launch.proc.kill()
            launch.proc.wait()


_NEEDS_LAUNCHES = ("test_tensor_parallel.py", "test_gpu_path_simulated.py")


@pytest.fixture(autouse=True, scope="session")
def _start_launches_early(request):
    """Start the subprocess checks with the first test when the session includes their modules, so they run
    while the in-process tests do."""
    if any(Path(str(item.fspath)).name in _NEEDS_LAUNCHES for item in request.session.items):
        request.getfixturevalue("launches")
