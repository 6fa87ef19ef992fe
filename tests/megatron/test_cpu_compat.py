"""megatron-core on a CPU-only torch: its ``jit_fuser`` (torch.compile) functions run eagerly.

Inductor would compile C++ for each of them in every process, and under ``ATEN_CPU_CAPABILITY=default``
the code it emits does not compile (Qwen 3.5's gated attention failed with ``CppCompileError``)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the adjustments apply only without CUDA")


def _compiled(fn) -> bool:
    return hasattr(fn, "_torchdynamo_orig_callable")


def test_fusers_run_eagerly_and_disable_puts_back_what_it_changed():
    from megatron.core.transformer import utils
    from megatron.core.transformer.attention import Attention
    from torch._dynamo.utils import counters

    from twinkle_megatron import cpu_compat

    def state() -> tuple[bool, bool]:
        return _compiled(Attention._apply_output_gate), _compiled(utils.gelu_impl)

    cpu_compat.disable()  # megatron's decoration, or eager where a module was first imported under enable()
    before = state()
    cpu_compat.enable()
    try:
        assert state() == (False, False)
        frames = counters["frames"]["total"]
        x, gate = torch.randn(4, 1, 8), torch.randn(4, 1, 8)
        # elementwise formulas: a few float32 roundings of values of size <= 5, within the default rtol 1.3e-6 /
        # atol 1e-5 (the tanh form's cancellation near -3 costs absolute, not relative, accuracy)
        torch.testing.assert_close(Attention._apply_output_gate(None, x, gate), x * torch.sigmoid(gate))
        torch.testing.assert_close(utils.gelu_impl(x), torch.nn.functional.gelu(x, approximate="tanh"))
        assert counters["frames"]["total"] == frames  # dynamo saw no frame: nothing was compiled
    finally:
        cpu_compat.disable()
    assert state() == before
