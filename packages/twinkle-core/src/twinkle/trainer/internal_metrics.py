"""``internal_metrics``: numbers from inside the model every N steps, logged as ``internal/<metric>/<layer>``.

Per layer (``layers.N``, ``embed_tokens``, ``lm_head``, ``other``): the RMS of the trainable weights after the
step (``weight_rms``) and the L2 norm of their gradients before clipping (``grad_norm``). From one extra
no-grad forward of the step's last micro-batch with eager attention: each layer's mean attention entropy
(``attn_entropy``, nats) and largest attention probability (``attn_max_prob``), the largest output logit
(``max_logits``) and, for a mixture-of-experts model, each layer's router logits max/mean and load balance
(``maxvio``: the busiest expert's token count over the mean count, minus 1; 0 is perfectly balanced).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from typing import Any

_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_of(name: str) -> str:
    """The layer a parameter belongs to, from its name."""
    found = _LAYER.search(name)
    if found:
        return f"layers.{found.group(1)}"
    for part in ("embed_tokens", "lm_head"):
        if part in name:
            return part
    return "other"


def by_layer(named: list[tuple[str, Any]], square_sum: Any) -> dict[str, tuple[float, int]]:
    """Per layer: (sum of ``square_sum(tensor)``, number of elements)."""
    out: dict[str, tuple[float, int]] = {}
    for name, tensor in named:
        layer = layer_of(name)
        total, count = out.get(layer, (0.0, 0))
        out[layer] = (total + float(square_sum(tensor)), count + tensor.numel())
    return out


def _local(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def weight_rms(named: list[tuple[str, Any]]) -> dict[str, float]:
    layers = by_layer([(n, _local(p.detach()).double()) for n, p in named], lambda t: t.pow(2).sum())
    return {f"internal/weight_rms/{layer}": math.sqrt(total / max(count, 1))
            for layer, (total, count) in layers.items()}


def grad_norms(named: list[tuple[str, Any]]) -> dict[str, float]:
    grads = [(n, _local(p.grad.detach()).double()) for n, p in named if p.grad is not None]
    layers = by_layer(grads, lambda t: t.pow(2).sum())
    return {f"internal/grad_norm/{layer}": math.sqrt(total) for layer, (total, _) in layers.items()}


@contextlib.contextmanager
def eager_attention(hf_model: Any) -> Iterator[None]:
    """Eager attention (which returns its probabilities) for the block, whatever the model was loaded with."""
    configs = [c for c in (hf_model.config, getattr(hf_model.config, "text_config", None)) if c is not None]
    before = [getattr(c, "_attn_implementation", None) for c in configs]
    for config in configs:
        config._attn_implementation = "eager"
    try:
        yield
    finally:
        for config, value in zip(configs, before):
            config._attn_implementation = value


def forward_stats(module: Any, hf_model: Any, batch: dict[str, Any], cfg: Any) -> dict[str, float]:
    """Attention, logits and MoE numbers of one no-grad eager forward of ``batch`` (tensors on the device)."""
    import torch

    moe = _experts_per_token(hf_model.config)
    want_moe = moe and (cfg.monitor_moe_load_balance_stats or cfg.monitor_moe_router_logits_stats)
    mask = batch.get("attention_mask")
    options = {"input_ids": batch["input_ids"], "attention_mask": mask,
               "output_attentions": bool(cfg.monitor_attn_logits_stats)}
    if want_moe:
        options["output_router_logits"] = True
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), eager_attention(hf_model):
            outputs = module(**options)
    finally:
        module.train(was_training)
    valid = (mask if mask is not None else torch.ones_like(batch["input_ids"])).bool()
    out: dict[str, float] = {}
    if cfg.monitor_max_logits:
        out["internal/max_logits"] = float(outputs.logits[valid].max())
    if cfg.monitor_attn_logits_stats:
        for index, probs in enumerate(outputs.attentions or ()):
            probs = probs.double()
            entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1)  # (batch, heads, queries)
            rows = valid[:, None, :].expand_as(entropy)
            out[f"internal/attn_entropy/layers.{index}"] = float(entropy[rows].mean())
            out[f"internal/attn_max_prob/layers.{index}"] = float(probs.amax(-1)[rows].max())
    if want_moe:
        out.update(moe_stats(outputs.router_logits, moe, valid.reshape(-1), cfg))
    return out


def _experts_per_token(config: Any) -> int:
    config = getattr(config, "text_config", None) or config
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or \
        getattr(config, "n_routed_experts", None)
    return int(getattr(config, "num_experts_per_tok", 0) or 0) if experts else 0


def moe_stats(router_logits: Any, top_k: int, valid: Any, cfg: Any) -> dict[str, float]:
    """Per MoE layer: router logits max/mean and maxvio of the top-k routing (padding excluded)."""
    import torch

    out: dict[str, float] = {}
    for index, logits in enumerate(router_logits or ()):
        logits = logits.reshape(-1, logits.shape[-1])[valid[: logits.reshape(-1, logits.shape[-1]).shape[0]]]
        if cfg.monitor_moe_router_logits_stats:
            out[f"internal/router_logits_max/layers.{index}"] = float(logits.max())
            out[f"internal/router_logits_mean/layers.{index}"] = float(logits.double().mean())
        if cfg.monitor_moe_load_balance_stats:
            chosen = logits.topk(top_k, dim=-1).indices.reshape(-1)
            counts = torch.bincount(chosen, minlength=logits.shape[-1]).double()
            out[f"internal/maxvio/layers.{index}"] = float(counts.max() / counts.mean() - 1.0)
    return out


class Recorder:
    """The Trainer's internal-metrics recorder (a TransformersModel-style model: ``.model``, ``.backend``)."""

    def __init__(self, cfg: Any, model: Any, total: int) -> None:
        from twinkle.config import ConfigError

        self.cfg, self.model, self.total = cfg, model, total
        self.hf_model = getattr(model.backend, "hf_model", lambda: None)()
        if self.hf_model is None and (cfg.monitor_attn_logits_stats or cfg.monitor_max_logits):
            raise ConfigError("internal_metrics.monitor_attn_logits_stats / monitor_max_logits: "
                              f"{type(model).__name__} exposes no transformers model to run an eager forward on; "
                              "turn them off.")
        if self.hf_model is not None and not _experts_per_token(self.hf_model.config):
            cfg.monitor_moe_router_logits_stats = cfg.monitor_moe_load_balance_stats = None  # no experts here
        self._grads: dict[str, float] = {}

    def due(self, step: int) -> bool:
        return step % self.cfg.internal_metrics_interval == 0 or step >= self.total

    def _named(self) -> list[tuple[str, Any]]:
        return [(n, p) for n, p in self.model.model.named_parameters() if p.requires_grad]

    def before_clip(self, step: int) -> None:
        if self.due(step) and self.cfg.monitor_grad_norm:
            self._grads = grad_norms(self._named())

    def after_step(self, step: int, rows: Any) -> dict[str, float]:
        if not self.due(step):
            return {}
        out, self._grads = dict(self._grads), {}
        if self.cfg.monitor_weights_rms_norm:
            out.update(weight_rms(self._named()))
        if rows and self.hf_model is not None and (self.cfg.monitor_attn_logits_stats or self.cfg.monitor_max_logits
                                                   or self.cfg.monitor_moe_load_balance_stats
                                                   or self.cfg.monitor_moe_router_logits_stats):
            from twinkle.processor import InputProcessor

            batch = InputProcessor(device=self.model.device)(list(rows))
            out.update(forward_stats(self.model.model, self.hf_model, batch, self.cfg))
        return out

    def close(self) -> None:
        """Nothing to release (no hooks stay on the model)."""
