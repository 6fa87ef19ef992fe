"""get_train_configs: a readable picture of what trains and how it is split."""

from __future__ import annotations

from typing import Any


class SummaryMixin:
    """get_train_configs for MegatronModel."""

    def get_train_configs(self, *, adapter_name: str | None = None, **kwargs: Any) -> str:
        """Model, parallel layout, spec, precision and, per group, trainable parameters and components."""
        groups = [self._group(adapter_name)] if adapter_name is not None else list(self.optimizer_group.values())
        total = sum(p.numel() for p in self.gpt.parameters())
        lines = [
            f"MegatronModel: {self.args.family.architecture} ({self.model_id or 'built from config'})",
            f"  {self.device_mesh.describe()} | this rank: tp={self.ranks.tp} pp={self.ranks.pp} dp={self.ranks.dp} "
            f"| spec: {'transformer-engine' if self.use_te else 'local'} | device: {self.device} | "
            f"mixed_precision: {self.mixed_precision} | parameters on this rank: {total:,}",
        ]
        for group in groups:
            trainable = sum(p.numel() for p in self._group_parameters(group))
            kind = "LoRA adapter" if group.is_adapter else "full model"
            lines.append(f"  group {group.name!r} ({kind}): trainable {trainable:,} on this rank, "
                         f"gradient_accumulation_steps={group.gradient_accumulation_steps}, cur_step={group.cur_step}")
            if group.is_adapter:
                config = self.adapters[group.name]["config"]
                lines.append(f"    lora: r={config.r} alpha={config.lora_alpha} "
                             f"megatron layers={self.adapters[group.name]['suffixes']}")
            if group.optimizer is not None:
                lines.append(f"    optimizer: {group.optimizer.kind}")
            for label, value in (("lr_scheduler", group.lr_scheduler), ("loss", group.loss),
                                 ("template", group.template), ("processor", group.processor)):
                if value is not None:
                    lines.append(f"    {label}: {type(value).__name__}")
        return "\n".join(lines)
