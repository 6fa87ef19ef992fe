"""The service's only contact with the model: the TwinkleModel API a training script calls, per tenant.

The model is any :class:`twinkle.model.MultiTenantModel` (``MultiLoraTransformersModel``,
``MultiLoraMegatronModel``, a third party's). Each client model is a tenant of it (``acquire_lora`` /
``release_lora``); its
Tinker operations map onto the component API one to one:

================================  ==================================================================
create_model (LoraConfig)         ``acquire_lora(tenant, LoraConfig(r, alpha, targets), seed=)`` +
                                  ``set_optimizer('default', ...)`` with Tinker's Adam defaults
forward_backward (loss_fn)        ``set_loss(loss_fn, **loss_fn_config)`` + ``forward_backward`` (one
                                  tenant) or ``forward_backward_multi`` (several), ``get_loss_outputs``
forward                           ``set_loss`` + ``forward_only`` + ``calculate_loss`` + ``get_loss_outputs``
optim_step (AdamParams)           ``set_optimizer_params(lr, betas, eps, weight_decay)`` +
                                  ``clip_grad_norm`` + ``step`` + ``zero_grad`` + ``lr_step``
save_weights / _for_sampler       ``save(name, dir, save_optimizer=...)``
load_weights                      ``resume_from_checkpoint(dir, resume_only_model=not optimizer)``
                                  (+ a fresh ``set_optimizer`` when the optimizer state is not loaded)
create from a checkpoint          ``load_lora(tenant, dir)`` (+ the optimizer state as above)
sample / compute_logprobs         ``Sampler.sample`` / ``compute_logprobs`` (``TorchSampler`` on the
                                  same model) with the tenant's name, or a spare slot holding saved weights
================================  ==================================================================

In ``--infra.mode ray`` the model is a proxy for its Ray actors and the same calls run there.
The losses are the registered Tinker-defined ones (sums over tokens), so gradients accumulate over
forward_backward calls until optim_step, as Tinker's do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle_server.wire import StepRequest

#: loss_fn values the server runs (the registered Tinker-defined losses).
LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo")
#: Tinker's AdamParams defaults (the client sends every field anyway).
ADAM_DEFAULTS = {"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-12, "weight_decay": 0.0}


class UserError(ValueError):
    """The request cannot run as given (bad loss, rank, config...); the client gets the message."""


@dataclass
class StepOutcome:
    """What one forward/forward_backward returns: per-datum outputs and the metrics."""

    outputs: list[dict[str, Any]]
    metrics: dict[str, float]


def tenant_name(model_id: str) -> str:
    """The MultiLora tenant name of a client model id (``<session>:train:<n>``)."""
    return "m_" + model_id.replace(":", "_")


class Engine:
    """Tinker operations on one shared multi-tenant model (local object or Ray proxy)."""

    def __init__(self, model: Any, targets: dict[str, list[str]], *, lora_alpha: int, max_rank: int,
                 batching: bool, sampler: Any = None, no_sampler: str | None = None) -> None:
        self.model = model
        self.sampler = sampler
        self.no_sampler = no_sampler  # why there is no sampler (told to a client that asks for one)
        self.targets = targets
        self.lora_alpha = lora_alpha
        self.max_rank = max_rank
        self.batching = batching
        self.weights_version: dict[str, int] = {}

    # --------------------------------------------------------------- tenants
    def lora_config(self, lora: dict[str, Any]) -> Any:
        """peft LoraConfig for Tinker's LoraConfig fields (rank, train_attn/mlp/unembed)."""
        from peft import LoraConfig

        rank = lora.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= self.max_rank:
            raise UserError(f"lora_config.rank={rank!r}: this server takes ranks 1..{self.max_rank} "
                            "(server.max_rank).")
        modules = [m for part in ("attn", "mlp", "unembed") if lora.get(f"train_{part}", True)
                   for m in self.targets.get(part, [])]
        if not modules:
            raise UserError("lora_config trains nothing: set at least one of train_attn, train_mlp, train_unembed "
                            f"(this model has {', '.join(k for k, v in self.targets.items() if v)} layers).")
        return LoraConfig(r=rank, lora_alpha=self.lora_alpha, lora_dropout=0.0, target_modules=modules)

    def create(self, model_id: str, lora: dict[str, Any]) -> None:
        config = self.lora_config(lora)
        tenant = tenant_name(model_id)
        try:
            self.model.acquire_lora(tenant, config, seed=lora.get("seed"))
        except RuntimeError as exc:  # every slot taken
            raise UserError(str(exc)) from None
        self._set_optimizer(tenant)
        self.weights_version[model_id] = 0

    def create_from_checkpoint(self, model_id: str, directory: Path, optimizer: bool) -> dict[str, Any]:
        """A new tenant with a saved adapter's config and weights (and its optimizer state); returns its lora."""
        tenant = tenant_name(model_id)
        self.model.load_lora(tenant, str(directory))
        try:
            self._set_optimizer(tenant)
            if optimizer:
                self.model.resume_from_checkpoint(str(directory), adapter_name=tenant)
        except BaseException:
            self.model.release_lora(tenant)
            raise
        self.weights_version[model_id] = 0
        return lora_of_checkpoint(directory, self.targets)

    def unload(self, model_id: str) -> None:
        self.model.release_lora(tenant_name(model_id))
        self.weights_version.pop(model_id, None)

    def _set_optimizer(self, tenant: str) -> None:
        """The backend's own Adam(W) (``'default'``: torch AdamW, megatron-core's distributed Adam) with Tinker's
        defaults; every optim_step sets the client's hyper-parameters on it."""
        self.model.set_optimizer("default", adapter_name=tenant, lr=ADAM_DEFAULTS["lr"])
        self.model.set_optimizer_params(adapter_name=tenant, **{k: v for k, v in ADAM_DEFAULTS.items() if k != "lr"})

    # ----------------------------------------------------------------- steps
    @staticmethod
    def check_loss(request: StepRequest) -> str:
        """Refuse an unknown loss or a bad config before queueing; returns the loss metric's name.

        The Tinker-defined losses are sums over tokens (``loss:sum``); the GRPO family's ``gspo``
        averages over sequences (``loss:mean``), which is how the client combines chunked results.
        """
        from twinkle.registry import resolve

        if request.loss_fn == "custom":
            raise UserError("loss_fn='custom' (a traced loss run by the server) is not supported here; "
                            "forward_backward_custom with a Python loss function works (it runs client-side "
                            "on top of cross_entropy).")
        if request.loss_fn not in LOSSES:
            raise UserError(f"loss_fn={request.loss_fn!r} is not supported; this server runs {', '.join(LOSSES)}.")
        try:
            loss = resolve("loss", request.loss_fn)(**request.loss_fn_config)
        except (TypeError, ValueError) as exc:
            raise UserError(f"loss_fn_config {request.loss_fn_config} for {request.loss_fn!r}: {exc}") from None
        return "loss:sum" if loss.reduction == "sum" else "loss:mean"

    def _set_loss(self, tenant: str, request: StepRequest) -> None:
        self.model.set_loss(request.loss_fn, adapter_name=tenant, **request.loss_fn_config)

    def forward_backward(self, requests: dict[str, StepRequest]) -> dict[str, StepOutcome]:
        """One step per model id: a single tenant alone, several as one batched multi-tenant step."""
        tenants = {model_id: tenant_name(model_id) for model_id in requests}
        for model_id, request in requests.items():
            self._set_loss(tenants[model_id], request)
        if len(requests) > 1 and self.batching:
            losses = self.model.forward_backward_multi({tenants[m]: r.rows for m, r in requests.items()})
            losses = {m: losses[tenants[m]] for m in requests}
        else:
            losses = {m: self.model.forward_backward(inputs=r.rows, adapter_name=tenants[m])
                      for m, r in requests.items()}
        return {m: self._outcome(tenants[m], losses[m], requests[m]) for m in requests}

    def forward(self, model_id: str, request: StepRequest) -> StepOutcome:
        tenant = tenant_name(model_id)
        self._set_loss(tenant, request)
        self.model.forward_only(inputs=request.rows, adapter_name=tenant)
        return self._outcome(tenant, self.model.calculate_loss(adapter_name=tenant), request)

    def _outcome(self, tenant: str, loss: float, request: StepRequest) -> StepOutcome:
        outputs = [{k: v for k, v in sample.items() if getattr(v, "ndim", 0) == 1}
                   for sample in self.model.get_loss_outputs(adapter_name=tenant)]
        return StepOutcome(outputs, {request.metric: float(loss)})

    def optim_step(self, model_id: str, params: dict[str, Any]) -> dict[str, float]:
        """One AdamW step with the request's hyper-parameters (Tinker sends them with every step)."""
        tenant = tenant_name(model_id)
        self.model.set_optimizer_params(adapter_name=tenant, lr=params["learning_rate"],
                                        betas=(params["beta1"], params["beta2"]), eps=params["eps"],
                                        weight_decay=params["weight_decay"])
        clip = params.get("grad_clip_norm") or 0.0
        norm = self.model.clip_grad_norm(clip if clip > 0 else math.inf, adapter_name=tenant)  # inf: measure only
        self.model.step(adapter_name=tenant)
        self.model.zero_grad(adapter_name=tenant)
        self.model.lr_step(adapter_name=tenant)
        self.weights_version[model_id] = self.weights_version.get(model_id, 0) + 1
        return {} if norm is None else {"grad_norm:mean": float(norm)}

    # ------------------------------------------------------------ checkpoints
    def save(self, model_id: str, directory: Path, optimizer: bool) -> None:
        self.model.save(directory.name, str(directory.parent), adapter_name=tenant_name(model_id),
                        save_optimizer=optimizer)

    def load(self, model_id: str, directory: Path, optimizer: bool) -> None:
        """The checkpoint's weights and optimizer state -- or, without it, a fresh optimizer (Tinker's load_state)."""
        tenant = tenant_name(model_id)
        self.model.resume_from_checkpoint(str(directory), resume_only_model=not optimizer, adapter_name=tenant)
        if not optimizer:
            self._set_optimizer(tenant)
        self.weights_version[model_id] = self.weights_version.get(model_id, 0) + 1

    # --------------------------------------------------------------- sampling
    @contextmanager
    def adapter_for(self, model_id: str | None, version: int | None, directory: Path | None) -> Iterator[str]:
        """The tenant to sample with: the live one while its weights are still ``version``, else a spare slot.

        The spare slot is loaded from ``directory`` (a saved adapter) or, for the base model, left at its
        initial weights (lora_B is zero, so it adds nothing); it is released after the request.
        """
        if model_id is not None and version is not None and self.weights_version.get(model_id) == version:
            yield tenant_name(model_id)
            return
        spare = "sample_" + (model_id or "base").replace(":", "_")
        try:
            if directory is not None:
                self.model.load_lora(spare, str(directory))
            else:
                self.model.acquire_lora(spare, self.lora_config({"rank": 1, "train_mlp": False,
                                                                 "train_unembed": False}))
        except RuntimeError as exc:  # every slot taken
            raise UserError(f"no free LoRA slot to serve these weights ({exc}); sample while the training "
                            "client's weights are unchanged, or free a slot (unload a model).") from None
        try:
            yield spare
        finally:
            self.model.release_lora(spare)

    def sample(self, adapter: str, prompt: list[int], params: Any, num_samples: int,
               prompt_logprobs: bool) -> tuple[list[Any], list[float | None] | None]:
        """``num_samples`` completions of ``prompt`` (and the prompt's own logprobs when asked)."""
        from twinkle.sampler import SamplingParams

        try:
            settings = SamplingParams(max_tokens=params.max_tokens or 128, temperature=params.temperature,
                                      top_p=params.top_p, top_k=params.top_k, n=num_samples,
                                      stop=params.stop if params.stop is None else _stops(params.stop),
                                      seed=params.seed)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        result = self.sampler.sample([prompt], settings, adapter_name=adapter)[0]
        scored = self.sampler.compute_logprobs([prompt], adapter_name=adapter)[0] if prompt_logprobs else None
        return result.sequences, scored


def _stops(stop: Any) -> Any:
    return stop if isinstance(stop, str) else list(stop)


def lora_of_checkpoint(directory: Path, targets: dict[str, list[str]]) -> dict[str, Any]:
    """Tinker's LoraConfig fields of a saved adapter (rank and which layer families it trains)."""
    config = json.loads((directory / "adapter_config.json").read_text())
    modules = set(config.get("target_modules") or [])
    return {"rank": int(config["r"]), "seed": None,
            **{f"train_{part}": bool(modules & set(names)) for part, names in targets.items()}}
