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
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle_server.paging import Pager
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
    """Tinker operations on one shared multi-tenant model (local object or Ray proxy).

    Tenants hold slots through a :class:`twinkle_server.paging.Pager`: any number of models, paged
    out and back as slots are needed. ``weights_version`` names each model's current weights (a new
    random token at every change), so a sampling snapshot can tell whether the live tenant still
    holds its weights -- across restarts too, as the service persists the tokens.
    """

    def __init__(self, model: Any, targets: dict[str, list[str]], *, lora_alpha: int, max_rank: int,
                 batching: bool, sampler: Any = None, no_sampler: str | None = None, slots: int = 1,
                 work_dir: Path | None = None,
                 page_memory_bytes: int = 0, grad_hold_s: float = 60.0, vocab_size: int | None = None,
                 template: tuple[str, str] | None = None) -> None:
        import tempfile

        self.model = model
        self.sampler = sampler
        self.no_sampler = no_sampler  # why there is no sampler (told to a client that asks for one)
        self.targets = targets
        self.lora_alpha = lora_alpha
        self.max_rank = max_rank
        self.batching = batching
        self.vocab_size = vocab_size
        self.template = template  # (VL template name, model id): a vision-language model's tenants collate images
        self.weights_version: dict[str, str] = {}
        root = work_dir if work_dir is not None else Path(tempfile.mkdtemp(prefix="twinkle-server-"))
        self.pager = Pager(model, slots, root, memory_bytes=page_memory_bytes, grad_hold_s=grad_hold_s,
                           reset_optimizer=self._setup_tenant)

    @property
    def slots(self) -> int:
        return self.pager.capacity

    # --------------------------------------------------------------- tenants
    def lora_config(self, lora: dict[str, Any]) -> Any:
        """peft LoraConfig for Tinker's LoraConfig fields (rank, train_attn/mlp/unembed)."""
        from peft import LoraConfig

        rank = lora.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= self.max_rank:
            raise UserError(f"lora_config.rank={rank!r}: this server takes ranks 1..{self.max_rank} "
                            "(server.max_rank).")
        seed = lora.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
            raise UserError(f"lora_config.seed={seed!r}: use an integer in 0..{2**32 - 1} (or none).")
        modules = [m for part in ("attn", "mlp", "unembed") if lora.get(f"train_{part}", True)
                   for m in self.targets.get(part, [])]
        if not modules:
            raise UserError("lora_config trains nothing: set at least one of train_attn, train_mlp, train_unembed "
                            f"(this model has {', '.join(k for k, v in self.targets.items() if v)} layers).")
        return LoraConfig(r=rank, lora_alpha=self.lora_alpha, lora_dropout=0.0, target_modules=modules)

    def has(self, model_id: str) -> bool:
        return self.pager.known(tenant_name(model_id))

    def create(self, model_id: str, lora: dict[str, Any]) -> str:
        """A new tenant with peft's init (drawn from ``lora['seed']``); returns its weights version."""
        config = self.lora_config(lora)
        tenant = tenant_name(model_id)

        def acquire() -> None:
            self.model.acquire_lora(tenant, config, seed=lora.get("seed"))
            try:
                self._setup_tenant(tenant)
            except BaseException:
                self.model.release_lora(tenant)
                raise

        self.pager.admit(tenant, "train", acquire)
        return self._new_version(model_id)

    def create_from_checkpoint(self, model_id: str, directory: Path, optimizer: bool) -> dict[str, Any]:
        """A new tenant with a saved adapter's config and weights (and its optimizer state); returns its lora."""
        tenant = tenant_name(model_id)

        def acquire() -> None:
            self.model.load_lora(tenant, str(directory))
            try:
                self._setup_tenant(tenant)
                if optimizer:
                    self.model.resume_from_checkpoint(str(directory), adapter_name=tenant)
            except BaseException:
                self.model.release_lora(tenant)
                raise

        self.pager.admit(tenant, "train", acquire)
        self._new_version(model_id)
        return lora_of_checkpoint(directory, self.targets)

    def unload(self, model_id: str) -> None:
        self.pager.drop(tenant_name(model_id))
        self.weights_version.pop(model_id, None)

    def _new_version(self, model_id: str) -> str:
        self.weights_version[model_id] = "v" + secrets.token_hex(8)
        return self.weights_version[model_id]

    def _setup_tenant(self, tenant: str) -> None:
        """A tenant's components: Tinker's Adam, and for a vision-language model the VL template (images)."""
        self._set_optimizer(tenant)
        if self.template is not None:
            name, model_id = self.template
            self.model.set_template(name, adapter_name=tenant, model_id=model_id)

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
        for key, value in request.loss_fn_config.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"loss_fn_config[{key!r}]={value}: values must be finite.")
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
        with self.pager.use(list(tenants.values())):
            for model_id, request in requests.items():
                self._set_loss(tenants[model_id], request)
            if len(requests) > 1 and self.batching:
                losses = self.model.forward_backward_multi({tenants[m]: r.rows for m, r in requests.items()})
                losses = {m: losses[tenants[m]] for m in requests}
            else:
                losses = {m: self.model.forward_backward(inputs=r.rows, adapter_name=tenants[m])
                          for m, r in requests.items()}
            for tenant in tenants.values():
                self.pager.set_dirty(tenant, True)
            return {m: self._outcome(tenants[m], losses[m], requests[m]) for m in requests}

    def forward(self, model_id: str, request: StepRequest) -> StepOutcome:
        tenant = tenant_name(model_id)
        with self.pager.use([tenant]):
            self._set_loss(tenant, request)
            self.model.forward_only(inputs=request.rows, adapter_name=tenant)
            return self._outcome(tenant, self.model.calculate_loss(adapter_name=tenant), request)

    def _outcome(self, tenant: str, loss: float, request: StepRequest) -> StepOutcome:
        outputs = [{k: v for k, v in sample.items() if getattr(v, "ndim", 0) == 1}
                   for sample in self.model.get_loss_outputs(adapter_name=tenant)]
        return StepOutcome(outputs, {request.metric: float(loss)})

    def optim_step(self, model_id: str, params: dict[str, Any]) -> dict[str, float]:
        """One AdamW step with the request's hyper-parameters (Tinker sends them with every step).

        Gradients that are inf/NaN (an overflowing loss) are dropped and the step refused: the
        tenant's weights and optimizer state stay as they were, and the client is told why.
        """
        tenant = tenant_name(model_id)
        if self.pager.take_dropped(tenant):
            raise UserError("optim_step changed nothing: the gradients of the forward_backward calls since the last "
                            "optim_step were dropped, because the model sat idle holding them while other models "
                            f"needed its LoRA slot (more than server.grad_hold_s={self.pager.grad_hold_s:g} s). Send "
                            "those forward_backward calls again, then optim_step.")
        with self.pager.use([tenant]):
            self.model.set_optimizer_params(adapter_name=tenant, lr=params["learning_rate"],
                                            betas=(params["beta1"], params["beta2"]), eps=params["eps"],
                                            weight_decay=params["weight_decay"])
            clip = params.get("grad_clip_norm") or 0.0
            norm = self.model.clip_grad_norm(clip if clip > 0 else math.inf, adapter_name=tenant)  # inf: measure
            if norm is not None and not math.isfinite(float(norm)):
                self.model.zero_grad(adapter_name=tenant)  # drops the window's gradients, nothing applied
                self.pager.set_dirty(tenant, False)
                raise UserError(f"optim_step refused: the gradient norm is {float(norm)} (the loss of the "
                                "forward_backward calls since the last optim_step overflowed; check the datum weights, "
                                "advantages and logprobs). Those gradients were dropped; the model's weights and "
                                "optimizer state are unchanged.")
            self.model.step(adapter_name=tenant)
            self.model.zero_grad(adapter_name=tenant)
            self.model.lr_step(adapter_name=tenant)
            self.pager.set_dirty(tenant, False)
        self._new_version(model_id)
        return {} if norm is None else {"grad_norm:mean": float(norm)}

    # ------------------------------------------------------------ checkpoints
    def save(self, model_id: str, directory: Path, optimizer: bool) -> None:
        tenant = tenant_name(model_id)
        with self.pager.use([tenant]):
            self.model.save(directory.name, str(directory.parent), adapter_name=tenant, save_optimizer=optimizer)

    def load(self, model_id: str, directory: Path, optimizer: bool) -> None:
        """The checkpoint's weights and optimizer state -- or, without it, a fresh optimizer (Tinker's load_state)."""
        tenant = tenant_name(model_id)
        with self.pager.use([tenant]):
            self.model.resume_from_checkpoint(str(directory), resume_only_model=not optimizer, adapter_name=tenant)
            if not optimizer:
                self._set_optimizer(tenant)
            self.pager.set_dirty(tenant, False)
        self.pager.take_dropped(tenant)
        self._new_version(model_id)

    # --------------------------------------------------------------- sampling
    @contextmanager
    def adapter_for(self, sampler_id: str, model_id: str | None, version: str | None,
                    directory: Path | None) -> Iterator[str]:
        """The tenant to sample with: the live one while its weights are still ``version``, else the saved adapter.

        The saved adapter (``directory``; None: the base model, a slot whose LoRA adds nothing) gets a slot
        of its own like any model: it stays while used and is released when a slot is needed.
        """
        if model_id is not None and version is not None and self.weights_version.get(model_id) == version \
                and self.has(model_id):
            tenant = tenant_name(model_id)
        else:
            tenant = "s_" + re.sub(r"[^A-Za-z0-9_]", "_", sampler_id)
            if not self.pager.known(tenant):
                if directory is not None:
                    def acquire() -> None:
                        self.model.load_lora(tenant, str(directory))
                else:
                    config = self.lora_config({"rank": 1, "train_mlp": False, "train_unembed": False})

                    def acquire() -> None:
                        self.model.acquire_lora(tenant, config)
                self.pager.admit(tenant, "sample", acquire)
        with self.pager.use([tenant]):
            yield tenant

    def forget_sampler(self, sampler_id: str) -> None:
        self.pager.drop("s_" + re.sub(r"[^A-Za-z0-9_]", "_", sampler_id))

    def sample(self, adapter: str, prompts: list[list[int]], params: Any, max_tokens: int,
               seed: int | None) -> list[Any]:
        """One completion of each of ``prompts`` (``max_tokens`` new tokens at most)."""
        from twinkle.sampler import SamplingParams

        try:
            settings = SamplingParams(max_tokens=max_tokens, temperature=params.temperature, top_p=params.top_p,
                                      top_k=params.top_k, n=1, seed=seed,
                                      stop=params.stop if params.stop is None else _stops(params.stop))
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return [r.sequences[0] for r in self.sampler.sample(prompts, settings, adapter_name=adapter)]

    def prompt_logprobs(self, adapter: str, prompt: list[int]) -> list[float | None]:
        return self.sampler.compute_logprobs([prompt], adapter_name=adapter)[0]

    def cut_at_stop_strings(self, tokens: list[int], logprobs: list[float], params: Any) -> Any:
        """A sequence sampled in slices, cut at a stop string that spans two slices (None: no such stop)."""
        from twinkle.sampler.stops import finish

        strings = [s for s in ([params.stop] if isinstance(params.stop, str) else list(params.stop or []))
                   if isinstance(s, str)]
        tokenizer = getattr(self.sampler, "tokenizer", None)
        if not strings or tokenizer is None:
            return None
        done = finish(tokens, logprobs, [], strings, lambda t: tokenizer.decode(t, skip_special_tokens=False))
        return done if done.stop_reason == "stop" else None


def _stops(stop: Any) -> Any:
    return stop if isinstance(stop, str) else list(stop)


def lora_of_checkpoint(directory: Path, targets: dict[str, list[str]]) -> dict[str, Any]:
    """Tinker's LoraConfig fields of a saved adapter (rank and which layer families it trains)."""
    config = json.loads((directory / "adapter_config.json").read_text())
    modules = set(config.get("target_modules") or [])
    return {"rank": int(config["r"]), "seed": None,
            **{f"train_{part}": bool(modules & set(names)) for part, names in targets.items()}}
