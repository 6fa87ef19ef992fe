"""Building a group's optimizer; Muon gets the hidden 2-D matrices and AdamW everything else.

``torch.optim.Muon`` only accepts 2-D parameters, and orthogonalised updates are meant for hidden
weight matrices, not for embedding tables or the output head (Keller Jordan's and Moonshot's
recipes keep those on AdamW). So when a group's trainable parameters are not all hidden
matrices, :class:`MuonWithAdamW` drives one Muon and one AdamW as a single optimizer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.optim import AdamW, Muon, Optimizer

from twinkle.checkpoint import check_optimizer_state as check_torch_optimizer_state

#: Keyword arguments only Muon understands; AdamW takes the rest (lr, weight_decay, ...).
MUON_ONLY_KWARGS = ("momentum", "nesterov", "ns_coefficients", "ns_steps", "adjust_lr_fn")
#: Keyword arguments only AdamW understands, given to Muon's partner optimizer.
ADAMW_ONLY_KWARGS = ("betas", "amsgrad", "foreach", "fused", "maximize", "capturable", "differentiable")


class MuonWithAdamW(Optimizer):
    """Muon over hidden 2-D matrices + AdamW over the rest, stepped, scheduled and saved as one.

    ``param_groups`` is the concatenation of both optimizers' groups (the same dicts), so an lr
    scheduler or a GradScaler sees every parameter. ``state_dict()`` is ``{'muon': ..., 'adamw': ...}``.
    """

    def __init__(self, muon_params: Iterable[torch.Tensor], adamw_params: Iterable[torch.Tensor],
                 lr: float = 1e-3, weight_decay: float = 0.1, **kwargs: Any) -> None:
        muon_kwargs = {k: kwargs.pop(k) for k in MUON_ONLY_KWARGS if k in kwargs}
        adamw_kwargs = {k: kwargs.pop(k) for k in ADAMW_ONLY_KWARGS if k in kwargs}
        eps = kwargs.pop("eps", None)
        if kwargs:
            raise TypeError(f"Muon got unexpected arguments {sorted(kwargs)}; Muon takes lr, weight_decay, eps, "
                            f"{', '.join(MUON_ONLY_KWARGS)} (AdamW partner: {', '.join(ADAMW_ONLY_KWARGS)}).")
        if eps is not None:
            muon_kwargs["eps"] = eps
        self.muon = Muon(list(muon_params), lr=lr, weight_decay=weight_decay, **muon_kwargs)
        self.adamw = AdamW(list(adamw_params), lr=lr, weight_decay=weight_decay, **adamw_kwargs)
        self.defaults = {"lr": lr, "weight_decay": weight_decay}
        # Optimizer.__init__ is not called (it would own a third copy of the params); set the hook
        # tables that torch's schedulers and hooks look for.
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict = OrderedDict()

    @property
    def optimizers(self) -> list[Optimizer]:
        return [self.muon, self.adamw]

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [group for opt in self.optimizers for group in opt.param_groups]

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]
        return {**self.muon.state, **self.adamw.state}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if closure is not None:
            raise ValueError("MuonWithAdamW.step does not take a closure.")
        for opt in self.optimizers:
            opt.step()
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:  # type: ignore[override]
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError(f"MuonWithAdamW state has keys {sorted(state_dict)}; expected 'muon' and 'adamw' "
                             "(was it saved by a different optimizer?).")
        check_optimizer_state(self.muon, state_dict["muon"])
        check_optimizer_state(self.adamw, state_dict["adamw"])
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])


def check_optimizer_state(optimizer: Optimizer, state_dict: Any) -> None:
    """Raise ValueError unless ``state_dict`` fits ``optimizer`` (same groups, same parameter counts)."""
    if isinstance(optimizer, MuonWithAdamW):
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"muon", "adamw"}:
            raise ValueError("the saved optimizer is not a Muon+AdamW state ('muon' and 'adamw' keys)")
        check_optimizer_state(optimizer.muon, state_dict["muon"])
        check_optimizer_state(optimizer.adamw, state_dict["adamw"])
        return
    check_torch_optimizer_state(optimizer, state_dict)


def _is_muon(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, Muon)


def build_optimizer(optimizer_cls: Any, params: list[torch.nn.Parameter], kwargs: dict[str, Any],
                    keep_on_adamw: set[int] | None = None) -> Optimizer:
    """Instantiate ``optimizer_cls`` over ``params``; Muon is split as the module docstring explains.

    ``keep_on_adamw`` holds ids of 2-D parameters that must not go to Muon (embeddings, lm head).
    """
    if not params:
        raise ValueError("This group has no trainable parameters; nothing to optimize.")
    name = getattr(optimizer_cls, "__name__", repr(optimizer_cls))
    try:
        if _is_muon(optimizer_cls):
            keep = keep_on_adamw or set()
            matrices = [p for p in params if p.ndim == 2 and id(p) not in keep]
            others = [p for p in params if p.ndim != 2 or id(p) in keep]
            if not others:
                return optimizer_cls(matrices, **kwargs)
            if optimizer_cls is not Muon:
                raise TypeError(f"{name} is a Muon subclass but the group has non-matrix parameters; pass an "
                                "optimizer instance built over the parameters you want.")
            return MuonWithAdamW(matrices, others, **kwargs)
        return optimizer_cls(params, **kwargs)
    except TypeError as exc:
        raise TypeError(f"set_optimizer({name}, {', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) failed: "
                        f"{exc}") from exc
