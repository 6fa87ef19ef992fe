"""Each RL and preference loss against an independent implementation of its published formula.

The references below are written from the papers (and, for Tinker's losses, from Tinker's loss
documentation) with plain loops over sequences and tokens; they share no code with twinkle.loss.
Every loss is checked in three batch layouts (Tinker padded, Tinker packed, twinkle label rows) for
its value (what the model applies: sum / max(items, 1)) and its gradient w.r.t. the logits.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from rl_testing import LAYOUTS, logprobs_of, make_sequences

from twinkle.loss import (
    BNPOLoss,
    CISPOLoss,
    DPOLoss,
    DrGRPOLoss,
    DROLoss,
    GRPOLoss,
    GSPOLoss,
    ImportanceSamplingLoss,
    IPOLoss,
    ORPOLoss,
    PPOLoss,
    SimPOLoss,
    TokenCrossEntropy,
)
from twinkle.model.inputs import check_batch
from twinkle.registry import resolve

#: the sequences are float64 (u = 2**-53): the formulas' rounding over a few hundred terms is ~1e-14, far below 1e-6,
#: which is far below what a wrong formula changes (a term, a sign, a normalisation)
TOL = dict(rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ references (Tinker's docs)
def ref_cross_entropy(seqs, **_):
    return sum((-logprobs_of(s) * s.weights).sum() for s in seqs)


def ref_importance_sampling(seqs, **_):
    total = 0
    for s in seqs:
        lp = logprobs_of(s)
        prob_ratio = torch.exp(lp - s.q)
        total = total - (prob_ratio * s.A * s.weights).sum()
    return total


def ref_ppo(seqs, low=0.8, high=1.2, **_):
    total = 0
    for s in seqs:
        lp = logprobs_of(s)
        prob_ratio = torch.exp(lp - s.q)
        clipped = torch.clamp(prob_ratio, low, high)
        objective = torch.min(prob_ratio * s.A, clipped * s.A)
        total = total - (objective * s.weights).sum()
    return total


def ref_cispo(seqs, low=0.8, high=1.2, **_):
    total = 0
    for s in seqs:
        lp = logprobs_of(s)
        clipped = torch.clamp(torch.exp(lp - s.q), low, high).detach()
        total = total - (clipped * lp * s.A * s.weights).sum()
    return total


def ref_dro(seqs, beta=0.05, **_):
    total = 0
    for s in seqs:
        lp = logprobs_of(s)
        objective = lp * s.A - 0.5 * beta * (lp - s.q) ** 2
        total = total - (objective * s.weights).sum()
    return total


# ------------------------------------------------------------------ references (GRPO family papers)
def _grpo_token_terms(s, low, high, beta):
    """DeepSeekMath eq. 3 per token: min(r A, clip(r) A) - beta * D_KL (eq. 4), on trained tokens."""
    lp = logprobs_of(s)
    terms = []
    for t in range(len(lp)):
        if s.weights[t] == 0:
            continue
        r = torch.exp(lp[t] - s.q[t])
        surrogate = torch.min(r * s.A[t], torch.clamp(r, low, high) * s.A[t])
        kl = torch.exp(s.ref[t]) / torch.exp(lp[t]) - (s.ref[t] - lp[t]) - 1
        terms.append(surrogate - beta * kl)
    return terms


def ref_grpo(seqs, low=0.8, high=1.2, beta=0.0, **_):
    per_sequence = [sum(terms) / len(terms) for terms in (_grpo_token_terms(s, low, high, beta) for s in seqs)]
    return -sum(per_sequence) / len(seqs)


def ref_bnpo(seqs, low=0.8, high=1.2, beta=0.0, **_):
    terms = [t for s in seqs for t in _grpo_token_terms(s, low, high, beta)]
    return -sum(terms) / len(terms)


def ref_dr_grpo(seqs, low=0.8, high=1.2, beta=0.0, max_tokens=16, **_):
    terms = [t for s in seqs for t in _grpo_token_terms(s, low, high, beta)]
    return -sum(terms) / (len(seqs) * max_tokens)


def ref_gspo(seqs, low=1 - 3e-4, high=1 + 4e-4, **_):
    """GSPO eq. (5)-(7): s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|), clipped per sequence."""
    objective = 0
    for s in seqs:
        lp = logprobs_of(s)
        trained = [t for t in range(len(lp)) if s.weights[t] != 0]
        log_pi = sum(lp[t] for t in trained)
        log_old = sum(s.q[t] for t in trained)
        ratio = torch.exp((log_pi - log_old) / len(trained))
        advantage = s.A[trained[0]]
        objective = objective + torch.min(ratio * advantage, torch.clamp(ratio, low, high) * advantage)
    return -objective / len(seqs)


# ------------------------------------------------------------------ references (preference papers)
def _sequence_logp(s, source=None):
    lp = logprobs_of(s) if source is None else source
    return sum(lp[t] for t in range(len(lp)) if s.weights[t] != 0), int((s.weights != 0).sum())


def _pairs(seqs):
    return [(seqs[k], seqs[k + 1]) for k in range(0, len(seqs), 2)]


def ref_dpo(seqs, beta=0.1, **_):
    """Rafailov et al. eq. 7: -log sigma(beta log pi(yw)/ref(yw) - beta log pi(yl)/ref(yl))."""
    losses = []
    for w, lo in _pairs(seqs):
        (pw, _), (pl, _) = _sequence_logp(w), _sequence_logp(lo)
        (rw, _), (rl, _) = _sequence_logp(w, w.ref), _sequence_logp(lo, lo.ref)
        losses.append(-torch.log(torch.sigmoid(beta * (pw - rw) - beta * (pl - rl))))
    return sum(losses) / len(losses)


def ref_ipo(seqs, beta=0.1, **_):
    """Azar et al. eq. 17: (h - 1/(2 tau))^2, h = log [pi(yw) ref(yl) / (pi(yl) ref(yw))]."""
    losses = []
    for w, lo in _pairs(seqs):
        (pw, _), (pl, _) = _sequence_logp(w), _sequence_logp(lo)
        (rw, _), (rl, _) = _sequence_logp(w, w.ref), _sequence_logp(lo, lo.ref)
        losses.append((pw + rl - pl - rw - 1 / (2 * beta)) ** 2)
    return sum(losses) / len(losses)


def ref_simpo(seqs, beta=2.0, gamma=0.5, **_):
    """Meng et al. eq. 6: -log sigma(beta/|yw| log pi(yw) - beta/|yl| log pi(yl) - gamma)."""
    losses = []
    for w, lo in _pairs(seqs):
        (pw, nw), (pl, nl) = _sequence_logp(w), _sequence_logp(lo)
        losses.append(-torch.log(torch.sigmoid(beta / nw * pw - beta / nl * pl - gamma)))
    return sum(losses) / len(losses)


def ref_orpo(seqs, beta=0.1, **_):
    """Hong et al. eqs. 2-7: L_SFT + lambda L_OR, odds(y) = P(y) / (1 - P(y)), P the length-normalised likelihood."""
    losses = []
    for w, lo in _pairs(seqs):
        (pw, nw), (pl, nl) = _sequence_logp(w), _sequence_logp(lo)
        prob_w, prob_l = torch.exp(pw / nw), torch.exp(pl / nl)
        odds_w, odds_l = prob_w / (1 - prob_w), prob_l / (1 - prob_l)
        losses.append(-pw / nw - beta * torch.log(torch.sigmoid(torch.log(odds_w / odds_l))))
    return sum(losses) / len(losses)


TOKEN_FIELDS = ("weights", "logprobs", "advantages")
CASES = [
    # (name, loss, reference, reference kwargs, fields, sequences options)
    ("cross_entropy", TokenCrossEntropy(), ref_cross_entropy, {}, ("weights",), {}),
    ("importance_sampling", ImportanceSamplingLoss(), ref_importance_sampling, {}, TOKEN_FIELDS, {}),
    ("ppo", PPOLoss(), ref_ppo, {}, TOKEN_FIELDS, {}),
    ("ppo_custom_bounds", PPOLoss(0.9, 1.1), ref_ppo, dict(low=0.9, high=1.1), TOKEN_FIELDS, {}),
    ("cispo", CISPOLoss(), ref_cispo, {}, TOKEN_FIELDS, {}),
    ("dro", DROLoss(beta=0.3), ref_dro, dict(beta=0.3), TOKEN_FIELDS, {}),
    ("grpo", GRPOLoss(), ref_grpo, {}, TOKEN_FIELDS, {}),
    ("grpo_kl", GRPOLoss(beta=0.04), ref_grpo, dict(beta=0.04), TOKEN_FIELDS + ("ref_logprobs",), {}),
    ("bnpo_kl", BNPOLoss(0.8, 1.28, beta=0.1), ref_bnpo, dict(high=1.28, beta=0.1), TOKEN_FIELDS + ("ref_logprobs",),
     {}),
    ("dr_grpo_kl", DrGRPOLoss(beta=0.1, max_tokens=9), ref_dr_grpo, dict(beta=0.1, max_tokens=9),
     TOKEN_FIELDS + ("ref_logprobs",), {}),
    ("gspo", GSPOLoss(), ref_gspo, {}, TOKEN_FIELDS, dict(per_sequence_advantage=True)),
    ("gspo_wide", GSPOLoss(0.5, 2.0), ref_gspo, dict(low=0.5, high=2.0), TOKEN_FIELDS,
     dict(per_sequence_advantage=True)),
    ("dpo", DPOLoss(beta=0.5), ref_dpo, dict(beta=0.5), ("weights", "ref_logprobs"), dict(count=6)),
    ("ipo", IPOLoss(beta=0.5), ref_ipo, dict(beta=0.5), ("weights", "ref_logprobs"), dict(count=6)),
    ("simpo", SimPOLoss(beta=2.0, gamma=0.3), ref_simpo, dict(beta=2.0, gamma=0.3), ("weights",), dict(count=6)),
    ("orpo", ORPOLoss(beta=0.2), ref_orpo, dict(beta=0.2), ("weights",), dict(count=6)),
]


def _applied(loss, inputs, outputs):
    """What a model back-propagates on one process: the loss sum over max(items, 1)."""
    total, items = loss.compute(inputs, outputs)
    return total / max(float(items), 1.0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name,loss,reference,kwargs,fields,options", CASES, ids=[c[0] for c in CASES])
def test_loss_matches_its_formula(name, loss, reference, kwargs, fields, options, layout):
    seed = zlib.crc32(name.encode()) % 1000
    seqs = make_sequences(seed=seed, **options)
    noise = torch.Generator().manual_seed(seed)  # seeded: with some draws every GSPO sequence is clipped (no gradient)
    for s in seqs:  # larger ratios, so the clipping bounds are exercised
        s.q = torch.where(s.weights != 0, logprobs_of(s).detach() + 0.4 * torch.randn(
            s.q.shape, generator=noise, dtype=s.q.dtype), s.q)
    expected = reference(seqs, **kwargs)
    expected.backward()
    expected_grads = [s.logits.grad.clone() for s in seqs]
    for s in seqs:
        s.logits.grad = None
    inputs, outputs = LAYOUTS[layout](seqs, fields)
    got = _applied(loss, inputs, outputs)
    got.backward()
    torch.testing.assert_close(got, expected.to(got.dtype), **TOL)
    for k, s in enumerate(seqs):
        torch.testing.assert_close(s.logits.grad, expected_grads[k], **TOL, msg=f"sequence {k} gradient")
    assert sum(float(g.abs().sum()) for g in expected_grads) > 0


def test_tinker_losses_without_weights_are_the_documented_sums():
    """No weights, no padding: exactly the code of Tinker's loss documentation on one datum."""
    seq = make_sequences(seed=3, count=1)[0]
    lp = logprobs_of(seq)
    ratio = torch.exp(lp - seq.q)
    documented = {
        "cross_entropy": (-lp * torch.ones_like(lp)).sum(),
        "importance_sampling": -(ratio * seq.A).sum(),
        "ppo": -torch.min(ratio * seq.A, torch.clamp(ratio, 0.8, 1.2) * seq.A).sum(),
        "cispo": -(torch.clamp(ratio, 0.8, 1.2).detach() * lp * seq.A).sum(),
        "dro": -(lp * seq.A - 0.5 * 0.05 * (lp - seq.q) ** 2).sum(),
    }
    inputs = {"target_tokens": seq.targets[None], "logprobs": seq.q[None], "advantages": seq.A[None]}
    for name, value in documented.items():
        loss = resolve("loss", name)()
        total, items = loss.compute(inputs, {"logits": seq.logits[None]})
        assert items == 0  # a plain sum: nothing divides it, under accumulation or across ranks either
        torch.testing.assert_close(total, value, rtol=1e-12, atol=1e-12, msg=name)


def test_mean_reduction_divides_by_the_weight_sum():
    seqs = make_sequences(seed=5, binary_weights=False)
    inputs, outputs = LAYOUTS["tinker_padded"](seqs, TOKEN_FIELDS)
    total, items = PPOLoss(reduction="mean").compute(inputs, outputs)
    torch.testing.assert_close(items, sum(s.weights.sum() for s in seqs))
    torch.testing.assert_close(total, ref_ppo(seqs), **TOL)


def test_fractional_weights_scale_each_token():
    seqs = make_sequences(seed=6, binary_weights=False)
    inputs, outputs = LAYOUTS["tinker_packed"](seqs, TOKEN_FIELDS)
    total, _ = ImportanceSamplingLoss().compute(inputs, outputs)
    torch.testing.assert_close(total, ref_importance_sampling(seqs), **TOL)


def test_loss_outputs_are_each_samples_target_logprobs():
    seqs = make_sequences(seed=7)
    for layout in ("tinker_padded", "tinker_packed"):
        loss = PPOLoss()
        loss.compute(*LAYOUTS[layout](seqs, TOKEN_FIELDS))
        samples = loss.last_outputs.per_sample()
        assert len(samples) == len(seqs)
        for s, sample in zip(seqs, samples):
            torch.testing.assert_close(sample["logprobs"], logprobs_of(s).detach(), rtol=1e-12, atol=1e-12)


def test_preference_rewards_give_margin_and_accuracy():
    seqs = make_sequences(seed=8, count=4)
    loss = DPOLoss(beta=0.5)
    loss.compute(*LAYOUTS["tinker_padded"](seqs, ("weights", "ref_logprobs")))
    rewards = [sample["reward"] for sample in loss.last_outputs.per_sample()]
    for k, s in enumerate(seqs):
        (pi, _), (ref, _) = _sequence_logp(s), _sequence_logp(s, s.ref)
        assert float(rewards[k]) == pytest.approx(float(0.5 * (pi - ref).detach()), abs=1e-9)


def test_orpo_log_odds_stay_finite_for_confident_answers():
    seqs = make_sequences(seed=9, count=2)
    for s in seqs:
        with torch.no_grad():
            s.logits[torch.arange(len(s.targets)), s.targets] += 40.0  # P(y) -> 1: log(1 - P) underflows naively
    value = _applied(ORPOLoss(), *LAYOUTS["tinker_padded"](seqs, ("weights",)))
    value.backward()
    assert math.isfinite(float(value.detach())) and all(torch.isfinite(s.logits.grad).all() for s in seqs)


@pytest.mark.parametrize("loss,message", [
    (DPOLoss(), "needs per-token 'ref_logprobs'"),
    (PPOLoss(), "needs per-token 'advantages'"),
])
def test_missing_inputs_say_what_to_provide(loss, message):
    seqs = make_sequences(seed=10, count=2)
    inputs, outputs = LAYOUTS["tinker_padded"](seqs, ("weights", "logprobs"))
    with pytest.raises(KeyError, match=message):
        loss.compute(inputs, outputs)


def _collated(layout: str, count: int, trained: bool = True) -> dict:
    seqs = make_sequences(seed=11, count=count)
    for s in seqs if not trained else ():
        s.weights.zero_()
    inputs, _ = LAYOUTS[layout](seqs, ("weights",))
    return inputs | {"input_ids": inputs.get("target_tokens", inputs.get("labels")).clamp(min=0)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_unpaired_preference_batch_is_refused_by_collation(layout):
    """The pair count is checked on the collated batch (on the host, before any forward), so compute
    never reads it back from the device."""
    for batch, count in ((_collated(layout, 3), 3), (_collated(layout, 2, trained=False), 0)):
        with pytest.raises(ValueError, match=f"pairs.*this batch has {count}"):
            check_batch(batch, loss=SimPOLoss())
    paired = _collated(layout, 4)
    assert check_batch(paired, loss=SimPOLoss()) is paired


@pytest.mark.parametrize("make,message", [
    (lambda: PPOLoss(clip_low_threshold=1.2), "clip_low_threshold"),
    (lambda: DrGRPOLoss(), "max_tokens"),
    (lambda: GRPOLoss(beta=-1), "beta"),
    (lambda: DPOLoss(beta=0), "beta"),
])
def test_bad_options_name_the_option(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_float32_logits_keep_float32_fields():
    seqs = make_sequences(seed=12, dtype=torch.float32)
    inputs, outputs = LAYOUTS["tinker_padded"](seqs, TOKEN_FIELDS)
    total, _ = PPOLoss().compute(inputs, outputs)
    assert total.dtype == torch.float32
    # float32 against the float64 reference: a sum over the sequences' few dozen tokens, 12 sqrt(n) u ~ 5e-6
    torch.testing.assert_close(total, ref_ppo(seqs).float(), rtol=1e-5, atol=1e-5)


def test_registered_names_resolve_to_the_classes():
    assert resolve("loss", "ppo") is PPOLoss and resolve("loss", "dr_grpo") is DrGRPOLoss
    assert resolve("loss", "dpo") is DPOLoss and resolve("loss", "cross_entropy") is TokenCrossEntropy
    assert F is not None
