"""get_train_configs: a readable picture of what will train and how."""

from __future__ import annotations

from typing import Any


def _count(params: Any) -> int:
    return sum(p.numel() for p in params)


class SummaryMixin:
    """get_train_configs for TransformersModel."""

    def get_train_configs(self, *, adapter_name: str | None = None, **kwargs: Any) -> str:
        """Model, precision, strategy, device and, per group, trainable parameters and components."""
        groups = [self._group(adapter_name)] if adapter_name is not None else list(self.optimizer_group.values())
        total = _count(self.model.parameters())
        hf = self._hf_model()
        lines = [
            f"TransformersModel: {type(hf).__name__} ({self.model_id or 'built from config'})",
            f"  parameters: {total:,} | device: {self.device} | mixed_precision: {self.mixed_precision} | "
            f"strategy: {self.strategy}",
        ]
        plan = getattr(self, "dist_plan", None)
        if plan is not None and plan.distributed:
            lines.append(f"  distributed: {plan.kind} over {plan.world_size} ranks (dp={plan.dp_size}, "
                         f"fsdp={plan.fsdp_size}{', HSDP' if plan.hsdp else ''}); wrapped: {self._wrapped}")
        for group in groups:
            trainable = _count(self._group_parameters(group))
            kind = "LoRA adapter" if group.is_adapter else "full model"
            lines.append(f"  group {group.name!r} ({kind}): trainable {trainable:,} "
                         f"({100.0 * trainable / max(total, 1):.4f}%), gradient_accumulation_steps="
                         f"{group.gradient_accumulation_steps}, cur_step={group.cur_step}")
            if group.is_adapter:
                config = self.model.peft_config[group.name]
                lines.append(f"    lora: r={getattr(config, 'r', '?')} alpha={getattr(config, 'lora_alpha', '?')} "
                             f"targets={sorted(getattr(config, 'target_modules', None) or [])}")
            for label, value in (("optimizer", group.optimizer), ("lr_scheduler", group.lr_scheduler),
                                 ("loss", group.loss), ("template", group.template),
                                 ("processor", group.processor), ("scaler", group.scaler)):
                if value is not None:
                    lines.append(f"    {label}: {type(value).__name__}")
        return "\n".join(lines)
