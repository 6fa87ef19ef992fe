"""twinkle-hf's model patches (registered as the ``patch`` kind; see ``twinkle.patch``).

``TransformersFusedCEPatch`` is the fused-CE patch the reference user script names: after it, a causal LM
never builds its (batch, seq, vocab) logits to compute a cross-entropy.

- On the transformers module: ``model(input_ids, labels=...)`` returns the loss computed by the
  fused linear cross-entropy from the final hidden states and the head weight, and ``logits=None``
  (the liger-kernel recipe, through the ``fused_linear_cross_entropy`` kernel chain: liger on CUDA,
  twinkle's chunked torch kernel elsewhere).
  Without ``labels`` the module's own forward runs, so generation and evaluation are unchanged.
- On the TwinkleModel: every group without a loss gets ``LigerFusedLinearCrossEntropyLoss``, so
  ``forward_backward`` runs under ``task='fused_lm_ce'``.
"""

from __future__ import annotations

from typing import Any

from twinkle.kernel.patching import ModulePatch, apply_patch, restore
from twinkle.patch import Patch, unwrap_model


class TransformersFusedCEPatch(Patch):
    """Cross-entropy from hidden states and the lm_head weight, chunk by chunk; the logits never exist."""

    def __init__(self, chunk_size: int | None = None) -> None:
        self.chunk_size = chunk_size
        self._records: dict[int, ModulePatch] = {}

    def apply(self, module: Any) -> None:
        model = unwrap_model(module)
        if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
            raise TypeError(f"TransformersFusedCEPatch needs a causal LM with an output head; "
                            f"{type(model).__name__} has none.")
        if id(model) not in self._records:
            self._records[id(model)] = apply_patch(model, forward=_fused_forward(self.chunk_size))

    def revert(self, module: Any) -> None:
        record = self._records.pop(id(unwrap_model(module)), None)
        if record is not None:
            restore(record)

    def on_model(self, model: Any) -> None:
        from twinkle_hf.kernels.fused_ce_loss import LigerFusedLinearCrossEntropyLoss

        for group in model.optimizer_group.values():
            if group.loss is None:
                group.loss = LigerFusedLinearCrossEntropyLoss(chunk_size=self.chunk_size)


def _fused_forward(chunk_size: int | None) -> Any:
    def forward(self: Any, input_ids: Any = None, attention_mask: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        if labels is None:  # no loss asked for: the module's own forward, logits and all
            return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        from twinkle_hf.kernels.fused_ce_loss import LigerFusedLinearCrossEntropyLoss, fused_ce_outputs

        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("logits_to_keep", None)
        kwargs.setdefault("use_cache", False)
        out = getattr(self, self.base_model_prefix)(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        total, tokens = LigerFusedLinearCrossEntropyLoss(chunk_size=chunk_size).compute(
            {"labels": labels}, fused_ce_outputs(out.last_hidden_state, self.get_output_embeddings()))
        # transformers' convention: the mean over trained tokens, or over num_items_in_batch when given
        loss = total / (num_items if num_items is not None else tokens.clamp(min=1))
        return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=out.past_key_values,
                                      hidden_states=getattr(out, "hidden_states", None),
                                      attentions=getattr(out, "attentions", None))

    return forward
