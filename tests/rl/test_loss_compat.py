"""Upstream Twinkle's loss names, constructor arguments and per-call options, each against its formula.

References are written from the papers with plain loops over sequences (as in test_loss_formulas), in every
batch layout; the tolerance is that file's (float64 throughout: 1e-6 leaves room for summation order only).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rl_testing import LAYOUTS, logprobs_of, make_sequences
from rounding import chain_bound, within
from test_loss_formulas import TOL, _applied, _pairs, _sequence_logp, ref_dpo, ref_grpo, ref_ipo

from twinkle.loss import (
    ChunkedCrossEntropyLoss,
    CPOLoss,
    CrossEntropyLoss,
    DPOLoss,
    DRGRPOLoss,
    DrGRPOLoss,
    GKDLoss,
    GRPOLoss,
    LossOutput,
    MSELoss,
    ORPOLoss,
    PPOLoss,
    SAPOLoss,
)
from twinkle.registry import resolve


# ------------------------------------------------------------------ references
def ref_cpo(seqs, beta=0.1, bc_coef=1.0, **_):
    """Xu et al. 2024: -log sigma(beta log pi(yw) - beta log pi(yl)) + bc_coef * NLL(yw) (per-token mean)."""
    losses = []
    for w, lo in _pairs(seqs):
        (pw, nw), (pl, _) = _sequence_logp(w), _sequence_logp(lo)
        losses.append(-torch.log(torch.sigmoid(beta * (pw - pl))) - bc_coef * pw / nw)
    return sum(losses) / len(losses)


def ref_dpo_hinge(seqs, beta=0.1, **_):
    """SLiC's hinge on DPO's margin: max(0, 1 - beta ((pi_w - ref_w) - (pi_l - ref_l)))."""
    losses = []
    for w, lo in _pairs(seqs):
        (pw, _), (pl, _) = _sequence_logp(w), _sequence_logp(lo)
        (rw, _), (rl, _) = _sequence_logp(w, w.ref), _sequence_logp(lo, lo.ref)
        losses.append(torch.clamp(1 - beta * ((pw - rw) - (pl - rl)), min=0))
    return sum(losses) / len(losses)


def ref_dpo_reference_free_sft(seqs, beta=0.1, sft_weight=0.0, **_):
    losses = []
    for w, lo in _pairs(seqs):
        (pw, nw), (pl, _) = _sequence_logp(w), _sequence_logp(lo)
        losses.append(-torch.log(torch.sigmoid(beta * (pw - pl))) - sft_weight * pw / nw)
    return sum(losses) / len(losses)


def ref_dpo_sft(seqs, beta=0.1, sft_weight=0.0, **_):
    nll = [-_sequence_logp(w)[0] / _sequence_logp(w)[1] for w, _ in _pairs(seqs)]
    return ref_dpo(seqs, beta=beta) + sft_weight * sum(nll) / len(nll)


def ref_sapo(seqs, tau_pos=1.0, tau_neg=1.0, **_):
    """Gao et al. 2025: per token f(r) A, f(r) = 4 / tau sigmoid(tau (r - 1)); GRPO's sequence means."""
    per_sequence = []
    for s in seqs:
        lp = logprobs_of(s)
        terms = []
        for t in range(len(lp)):
            if s.weights[t] == 0:
                continue
            r = torch.exp(lp[t] - s.q[t])
            tau = tau_pos if s.A[t] > 0 else tau_neg
            terms.append(4 / tau * torch.sigmoid(tau * (r - 1)) * s.A[t])
        per_sequence.append(sum(terms) / len(terms))
    return -sum(per_sequence) / len(seqs)


def ref_grpo_entropy(seqs, coef=0.0, **_):
    """GRPO's sequence means of (surrogate + coef * H_t), H_t the entropy of position t's distribution."""
    per_sequence = []
    for s in seqs:
        lp = logprobs_of(s)
        terms = []
        for t in range(len(lp)):
            if s.weights[t] == 0:
                continue
            r = torch.exp(lp[t] - s.q[t])
            p = torch.softmax(s.logits[t], dim=0)
            entropy = -(p * torch.log(p)).sum()
            terms.append(torch.min(r * s.A[t], torch.clamp(r, 0.8, 1.2) * s.A[t]) + coef * entropy)
        per_sequence.append(sum(terms) / len(terms))
    return -sum(per_sequence) / len(seqs)


PAIR_FIELDS = ("weights", "ref_logprobs")
CASES = [
    ("cpo", CPOLoss(beta=0.3, bc_coef=0.5), ref_cpo, dict(beta=0.3, bc_coef=0.5), ("weights",), {}),
    ("dpo_hinge", DPOLoss(beta=0.5, loss_type="hinge"), ref_dpo_hinge, dict(beta=0.5), PAIR_FIELDS, {}),
    ("dpo_ipo", DPOLoss(beta=0.5, loss_type="ipo"), ref_ipo, dict(beta=0.5), PAIR_FIELDS, {}),
    ("dpo_free_sft", DPOLoss(beta=0.5, reference_free=True, sft_weight=0.2), ref_dpo_reference_free_sft,
     dict(beta=0.5, sft_weight=0.2), ("weights",), {}),
    ("dpo_sft", DPOLoss(beta=0.5, sft_weight=0.2), ref_dpo_sft, dict(beta=0.5, sft_weight=0.2), PAIR_FIELDS, {}),
    ("sapo", SAPOLoss(tau_pos=1.0, tau_neg=1.05), ref_sapo, dict(tau_pos=1.0, tau_neg=1.05),
     ("weights", "logprobs", "advantages"), {}),
    ("grpo_epsilon", GRPOLoss(epsilon=0.1, epsilon_high=0.3), ref_grpo, dict(low=0.9, high=1.3),
     ("weights", "logprobs", "advantages"), {}),
    ("grpo_entropy", GRPOLoss(entropy_coef=0.05), ref_grpo_entropy, dict(coef=0.05),
     ("weights", "logprobs", "advantages"), {}),
]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name,loss,reference,kwargs,fields,options", CASES, ids=[c[0] for c in CASES])
def test_loss_matches_its_formula(name, loss, reference, kwargs, fields, options, layout):
    seqs = make_sequences(seed=len(name) * 7 + 3, count=6, **options)
    noise = torch.Generator().manual_seed(11)
    for s in seqs:  # ratios away from 1, so gates and bounds act
        s.q = torch.where(s.weights != 0, logprobs_of(s).detach() + 0.4 * torch.randn(
            s.q.shape, generator=noise, dtype=s.q.dtype), s.q)
    expected = reference(seqs, **kwargs)
    expected.backward()
    expected_grads = [s.logits.grad.clone() for s in seqs]
    for s in seqs:
        s.logits.grad = None
    got = _applied(loss, *LAYOUTS[layout](seqs, fields))
    got.backward()
    torch.testing.assert_close(got, expected.to(got.dtype), **TOL)
    for k, s in enumerate(seqs):
        torch.testing.assert_close(s.logits.grad, expected_grads[k], **TOL, msg=f"sequence {k} gradient")


def test_per_call_fields_equal_the_same_fields_in_the_batch():
    seqs = make_sequences(seed=5, count=4, per_sequence_advantage=True)
    inputs, outputs = LAYOUTS["tinker_padded"](seqs, ("weights", "logprobs", "advantages", "ref_logprobs"))
    in_batch = GRPOLoss(beta=0.1).compute(inputs, outputs)[0]
    bare = {k: inputs[k] for k in ("target_tokens", "attention_mask", "weights")}
    first = torch.tensor([float(s.A[s.weights != 0][0]) for s in seqs])  # one advantage per sequence
    for advantages in (first, first[:, None], inputs["advantages"]):  # per sequence, a column, per token
        per_call = GRPOLoss(beta=0.1).compute(bare, outputs, advantages=advantages, old_logps=inputs["logprobs"],
                                              ref_logps=inputs["ref_logprobs"])[0]
        torch.testing.assert_close(per_call, in_batch, **TOL)
    # DPO's reference as one sequence sum per pair instead of per-token log-probabilities
    pairs = make_sequences(seed=6, count=4)
    inputs, outputs = LAYOUTS["labels"](pairs, PAIR_FIELDS)
    refs = torch.tensor([float(_sequence_logp(s, s.ref)[0]) for s in pairs], dtype=torch.float64)
    given = DPOLoss(beta=0.5).compute({k: v for k, v in inputs.items() if k != "ref_logprobs"}, outputs,
                                      ref_chosen_logps=refs[0::2], ref_rejected_logps=refs[1::2])[0]
    torch.testing.assert_close(given, DPOLoss(beta=0.5).compute(inputs, outputs)[0], **TOL)


def test_grpo_without_sampler_logprobs_is_on_policy():
    seqs = make_sequences(seed=8, count=3)
    for s in seqs:
        s.q = logprobs_of(s).detach()
    with_q = _applied(GRPOLoss(), *LAYOUTS["tinker_padded"](seqs, ("weights", "logprobs", "advantages")))
    without = _applied(GRPOLoss(), *LAYOUTS["tinker_padded"](seqs, ("weights", "advantages")))
    torch.testing.assert_close(without, with_q, **TOL)


def test_upstream_constructor_names():
    assert (GRPOLoss(epsilon=0.2).low, GRPOLoss(epsilon=0.2).high) == (0.8, 1.2)
    assert (GRPOLoss(clip_range=0.1).low, PPOLoss(epsilon=0.3, epsilon_high=0.4).high) == (0.9, 1.4)
    assert ORPOLoss(lambda_orpo=0.3).beta == 0.3 and DRGRPOLoss is DrGRPOLoss
    assert DrGRPOLoss(max_completion_length=12).max_tokens == 12
    assert SAPOLoss(tau=2.0).tau_neg == 2.0 and DPOLoss(reference_free=True).needs_reference is False
    for name in ("cpo", "sapo", "MSELoss", "GKDLoss", "ChunkedCrossEntropyLoss"):
        assert resolve("loss", name) is not None


@pytest.mark.parametrize("build, message", [
    (lambda: DPOLoss(loss_type="kto_pair"), "kto_pair' is not supported"),
    (lambda: DPOLoss(loss_type="robust"), "Unknown loss_type 'robust'"),
    (lambda: DPOLoss(label_smoothing=0.1, loss_type="hinge"), "label_smoothing=0.1 applies to loss_type='sigmoid'"),
    (lambda: GRPOLoss(epsilon=0.2, clip_range=0.3), "name the same bound"),
    (lambda: SAPOLoss(tau_neg=0), "tau_neg must be > 0"),
    (lambda: GKDLoss(beta=1.5), "beta must be in"),
    (lambda: ChunkedCrossEntropyLoss(chunk_size=0), "chunk_size must be an integer >= 1"),
])
def test_bad_arguments_are_named(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_per_call_field_of_the_wrong_shape_is_refused():
    seqs = make_sequences(seed=2, count=3)
    inputs, outputs = LAYOUTS["tinker_padded"](seqs, ("weights", "logprobs"))
    with pytest.raises(ValueError, match=r"advantages= has shape \(2,\); .* one per sequence \(3 in this batch\)"):
        GRPOLoss().compute(inputs, outputs, advantages=torch.ones(2))
    with pytest.raises(TypeError, match=r"no call options \['temperature'\]"):
        GRPOLoss().compute(inputs, outputs, temperature=1.0)


# ------------------------------------------------------------------ cross-entropy family, MSE, GKD
#: the cross-entropy losses compute in float32: sums of 14 token terms (~3 each) in different orders differ by
#: at most ~14 roundings of 2**-24 relative each (~1e-6), so 1e-5 bounds it with margin
FP32 = dict(rtol=1e-5, atol=1e-6)

def _label_batch(seed=0, rows=3, length=7, vocab=13):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, length, vocab, generator=gen, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, vocab, (rows, length), generator=gen)
    labels[:, :2] = -100
    labels[0, -1] = -100
    return {"labels": labels}, logits


def test_calling_a_loss_returns_upstreams_loss_output():
    inputs, logits = _label_batch()
    out = CrossEntropyLoss()(inputs, {"logits": logits})
    total, items = CrossEntropyLoss().compute(inputs, {"logits": logits})
    assert isinstance(out, LossOutput) and set(out) == {"loss", "num_tokens"}
    torch.testing.assert_close(out["loss"], total / items)
    assert int(out["num_tokens"]) == int(items) == 5 + 5 + 4  # the trained labels: rows 1, 2 have 5, row 0 has 4
    assert torch.equal(CrossEntropyLoss(reduction="sum")(inputs, {"logits": logits})["loss"], total)


def test_chunked_cross_entropy_equals_cross_entropy_with_its_gradient():
    inputs, logits = _label_batch(seed=1)
    plain = CrossEntropyLoss()(inputs, {"logits": logits})["loss"]
    (grad,) = torch.autograd.grad(plain, logits)
    for chunk in (1, 4, 100):
        chunked = ChunkedCrossEntropyLoss(chunk_size=chunk)(inputs, {"logits": logits})["loss"]
        (chunk_grad,) = torch.autograd.grad(chunked, logits)
        torch.testing.assert_close(chunked, plain, **FP32)
        # float32 softmax over the 13 logits of a row and the mean's 1 / 14, either path (tests/rounding.py),
        # elementwise by within() over the row's terms
        torch.testing.assert_close(chunk_grad, grad, **within(chain_bound(13, 14), grad, terms=13))


def test_cross_entropy_reads_token_aligned_logps():
    inputs, logits = _label_batch(seed=2)
    labels = inputs["labels"]
    # logps[:, t] = log p(labels[:, t]) as scored by logits[:, t - 1]; position 0 predicts nothing
    logp_all = F.log_softmax(logits, dim=-1)
    logps = torch.zeros(labels.shape, dtype=torch.float64)
    for r in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if labels[r, t] != -100:
                logps[r, t] = logp_all[r, t - 1, labels[r, t]]
    # the loss computes in float32 either way (FP32 below: a sum of 14 terms in another order)
    torch.testing.assert_close(CrossEntropyLoss()(inputs, {"logps": logps})["loss"],
                               CrossEntropyLoss()(inputs, {"logits": logits})["loss"], **FP32)


def test_dft_weighs_each_token_by_its_detached_probability():
    inputs, logits = _label_batch(seed=3)
    targets = F.pad(inputs["labels"], (0, 1), value=-100)[:, 1:]
    trained = targets != -100
    logp = F.log_softmax(logits, dim=-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    expected = (-(logp.exp().detach() * logp))[trained].sum() / trained.sum()
    got = CrossEntropyLoss(dft=True)(inputs, {"logits": logits})["loss"]
    torch.testing.assert_close(got, expected.float(), **FP32)
    g1, = torch.autograd.grad(got, logits)
    g2, = torch.autograd.grad(expected, logits)
    # the float32 path's softmax over 13 logits and mean over 14 tokens against float64 (~exact), elementwise
    torch.testing.assert_close(g1, g2, **within(chain_bound(13, 14), g2, terms=13))


def test_mse_is_the_mean_squared_difference():
    out = MSELoss()({"labels": torch.tensor([[3.0, 5.0]])}, {"logits": torch.tensor([[1.0, 2.0]])})
    assert out["loss"].item() == pytest.approx((4 + 9) / 2) and int(out["num_tokens"]) == 2
    with pytest.raises(ValueError, match=r"shape \(1, 2\) but the labels \(2,\)"):
        MSELoss()({"labels": torch.zeros(2)}, {"logits": torch.zeros(1, 2)})


def _gkd_reference(student, teacher, trained, beta, temperature):
    """Generalised JSD with probabilities (not log-probabilities), float64, loop over positions."""
    total, count = 0.0, 0
    s_all = torch.softmax(student / temperature, dim=-1)
    t_all = torch.softmax(teacher / temperature, dim=-1)
    for r in range(student.shape[0]):
        for t in range(student.shape[1]):
            if not trained[r, t]:
                continue
            s, q = s_all[r, t], t_all[r, t]
            if beta == 0:
                value = (q * (q / s).log()).sum()
            elif beta == 1:
                value = (s * (s / q).log()).sum()
            else:
                m = beta * q + (1 - beta) * s
                value = beta * (q * (q / m).log()).sum() + (1 - beta) * (s * (s / m).log()).sum()
            total, count = total + value, count + 1
    return total / count


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_gkd_is_the_generalised_jsd_to_the_teacher(beta):
    inputs, student = _label_batch(seed=4)
    teacher = torch.randn(student.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    trained = F.pad(inputs["labels"], (0, 1), value=-100)[:, 1:] != -100
    expected = _gkd_reference(student, teacher, trained, beta, temperature=2.0)
    got = GKDLoss(beta=beta, temperature=2.0, chunk_size=5)(inputs, {"logits": student}, teacher_logits=teacher)
    torch.testing.assert_close(got["loss"], expected, rtol=1e-10, atol=1e-12)
    g1, = torch.autograd.grad(got["loss"], student)
    g2, = torch.autograd.grad(expected, student)
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)
    same = GKDLoss(beta=beta)(inputs, {"logits": student.detach(), "teacher_logits": student.detach()})["loss"]
    assert abs(float(same)) < 1e-12
    with pytest.raises(KeyError, match="needs the teacher's logits"):
        GKDLoss(beta=beta)(inputs, {"logits": student})


def test_gkd_on_the_teachers_top_k_tokens_renormalises_both_there():
    inputs, student = _label_batch(seed=5)
    teacher = torch.randn(student.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    trained = F.pad(inputs["labels"], (0, 1), value=-100)[:, 1:] != -100
    top = teacher.topk(4, dim=-1)
    # the reference: both distributions restricted to the teacher's 4 tokens, as logits over those 4
    expected = _gkd_reference(student.gather(-1, top.indices), top.values, trained, 0.4, temperature=1.5)
    cut = GKDLoss(beta=0.4, temperature=1.5, topk=4)(inputs, {"logits": student}, teacher_logits=teacher)["loss"]
    logprobs = torch.log_softmax(teacher, dim=-1).gather(-1, top.indices)  # what an API teacher returns
    api = GKDLoss(beta=0.4, temperature=1.5)(inputs, {"logits": student}, teacher_topk_logprobs=logprobs,
                                             teacher_topk_indices=top.indices)["loss"]
    torch.testing.assert_close(cut, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(api, expected, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="give both teacher_topk_logprobs= and teacher_topk_indices="):
        GKDLoss()(inputs, {"logits": student}, teacher_topk_logprobs=logprobs)


def test_flat_labels_are_read_as_aligned():
    """Flat (tokens,) labels with (tokens, vocab) logits have no sequence axis: logits[i] scores labels[i]."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 11, generator=gen)
    labels = torch.tensor([1, 4, -100, 7, 0, 10])
    out = CrossEntropyLoss()({"labels": labels}, {"logits": logits})
    # the same operation on the same values: exact
    assert torch.equal(out["loss"], F.cross_entropy(logits, labels, ignore_index=-100))
    # other summation orders of the same float32 terms: the log-sum-exp over the vocabulary and the 5-token mean
    rel = chain_bound(11, 5)
    chunked = ChunkedCrossEntropyLoss(chunk_size=4)({"labels": labels}, {"logits": logits})["loss"]
    torch.testing.assert_close(chunked, out["loss"], rtol=rel, atol=0)
    logps = F.log_softmax(logits, dim=-1).gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    torch.testing.assert_close(CrossEntropyLoss()({"labels": labels}, {"logps": logps})["loss"], out["loss"],
                               rtol=rel, atol=0)
    shifted = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100)  # what a shift would have scored
    assert abs(float(shifted - out["loss"])) > 100 * rel * float(out["loss"])
