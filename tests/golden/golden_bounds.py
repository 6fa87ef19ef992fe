"""How far a golden run may move on a machine whose float rounding differs from the recording machine's.

The same code on another CPU (or with another vector width or thread count) runs the same float32 operations
on the same inputs; what differs is how each reduction (a matmul's dot products, a norm, a softmax, a mean,
a gradient's sum over tokens) groups its terms. This module turns that into a relative tolerance per run.

Derivation (``u = 2**-24``, float32's unit roundoff):

1. One step: :mod:`rounding` (``tests/rounding.py``) derives the relative difference of one step's loss or
   gradient between two summation orders, ``Shape.step_bound()`` (``12 u sqrt(3 N + T)``, ~8e-5 for the tiny
   Qwen).
2. Over steps. Under SGD an update is ``lr * gradient`` (momentum and weight decay keep it linear), so a
   gradient off by a relative ``e`` moves the weights by ``e`` of that step's update; to first order that
   changes the next loss and gradient by at most ``e`` of what the step changed them. The error of step
   ``k`` is the fresh rounding of that step plus what the ``k - 1`` steps before it left: ``k * e_step``.
   The bound for a run is that of its last step, ``steps * e_step``, applied to every value it records.
   AdamW (and the Adam of the ``tinker`` protocol, and Megatron's optimizer) divides by ``sqrt(v) + eps``: the
   update of a weight whose gradient is near zero is ``lr * sign(g)``, which a rounding of ``g`` can flip, so
   no bound of this kind holds after its first step. Those runs compare their first step only (its loss and
   gradient norm do not depend on the optimizer) and the learning rates (Python floats); what follows is
   compared bit for bit on the recording's fingerprint only.

Values near zero (GRPO's on-policy first loss) get the same absolute room: ``bound * max(|recorded|, 1)``.
Weight updates are compared through per-tensor statistics of ``d = w_final - w_initial`` recorded with every
SGD run (``l1 = sum|d|``, ``l2 = |d|``, ``sum = sum d``, and ``|w_final|`` as ``w_l1``, ``w_l2``): elementwise
errors of at most ``bound * |d_i|`` move ``l1`` and ``l2`` by at most ``bound * l1`` and ``bound * l2``
(triangle inequality) and ``sum`` by at most ``bound * l1``. Each step also stores its weight in float32, and
which way that rounds (``u * |w_i|``) can differ when the update differs: ``steps * u * w_l1`` (``w_l2`` for
``l2``) is added, see :func:`moved_slack`.

The bound must still let the test fail: :func:`first_step_change` is the first-order change one step makes to
the loss on its own batch (``lr * |g| * min(|g|, clip)`` for SGD, at least ``lr * |g|`` for Adam's first step,
which moves every weight by about ``lr``); ``test_golden`` requires the bound to be at most a tenth of it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: rounding.py (also run as a script)
from rounding import Shape, U, tiny_qwen  # noqa: E402


@dataclass(frozen=True)
class RunBound:
    """What bounds one golden run's difference between machines."""

    shape: Shape
    steps: int  # optimizer steps the run takes (the longest chain, e.g. 6 for save + resume)
    optimizer: Literal["sgd", "adam"]
    lr: float  # the first step's learning rate
    clip: float | None  # max_grad_norm of the first step

    @property
    def rel(self) -> float:
        """The run's relative tolerance: ``steps`` steps of rounding under SGD, the first step under Adam."""
        return self.shape.step_bound() * (self.steps if self.optimizer == "sgd" else 1)

    def moved_slack(self, update_norm: float, weight_norm: float) -> float:
        """Room for an update statistic of norm ``update_norm`` on weights of norm ``weight_norm`` (same norm)."""
        return self.rel * update_norm + self.steps * U * weight_norm

    def first_step_change(self, grad_norm: float) -> float:
        """First-order change of the loss on the first step's batch caused by that step."""
        if self.optimizer == "adam":
            return self.lr * grad_norm  # every weight moves by ~lr: sum |g_i| * lr >= |g| * lr
        clipped = grad_norm if self.clip is None else min(grad_norm, self.clip)
        return self.lr * grad_norm * clipped


#: The embedded tiny Qwen (``twinkle://tiny-qwen``) on ``token_batch`` rows (4 x 24 tokens).
TINY = tiny_qwen(seq=24, rows=4)
#: ``hf_full``'s Qwen2 from a config in code (vocab 257).
FULL = Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=257, seq=24, tokens=96)
#: Accumulation: micro-batches of up to 4 rows x 21 tokens; one step's gradient sums 4 of them (<= 336 tokens).
ACCUMULATION = tiny_qwen(seq=21, rows=16)
#: Preference rows: 6 rows (3 pairs) of at most 13 tokens.
PREFERENCE = tiny_qwen(seq=13, rows=6)
#: GRPO: 12 samples of a prompt (<= 5 tokens) and 6 sampled tokens.
GRPO = tiny_qwen(seq=11, rows=12)
#: The tiny Qwen2.5-VL: a 64x64 image is 16 patches of 3 x 2 x 14 x 14 = 1176 values (the patch embedding),
#: then 2 vision layers (hidden 32, MLP 64) and the merger (4 x 32 -> 64); rows of at most 64 tokens.
VL = Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=2594, seq=64, tokens=256,
           extra=1176 + 2 * (3 * 32 + 16 + 2 * 16 + 32 + 32 + 64 + 2 * 32) + 4 * 32 + 128)
#: `twinkle train`: self-cognition rows of at most 128 tokens, 4 rows a step (a generous over-estimate).
CLI = tiny_qwen(seq=128, rows=4)
#: The service: 3 texts of at most 24 tokens.
SERVE = tiny_qwen(seq=24, rows=3)

#: One entry per golden run; the learning rates and clips are the ones ``make_golden.py`` trains with.
BOUNDS: dict[str, RunBound] = {
    "hf_lora": RunBound(TINY, steps=4, optimizer="sgd", lr=0.5, clip=0.5),
    "hf_full": RunBound(FULL, steps=4, optimizer="sgd", lr=0.05, clip=1.0),
    "hf_accumulation_4x2": RunBound(ACCUMULATION, steps=2, optimizer="sgd", lr=0.5, clip=1.0),
    "hf_resume_fp32": RunBound(TINY, steps=6, optimizer="sgd", lr=0.3, clip=1.0),
    "multi_lora_batched": RunBound(TINY, steps=3, optimizer="sgd", lr=0.3, clip=1.0),
    "grpo": RunBound(GRPO, steps=3, optimizer="sgd", lr=0.5, clip=1.0),
    "dpo": RunBound(PREFERENCE, steps=3, optimizer="sgd", lr=0.5, clip=1.0),
    "vl_lora": RunBound(VL, steps=2, optimizer="sgd", lr=0.2, clip=1.0),
    "megatron_lora_tp1": RunBound(TINY, steps=4, optimizer="sgd", lr=0.3, clip=1.0),
    "ddp_lora": RunBound(TINY, steps=3, optimizer="sgd", lr=0.5, clip=1.0),
    "fsdp2_lora": RunBound(TINY, steps=3, optimizer="sgd", lr=0.5, clip=1.0),
    "accelerate_fsdp2": RunBound(TINY, steps=3, optimizer="sgd", lr=0.05, clip=1.0),
    "megatron_lora_tp2": RunBound(TINY, steps=4, optimizer="sgd", lr=0.3, clip=1.0),
    "cli_train": RunBound(CLI, steps=8, optimizer="adam", lr=4.8e-3, clip=1.0),
    "serve_sft": RunBound(SERVE, steps=3, optimizer="adam", lr=5e-3, clip=None),
}

#: Record keys that are per-step lists: under Adam only their first item is compared across machines.
STEP_KEYS = ("losses", "step_loss", "grad_norms")
#: Record keys never compared across machines: an argmax (token accuracy) jumps with rounding near a tie,
#: and an evaluation after Adam's steps is not bounded (see above).
DISCONTINUOUS_KEYS = ("token_accuracy", "eval_loss")
