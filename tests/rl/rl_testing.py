"""Helpers for the RL tests: random sequences in every batch layout the losses accept, and rollouts.

A *sequence* here is what a Tinker Datum holds: per target position ``t`` the logits row scoring
``targets[t]``, a weight, the sampler's log-probability ``q``, an advantage ``A`` and a reference
log-probability ``ref``. The layouts built from the same sequences: Tinker's padded rows, Tinker's
packed row (position_ids restart) and twinkle's SFT-label rows (labels shifted by one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from twinkle.rollout import Rollout

VOCAB = 11


@dataclass
class Seq:
    logits: torch.Tensor  # (N, V) leaf
    targets: torch.Tensor  # (N,)
    weights: torch.Tensor  # (N,) 0/1, prompt positions 0
    q: torch.Tensor
    A: torch.Tensor
    ref: torch.Tensor


def make_sequences(seed: int, count: int = 5, per_sequence_advantage: bool = False, binary_weights: bool = True,
                   dtype: torch.dtype = torch.float64) -> list[Seq]:
    """Sequences of varied length with a prompt (weight 0) and a randomly masked completion."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        prompt = int(torch.randint(1, 4, (1,), generator=gen))
        completion = int(torch.randint(2, 7, (1,), generator=gen))
        n = prompt + completion
        weights = torch.zeros(n, dtype=dtype)
        weights[prompt:] = (torch.rand(completion, generator=gen) > 0.25).to(dtype) if binary_weights \
            else torch.rand(completion, generator=gen, dtype=dtype)
        weights[prompt] = 1.0  # every completion trains at least one token
        advantage = torch.randn(completion, generator=gen, dtype=dtype)
        if per_sequence_advantage:
            advantage = advantage[:1].expand(completion)
        out.append(Seq(
            logits=(torch.randn(n, VOCAB, generator=gen, dtype=dtype) * 1.5).requires_grad_(),
            targets=torch.randint(0, VOCAB, (n,), generator=gen),
            weights=weights,
            q=torch.cat([torch.zeros(prompt, dtype=dtype), -torch.rand(completion, generator=gen, dtype=dtype) * 3]),
            A=torch.cat([torch.zeros(prompt, dtype=dtype), advantage]),
            ref=-torch.rand(n, generator=gen, dtype=dtype) * 3,
        ))
    return out


def _fields(seq: Seq, fields: tuple[str, ...]) -> dict[str, torch.Tensor]:
    names = {"weights": seq.weights, "logprobs": seq.q, "advantages": seq.A, "ref_logprobs": seq.ref}
    return {k: names[k] for k in fields}


def tinker_padded(seqs: list[Seq], fields: tuple[str, ...]) -> tuple[dict, dict]:
    """Right-padded rows in Tinker alignment (pads: weight 0, attention 0)."""
    width = max(len(s.targets) for s in seqs)
    logits = torch.stack([torch.nn.functional.pad(s.logits, (0, 0, 0, width - len(s.targets))) for s in seqs])
    inputs = {"target_tokens": torch.stack([torch.nn.functional.pad(s.targets, (0, width - len(s.targets)))
                                            for s in seqs]),
              "attention_mask": torch.stack([(torch.arange(width) < len(s.targets)).long() for s in seqs])}
    for name in fields:
        inputs[name] = torch.stack([torch.nn.functional.pad(_fields(s, fields)[name], (0, width - len(s.targets)))
                                    for s in seqs])
    return inputs, {"logits": logits}


def tinker_packed(seqs: list[Seq], fields: tuple[str, ...]) -> tuple[dict, dict]:
    """Every sequence concatenated into one row; position_ids restart at 0 per sequence."""
    inputs = {"target_tokens": torch.cat([s.targets for s in seqs])[None],
              "position_ids": torch.cat([torch.arange(len(s.targets)) for s in seqs])[None]}
    for name in fields:
        inputs[name] = torch.cat([_fields(s, fields)[name] for s in seqs])[None]
    return inputs, {"logits": torch.cat([s.logits for s in seqs])[None]}


def label_rows(seqs: list[Seq], fields: tuple[str, ...]) -> tuple[dict, dict]:
    """twinkle SFT rows: token t+1 is labels[t+1] (the target of position t); -100 where the weight is 0.

    Per-token fields align with the tokens (one position later than Tinker's); the extra last logits
    row scores nothing. Weights other than 0/1 are given as ``weights`` too.
    """
    width = max(len(s.targets) for s in seqs) + 1
    rows_labels, masks, logits, extra = [], [], [], {name: [] for name in fields}
    for s in seqs:
        n = len(s.targets)
        labels = torch.full((width,), -100, dtype=torch.long)
        labels[1:n + 1] = torch.where(s.weights != 0, s.targets, torch.full_like(s.targets, -100))
        rows_labels.append(labels)
        masks.append((torch.arange(width) < n + 1).long())
        logits.append(torch.nn.functional.pad(s.logits, (0, 0, 0, width - n)))
        for name, values in _fields(s, fields).items():
            extra[name].append(torch.nn.functional.pad(values, (1, width - n - 1)))
    inputs = {"labels": torch.stack(rows_labels), "attention_mask": torch.stack(masks),
              **{k: torch.stack(v) for k, v in extra.items()}}
    return inputs, {"logits": torch.stack(logits)}


LAYOUTS = {"tinker_padded": tinker_padded, "tinker_packed": tinker_packed, "labels": label_rows}


def logprobs_of(seq: Seq) -> torch.Tensor:
    """log softmax of each position's logits at its target, written out (no library helper)."""
    return torch.stack([seq.logits[t, seq.targets[t]] - torch.log(torch.exp(seq.logits[t]).sum())
                        for t in range(len(seq.targets))])


def make_rollouts(seed: int, count: int = 3) -> list[Rollout]:
    """Rollouts (prompt, completion, sampling logprobs, reward, a partly masked completion) of varied lengths."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        p, c = int(torch.randint(2, 6, (1,), generator=gen)), int(torch.randint(2, 7, (1,), generator=gen))
        mask = (torch.rand(c, generator=gen) > 0.2).long().tolist()
        mask[0] = 1
        out.append(Rollout(torch.randint(3, 120, (p,), generator=gen).tolist(),
                           torch.randint(3, 120, (c,), generator=gen).tolist(),
                           (-torch.rand(c, generator=gen) * 5).tolist(), float(torch.randn(1, generator=gen)),
                           mask=mask))
    return out


def make_pairs(seed: int, count: int = 2) -> list[dict]:
    """Preference rows in twinkle's label layout: (chosen, rejected) sharing a prompt."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        prompt = torch.randint(3, 120, (int(torch.randint(2, 5, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(2):
            answer = torch.randint(3, 120, (int(torch.randint(2, 6, (1,), generator=gen)),), generator=gen).tolist()
            rows.append({"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer})
    return rows
