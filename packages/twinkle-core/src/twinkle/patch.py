"""Model patches: named changes to a model's modules, applied with ``TwinkleModel.apply_patch``.

``apply_patch`` takes a :class:`Patch` instance, a subclass (built with the call's kwargs) or a
registered name (the ``patch`` kind: ``twinkle plugins --kind patch`` lists what is installed).
A patch changes module instances only, never a library's classes, so two models in one process
can be patched differently; :meth:`Patch.revert` undoes it where the patch supports that.

Built in: :class:`GradientCheckpointing` here (activation recomputation); twinkle-hf adds
``TransformersFusedCEPatch`` (cross-entropy without the logits tensor).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Patch(ABC):
    """Base class of model patches. Subclasses implement :meth:`apply` and, when they can, :meth:`revert`.

    ``module`` is what the backend patches (``TransformersModel.model``: the transformers or peft
    module; ``MegatronModel.gpt``). :meth:`on_model` then sees the TwinkleModel itself, for patches
    that also choose defaults of its groups (a loss, a forward task).
    """

    @abstractmethod
    def apply(self, module: Any) -> None:
        """Change ``module`` in place."""

    def revert(self, module: Any) -> None:
        """Undo :meth:`apply` on ``module``."""
        raise NotImplementedError(f"{type(self).__name__} cannot be reverted.")

    def on_model(self, model: Any) -> None:
        """Called with the TwinkleModel after :meth:`apply` (nothing by default)."""
        return None

    def __call__(self, module: Any) -> Any:
        self.apply(module)
        return module


def unwrap_model(module: Any) -> Any:
    """The model under a peft wrapper (``get_base_model``) or a DDP-style ``.module``."""
    module = getattr(module, "module", module)
    base = getattr(module, "get_base_model", None)
    return base() if callable(base) else module


def _layer_list(module: Any) -> Any:
    """The largest ``nn.ModuleList`` (the decoder layers of a transformer), or None."""
    import torch

    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)


class GradientCheckpointing(Patch):
    """Recompute each layer's activations during backward instead of keeping them from the forward.

    Activation memory drops from every layer's intermediates to one layer's (plus each layer's
    input), for about one more forward of compute; losses and gradients stay the same. A
    transformers model uses its own switch (``activation_checkpointing_enable``, formerly
    ``gradient_checkpointing_enable``; non-reentrant by default,
    which works with frozen embeddings under LoRA and with FSDP2); any other module gets each
    layer of its largest ``ModuleList`` wrapped in ``torch.utils.checkpoint``.
    """

    def __init__(self, use_reentrant: bool = False) -> None:
        self.use_reentrant = bool(use_reentrant)

    def apply(self, module: Any) -> None:
        model = unwrap_model(module)
        enable, keyword = _transformers_switch(model, "enable")
        if enable is not None:
            enable(**{keyword: {"use_reentrant": self.use_reentrant}})
            if self.use_reentrant and hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()  # reentrant checkpoints need an input that requires grad
            return
        layers = _layer_list(model)
        if layers is None:
            raise TypeError(f"GradientCheckpointing found no layers to checkpoint in {type(model).__name__} (no "
                            "gradient_checkpointing_enable() and no nn.ModuleList of layers).")
        from twinkle.kernel.patching import apply_patch

        self._patched = [apply_patch(layer, forward=_checkpointed(type(layer).forward, self.use_reentrant))
                         for layer in layers]

    def revert(self, module: Any) -> None:
        disable, _ = _transformers_switch(unwrap_model(module), "disable")
        if disable is not None:
            disable()
            return
        from twinkle.kernel.patching import restore

        for record in getattr(self, "_patched", []):
            restore(record)
        self._patched = []


def _transformers_switch(model: Any, action: str) -> tuple[Any, str | None]:
    """transformers' ``activation_checkpointing_<action>`` (5.x), else the older ``gradient_checkpointing_<action>``."""
    for prefix in ("activation", "gradient"):
        method = getattr(model, f"{prefix}_checkpointing_{action}", None)
        if method is not None:
            return method, f"{prefix}_checkpointing_kwargs"
    return None, None


def _checkpointed(forward: Any, use_reentrant: bool) -> Any:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils.checkpoint import checkpoint

        if not (self.training and torch.is_grad_enabled()):
            return forward(self, *args, **kwargs)
        return checkpoint(forward, self, *args, use_reentrant=use_reentrant, **kwargs)

    return run
