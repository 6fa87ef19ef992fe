"""Preference losses on chosen/rejected pairs: DPO (sigmoid), IPO, SimPO and ORPO.

A batch holds pairs as consecutive sequences ``chosen_0, rejected_0, chosen_1, rejected_1, ...``
(``twinkle.template.Template.encode_preference`` makes them; the processor pads or packs them like
SFT rows). ``pi`` is a sequence's summed log-probability over its trained tokens, ``ref`` the same
under the reference (the base model with adapters disabled, added by the model when the loss needs
it), ``|y|`` its trained token count, ``sigma`` the logistic function; subscripts ``w``/``l`` are
chosen/rejected:

=========  =========================================================================================
dpo        ``-(1 - e) log sigma(z) - e log sigma(-z)``, ``z = beta ((pi_w - ref_w) - (pi_l - ref_l))``
ipo        ``(h - 1 / (2 beta)) ** 2``, ``h = (pi_w - ref_w) - (pi_l - ref_l)``   (Azar et al. 2023; TRL divides
           each log-ratio by ``|y|``: ``length_normalized=True``)
simpo      ``-log sigma(beta pi_w / |y_w| - beta pi_l / |y_l| - gamma)``        (Meng et al. 2024)
orpo       ``-pi_w / |y_w| + beta * -log sigma(lo_w - lo_l)``, ``lo = m - log(1 - exp(m))``, ``m = pi / |y|``
           (TRL's token-mean NLL over prompt and answer: ``nll='token_mean'``)
=========  =========================================================================================

Each loss is a mean over pairs (the model divides by the global pair count, exact under
accumulation and data parallelism). Every sequence's implicit ``reward`` (DPO/IPO:
``beta (pi - ref)``, SimPO: ``beta pi / |y|``, ORPO: ``beta m``) is kept in ``last_outputs`` with
the per-token ``logprobs``, so the chosen-minus-rejected margin and the preference accuracy can be
read after each step.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.loss.base import Loss
from twinkle.loss.token_inputs import TokenOutputs, inputs_view, loss_inputs


class PreferenceLoss(Loss):
    """Base: sequence log-probabilities of the pairs, the per-pair loss of a subclass, the rewards kept."""

    name = "preference"
    uses_reference = False

    def __init__(self, beta: float) -> None:
        super().__init__("mean")
        if not beta > 0:
            raise ValueError(f"{self.name}: beta must be > 0, got {beta!r}.")
        self.beta = float(beta)
        self.last_outputs: TokenOutputs | None = None

    @property
    def needs_reference(self) -> bool:
        """Whether a forward must provide ``ref_logprobs`` (the loss compares with a reference)."""
        return self.uses_reference

    @abstractmethod
    def pair_loss(self, pi: torch.Tensor, ref: torch.Tensor | None, lengths: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                    torch.Tensor]:
        """(loss per pair, reward per sequence) from (2 * pairs,) sequence values, pairs interleaved."""

    def check_batch(self, batch: Mapping[str, Any]) -> None:
        """Refuse a collated batch whose trained sequences do not pair up.

        Every backend's collation calls this on the host, before the forward, so :meth:`compute` never
        reads the count back from the device.
        """
        ids = batch["input_ids"]
        count = int(inputs_view(batch, tuple(ids.shape), ids.device, torch.float32, self.name)
                    .trained_sequences().sum())
        if count == 0 or count % 2:
            raise ValueError(f"The {self.name} loss needs (chosen, rejected) pairs: consecutive sequences with trained "
                             f"tokens, an even number of them; this batch has {count}. Build rows with "
                             "Template.encode_preference and keep each pair in one batch.")

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        given_ref = _given_pair_refs(kwargs.pop("ref_chosen_logps", None), kwargs.pop("ref_rejected_logps", None),
                                     self.name)
        view, logprobs, _ = loss_inputs(inputs, outputs, self.name, kwargs)
        trained = view.trained_sequences()
        count = trained.sum()  # that it is even and not 0 was checked on the host, by check_batch in collation
        # The trained sequences in batch order (chosen, rejected, chosen, ...) at the front, by a stable
        # sort, so no shape depends on the data; the slots after them hold harmless values (finite loss,
        # zero gradient) and are masked out.
        order = torch.sort((~trained).to(torch.uint8), stable=True).indices
        used = torch.arange(len(order), device=order.device) < count

        def packed(values: torch.Tensor, fill: float) -> torch.Tensor:
            out = torch.where(used, values[order], torch.full_like(values, fill))
            return F.pad(out, (0, len(out) % 2), value=fill)  # whole pairs

        pi = view.per_sequence(torch.where(view.weights != 0, logprobs, torch.zeros_like(logprobs)) * view.weights)
        if not self.uses_reference:
            ref = None
        elif given_ref is not None:  # sequence sums in pair order already: the packed order
            ref = _pad_refs(given_ref, int(count), len(packed(pi, -1.0)), self.name).to(pi)
        else:
            ref = packed(view.per_sequence(view.field("ref_logprobs") * view.weights), -1.0)
        losses, rewards = self.pair_loss(packed(pi, -1.0), ref, packed(view.per_sequence(view.weights), 1.0))
        pairs = count // 2
        losses = torch.where(torch.arange(len(losses), device=losses.device) < pairs, losses, torch.zeros_like(losses))
        place = (trained.long().cumsum(0) - 1).clamp(min=0)  # a trained sequence's slot in the packed order
        all_rewards = torch.where(trained, rewards.detach()[place], torch.zeros_like(pi))
        self.last_outputs = TokenOutputs({"logprobs": logprobs.detach()}, view.segments, {"reward": all_rewards})
        return losses.sum(), pairs


def _pairs(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values[0::2], values[1::2]


def _given_pair_refs(chosen: Any, rejected: Any, name: str) -> torch.Tensor | None:
    """Upstream's ``ref_chosen_logps``/``ref_rejected_logps`` (one reference sequence sum per pair), interleaved."""
    if chosen is None and rejected is None:
        return None
    if chosen is None or rejected is None:
        raise ValueError(f"The {name} loss: give both ref_chosen_logps= and ref_rejected_logps=, or neither.")
    chosen, rejected = torch.as_tensor(chosen).reshape(-1), torch.as_tensor(rejected).reshape(-1)
    if chosen.shape != rejected.shape:
        raise ValueError(f"The {name} loss: ref_chosen_logps has {chosen.numel()} values but ref_rejected_logps "
                         f"{rejected.numel()}; give one per pair.")
    return torch.stack([chosen, rejected], dim=1).reshape(-1)


def _pad_refs(refs: torch.Tensor, count: int, length: int, name: str) -> torch.Tensor:
    if refs.numel() != count:
        raise ValueError(f"The {name} loss: {refs.numel() // 2} reference pairs given for {count // 2} pairs in the "
                         "batch.")
    return torch.cat([refs.float(), refs.new_full((length - count,), -1.0, dtype=torch.float32)])


def chosen_answer_nll(pi: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each pair's chosen answer's mean NLL over its trained tokens (the SFT term of CPO, ORPO, DPO's sft_weight)."""
    return -_pairs(pi / lengths)[0]


#: DPO's pair losses by upstream Twinkle's / TRL's ``loss_type`` names
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo")


class DPOLoss(PreferenceLoss):
    """``dpo``: the sigmoid loss of Rafailov et al. 2023 (``label_smoothing`` e: the conservative cDPO form).

    Args:
        beta: the temperature of the implicit reward.
        label_smoothing: cDPO's assumed label noise, in [0, 0.5) (``loss_type='sigmoid'`` only).
        loss_type: ``'sigmoid'`` (DPO), ``'hinge'`` (SLiC: ``relu(1 - z)``) or ``'ipo'`` (``(h - 1 / (2 beta))^2``
            on the summed log-ratios, :class:`IPOLoss`).
        reference_free: compare the policy's log-probabilities with 0 instead of a reference's (no reference
            forward).
        sft_weight: adds this times the chosen answer's mean NLL to each pair.

    A call may give the reference as upstream does: ``ref_logps=`` per token, or ``ref_chosen_logps=`` and
    ``ref_rejected_logps=`` (each pair's reference sequence sum).
    """

    name = "dpo"
    uses_reference = True

    def __init__(self, beta: float = 0.1, label_smoothing: float = 0.0, *, loss_type: str = "sigmoid",
                 reference_free: bool = False, sft_weight: float = 0.0) -> None:
        super().__init__(beta)
        if loss_type == "kto_pair":
            raise ValueError("dpo: loss_type='kto_pair' is not supported: its KL baseline is a mean over the batch, "
                             "so the loss of a batch would differ from the sum of its micro-batches'. Use "
                             f"one of {', '.join(DPO_LOSS_TYPES)}.")
        if loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"dpo: Unknown loss_type {loss_type!r}; one of {', '.join(DPO_LOSS_TYPES)}.")
        if not 0 <= label_smoothing < 0.5:
            raise ValueError(f"dpo: label_smoothing must be in [0, 0.5), got {label_smoothing!r}.")
        if label_smoothing and loss_type != "sigmoid":
            raise ValueError(f"dpo: label_smoothing={label_smoothing!r} applies to loss_type='sigmoid' only, not "
                             f"{loss_type!r}.")
        if not sft_weight >= 0:
            raise ValueError(f"dpo: sft_weight must be >= 0, got {sft_weight!r}.")
        self.label_smoothing = float(label_smoothing)
        self.loss_type = loss_type
        self.reference_free = bool(reference_free)
        self.uses_reference = not self.reference_free
        self.sft_weight = float(sft_weight)

    def pair_loss(self, pi: torch.Tensor, ref: torch.Tensor | None, lengths: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                   torch.Tensor]:
        ratio = pi if ref is None else pi - ref
        rewards = self.beta * ratio
        chosen, rejected = _pairs(rewards)
        z = chosen - rejected
        if self.loss_type == "hinge":
            losses = torch.relu(1 - z)
        elif self.loss_type == "ipo":
            margin = _pairs(ratio)
            losses = (margin[0] - margin[1] - 1 / (2 * self.beta)) ** 2
        else:
            e = self.label_smoothing
            losses = -(1 - e) * F.logsigmoid(z) - e * F.logsigmoid(-z)
        if self.sft_weight:
            losses = losses + self.sft_weight * chosen_answer_nll(pi, lengths)
        return losses, rewards


class IPOLoss(PreferenceLoss):
    """``ipo``: squared distance of the log-likelihood-ratio margin to ``1 / (2 beta)``.

    ``length_normalized=True`` is TRL's form: each sequence's log-ratio is divided by its trained token
    count before the margin is taken (``h = (pi_w - ref_w) / |y_w| - (pi_l - ref_l) / |y_l|``), which keeps
    ``beta`` comparable across answer lengths. The default sums, as the paper's equation 17 is written.
    """

    name = "ipo"
    uses_reference = True

    def __init__(self, beta: float = 0.1, length_normalized: bool = False) -> None:
        super().__init__(beta)
        if not isinstance(length_normalized, bool):
            raise TypeError(f"ipo: length_normalized must be True or False, got {length_normalized!r}.")
        self.length_normalized = length_normalized

    def pair_loss(self, pi: torch.Tensor, ref: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor,
                                                                                            torch.Tensor]:
        ratio = pi - ref
        chosen, rejected = _pairs(ratio / lengths if self.length_normalized else ratio)
        return (chosen - rejected - 1 / (2 * self.beta)) ** 2, self.beta * ratio


class SimPOLoss(PreferenceLoss):
    """``simpo``: length-normalised log-likelihood rewards with a target margin ``gamma``; no reference."""

    name = "simpo"

    def __init__(self, beta: float = 2.5, gamma: float = 0.5) -> None:  # upstream Twinkle's default beta
        super().__init__(beta)
        self.gamma = float(gamma)

    def pair_loss(self, pi: torch.Tensor, ref: None, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rewards = self.beta * pi / lengths
        chosen, rejected = _pairs(rewards)
        return -F.logsigmoid(chosen - rejected - self.gamma), rewards


#: what ORPO's NLL term averages (see :class:`ORPOLoss`)
ORPO_NLL = ("answer_mean", "token_mean")


class ORPOLoss(PreferenceLoss):
    """``orpo``: the chosen answer's NLL plus ``beta`` times the odds-ratio loss; no reference.

    ``nll`` chooses the NLL term:

    * ``'answer_mean'`` (default): each chosen answer's mean NLL over its trained tokens, averaged over the
      pairs like the odds-ratio term (the paper's ``L_SFT`` per pair);
    * ``'token_mean'``: TRL's ``ORPOTrainer``: the mean NLL over every token of the batch's chosen
      sequences, **prompt and answer** (each real position predicting the next token of its sequence),
      taken within the micro-batch (as TRL takes it per device batch).
    """

    name = "orpo"

    def __init__(self, beta: float = 0.1, nll: str = "answer_mean", *, lambda_orpo: float | None = None) -> None:
        super().__init__(beta if lambda_orpo is None else lambda_orpo)  # upstream's name of beta
        if nll not in ORPO_NLL:
            raise ValueError(f"orpo: nll={nll!r} is not one of {', '.join(ORPO_NLL)}.")
        self.nll = nll

    def pair_loss(self, pi: torch.Tensor, ref: None, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean_logp = pi / lengths
        # log(1 - P) with P = exp(m) -> 1 clamped one epsilon below 1, so a certain answer stays finite
        log_odds = mean_logp - torch.log(-torch.expm1(mean_logp.clamp(max=-torch.finfo(mean_logp.dtype).eps)))
        chosen_odds, rejected_odds = _pairs(log_odds)
        odds_loss = -self.beta * F.logsigmoid(chosen_odds - rejected_odds)
        if self.nll == "token_mean":
            return odds_loss, self.beta * mean_logp  # the NLL is added over tokens in compute()
        return chosen_answer_nll(pi, lengths) + odds_loss, self.beta * mean_logp

    def compute(self, inputs: Mapping[str, Any], outputs: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        total, pairs = super().compute(inputs, outputs, **kwargs)
        if self.nll == "answer_mean":
            return total, pairs
        # every pair carries the batch's token-mean NLL once, so the mean over pairs adds it once
        return total + pairs * self._chosen_token_nll(inputs, outputs), pairs

    def _chosen_token_nll(self, inputs: Mapping[str, Any], outputs: Any) -> torch.Tensor:
        """Mean NLL over the real positions of the chosen sequences that predict a token of their own sequence."""
        from twinkle.loss.base import output_field
        from twinkle.loss.token_inputs import gather_logprobs, token_view

        logits = output_field(outputs, "logits")
        view = token_view(inputs, logits, self.name)
        segments = view.segments
        if view.labels_layout:  # position t predicts input t + 1, when that token belongs to the same sequence
            ids = torch.as_tensor(inputs["input_ids"], device=logits.device).long()
            targets = F.pad(ids, (0, 1))[..., 1:]
            predicts = (segments >= 0) & (F.pad(segments, (0, 1), value=-1)[..., 1:] == segments)
        else:  # Tinker rows: every real position has its target
            targets, predicts = view.targets, segments >= 0
        trained = view.trained_sequences()
        chosen = trained & ((trained.long().cumsum(0) - 1) % 2 == 0)  # chosen, rejected, chosen, ... in batch order
        mask = predicts & chosen[segments.clamp(min=0)]
        logprobs = gather_logprobs(logits, torch.where(mask, targets, torch.zeros_like(targets)))
        picked = torch.where(mask, logprobs, torch.zeros_like(logprobs))
        return -picked.sum() / mask.sum().clamp(min=1)


class CPOLoss(PreferenceLoss):
    """``cpo`` (Xu et al. 2024, Contrastive Preference Optimization): DPO without a reference, plus an NLL term.

    Per pair ``-log sigma(beta (pi_w - pi_l)) + bc_coef * NLL_w``, with ``NLL_w`` the chosen answer's mean
    NLL over its trained tokens (the behaviour-cloning regulariser).

    Args:
        beta: the temperature of the log-probability margin.
        bc_coef: the weight of the chosen answer's NLL.
    """

    name = "cpo"

    def __init__(self, beta: float = 0.1, bc_coef: float = 1.0) -> None:
        super().__init__(beta)
        if not bc_coef >= 0:
            raise ValueError(f"cpo: bc_coef must be >= 0, got {bc_coef!r}.")
        self.bc_coef = float(bc_coef)

    def pair_loss(self, pi: torch.Tensor, ref: None, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rewards = self.beta * pi
        chosen, rejected = _pairs(rewards)
        return -F.logsigmoid(chosen - rejected) + self.bc_coef * chosen_answer_nll(pi, lengths), rewards
