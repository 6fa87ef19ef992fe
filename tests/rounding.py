"""How far float32 rounding can move a training step's numbers when only the order of its sums changes.

Another CPU model, vector width (``ATEN_CPU_CAPABILITY``), thread count, process layout (DDP, FSDP, a Ray
actor) or kernel runs the same float32 operations on the same inputs; what differs is how each reduction (a
matmul's dot products, a norm, a softmax, a mean, a gradient's sum over tokens) groups its terms. Tests that
compare such runs take their tolerance from here instead of measuring one (``u = 2**-24``, float32's unit
roundoff):

1. One sum of ``n`` terms. Each addition rounds with a relative error ``|d| <= u``. Treating these errors as
   independent and mean-zero (the probabilistic rounding-error model of Higham & Mary, SIAM J. Sci. Comput.
   41(5), 2019), the computed sum differs from the exact one by at most ``LAMBDA * sqrt(n) * u * sum|x_i|``
   with probability at least ``1 - 2 exp(-LAMBDA**2 / 2)``; ``LAMBDA = 6`` makes that ``1 - 3e-8`` per value.
   Two machines' orders each satisfy it, so they differ by at most twice that; the 2 is kept in ``LAMBDA_2``.
2. A whole step. To first order the relative errors of the reductions along the longest dependency path add,
   and independent errors add in quadrature: ``sqrt(N)`` with ``N`` the total number of terms summed along
   that path. The forward path of a decoder layer sums ``hidden`` terms for each of q/k/v (their input),
   ``head_dim`` for the scores, ``seq`` for the softmax and ``seq`` for the weighted values, ``hidden`` for
   o_proj, ``hidden`` for gate/up, ``intermediate`` for down, and ``hidden`` for each of its two RMSNorms;
   then the final norm and the LM head (``hidden`` each), the log-sum-exp over ``vocab`` and the mean over the
   step's ``tokens``. The backward pass sums, for every forward reduction, one reduction of the same length
   for the input's gradient and one for the weight's (over the step's ``tokens``): ``3 N_forward + tokens``
   bounds the path of a gradient. A vision tower adds its patch embedding (``extra``).
   ``condition`` (the ratio ``sum|x_i| / |sum x_i|`` of the values compared) is taken as 1: the compared
   values are losses, norms and weight-update norms, sums of terms of one sign or dominated by them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

U = 2.0**-24
LAMBDA = 6.0
LAMBDA_2 = 2 * LAMBDA  # two machines, each within LAMBDA * sqrt(n) * u of the exact value
#: bfloat16's unit roundoff (8 significand bits): the GPU tests' mixed precision rounds each op's float32 result
#: to bf16, within U_BF16 relative; two roundings of nearly the same float32 value differ by at most one bf16
#: ulp, 2 * U_BF16 relative
U_BF16 = 2.0**-8


@dataclass(frozen=True)
class Shape:
    """The reduction lengths of one training step of a decoder (per step: the largest micro-batch)."""

    hidden: int
    intermediate: int
    head_dim: int
    layers: int
    vocab: int
    seq: int
    tokens: int
    extra: int = 0  # terms summed before the decoder (a vision tower's patch embedding and layers)

    def forward_terms(self) -> int:
        layer = 3 * self.hidden + self.head_dim + 2 * self.seq + self.hidden + self.hidden + self.intermediate
        layer += 2 * self.hidden  # the two RMSNorms
        return self.extra + self.layers * layer + 2 * self.hidden + self.vocab + self.tokens

    def forward_bound(self) -> float:
        """Relative difference of a forward's loss or logits between two summation orders."""
        return LAMBDA_2 * U * math.sqrt(self.forward_terms())

    def step_bound(self) -> float:
        """Relative difference of one step's loss or gradient between two summation orders."""
        return LAMBDA_2 * U * math.sqrt(3 * self.forward_terms() + self.tokens)


#: The embedded tiny Qwen (``twinkle://tiny-qwen``: hidden 64, MLP 128, head_dim 16, 2 layers, vocab 2590) on
#: ``rows`` rows of at most ``seq`` tokens.
def tiny_qwen(seq: int, rows: int) -> Shape:
    return Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=2590, seq=seq, tokens=seq * rows)


#: The tests' ``hf_testing.tiny_config`` models (hidden 64, MLP 128, head_dim 16, 2 layers, vocab 128); ``extra``
#: for terms a variant adds along the path (a LoRA adds ``r`` per adapted projection: 7 per layer at most).
def tiny_hf(seq: int, rows: int, vocab: int = 128, extra: int = 0) -> Shape:
    return Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=vocab, seq=seq, tokens=seq * rows,
                 extra=extra)


#: Terms every LoRA (rank at most 16) can add along a forward of the tiny models: 7 projections x 2 layers x 16.
LORA_TERMS = 7 * 2 * 16


def chain_bound(*lengths: int) -> float:
    """Relative difference between two summation orders of a chain of reductions of these lengths (1. and 2.)."""
    return LAMBDA_2 * U * math.sqrt(sum(lengths))


def within(rel: float, want, terms: int = 128) -> dict[str, float]:
    """``assert_close`` arguments for comparing a tensor elementwise within the relative bound ``rel``.

    ``rel`` bounds a value's error relative to the sum of the absolute values of its terms (1.), which for an
    element of a logit, activation or gradient is not the element itself: its terms have either sign. Each
    element is the last of a chain of dot products of at most ``terms`` terms (the tiny models: hidden 64, MLP
    128, a step's tokens), where ``sum |x_i| <= sqrt(terms) * |x|_2`` (Cauchy-Schwarz); for terms of either sign
    ``|x|_2`` is the typical size of their sum, which the tensor's largest element bounds: ``atol = rel *
    sqrt(terms) * max |want|``. A mistake (a lost term, scale, row or adapter) moves values by ``max |want|``."""
    return {"rtol": rel, "atol": rel * math.sqrt(terms) * float(want.detach().abs().max())}
