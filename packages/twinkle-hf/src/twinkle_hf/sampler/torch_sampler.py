"""TorchSampler: HF ``generate`` with a KV cache on a TransformersModel's own weights (no copy, no sync).

Prompts are left-padded into one batch per adapter; a MultiLoraTransformersModel samples every
tenant of a request in one batch, each row range routed through its tenant's slot. Each prompt is
repeated ``n`` times (rows ``i*n .. i*n+n-1``), so greedy decoding and routes need nothing special.
``logprobs`` are read from the raw logits (before temperature and filters): the model's own
distribution, what :meth:`compute_logprobs` and the policy-gradient losses compute. The model's
hub ``generation_config`` (repetition penalties, default top-k...) is set aside during a call: only
the request's :class:`~twinkle.sampler.SamplingParams` shape the sampling.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch
from transformers import GenerationConfig

from twinkle.engine import Route
from twinkle.loss.token_inputs import gather_logprobs
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.sampler import (
    Sampler,
    SampleResult,
    SamplingParams,
    as_prompts,
    check_prompt_limits,
    per_prompt_adapters,
)
from twinkle.sampler.base import Adapters, Prompts
from twinkle.sampler.stops import finish
from twinkle_hf.model.backend import HFBackend


class TorchSampler(Sampler):
    """Sampling and scoring on ``model`` (a ``TransformersModel`` or ``MultiLoraTransformersModel``).

    ``tokenizer`` decodes samples (``text``) and serves stop strings; by default the tokenizer of a
    template set on the model, else none.
    """

    def __init__(self, model: Any, *, tokenizer: Any = None) -> None:
        if not isinstance(getattr(model, "backend", None), HFBackend):
            raise TypeError(f"TorchSampler samples on a TransformersModel or MultiLoraTransformersModel, got "
                            f"{type(model).__name__}.")
        self.model = model
        self._tokenizer = tokenizer
        self._modules: tuple[Any, list[torch.nn.Module]] | None = None  # (structure key, every submodule)

    # ------------------------------------------------------------------ public API
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            for group in self.model.optimizer_group.values():
                if group.template is not None:
                    return group.template.tokenizer
        return self._tokenizer

    def sample(self, prompts: Prompts, sampling_params: SamplingParams | None = None, *,
               adapter_name: Adapters = None) -> list[SampleResult]:
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a twinkle.sampler.SamplingParams, got {type(params).__name__}.")
        prompts = as_prompts(prompts)
        groups = self._groups(adapter_name, len(prompts))
        self._check_length(max(map(len, prompts)) + params.max_tokens)
        self._check_prompts(prompts, params.max_tokens, "prompts")
        results: list[SampleResult | None] = [None] * len(prompts)
        with self._inference():
            for indices in self._batches(groups):
                rows = [prompts[i] for i in indices for _ in range(params.n)]
                row_groups = [groups[i] for i in indices for _ in range(params.n)]
                sequences = self._generate(rows, row_groups, params)
                for k, i in enumerate(indices):
                    results[i] = SampleResult(prompts[i], sequences[k * params.n:(k + 1) * params.n],
                                              self._public_name(groups[i]))
        return results

    def compute_logprobs(self, sequences: Prompts, *, adapter_name: Adapters = None,
                         reference: bool = False) -> list[list[float | None]]:
        sequences = as_prompts(sequences, "sequences")
        groups = self._groups(adapter_name, len(sequences))
        self._check_length(max(map(len, sequences)))
        self._check_prompts(sequences, 0, "sequences")
        out: list[list[float | None] | None] = [None] * len(sequences)
        with self._inference():
            for indices in self._batches(groups, reference):
                rows = [sequences[i] for i in indices]
                values = self._score(rows, [groups[i] for i in indices], reference)
                for i, row_values in zip(indices, values):
                    out[i] = row_values
        return out

    def sync_weights(self, model: Any = None, *, adapter_name: str | None = None) -> None:
        """Nothing to do: the sampler reads the training model's parameters directly."""
        if model is not None and model is not self.model:
            raise ValueError("This TorchSampler samples on its own model's weights; sync_weights(model) with another "
                             "model would change nothing. Build a TorchSampler for that model instead.")

    # ------------------------------------------------------------------ batches and adapters
    def _groups(self, adapter_name: Adapters, count: int) -> list[OptimizerGroup]:
        return [self.model._group(name) for name in per_prompt_adapters(adapter_name, count)]

    def _public_name(self, group: OptimizerGroup) -> str | None:
        multi = getattr(self.model, "multi_lora", None)
        if multi is not None:
            return multi.resolve(group.name).tenant_adapter_name
        return group.name if group.is_adapter else None

    def _multi(self) -> bool:
        return getattr(self.model, "slots", None) is not None

    def _batches(self, groups: list[OptimizerGroup], reference: bool = False) -> list[list[int]]:
        """Prompt indices per forward batch: all at once for slots (or the shared reference), else per adapter."""
        if self._multi() or reference:
            return [sorted(range(len(groups)), key=lambda i: groups[i].name)]
        order: dict[str, list[int]] = {}
        for i, group in enumerate(groups):
            order.setdefault(group.name, []).append(i)
        return list(order.values())

    def _adapters(self, groups: Sequence[OptimizerGroup], reference: bool) -> Any:
        """Rows run through their group's adapter (or the reference policy), as the backend routes them."""
        backend = self.model.backend
        if reference:
            return backend.reference_mode([Route(groups[0])])
        if not self._multi():
            return backend.routed([Route(groups[0])])
        routes, start = [], 0
        for k in range(1, len(groups) + 1):
            if k == len(groups) or groups[k].name != groups[start].name:
                routes.append(Route(groups[start], slice(start, k)))
                start = k
        return backend.routed(routes)

    @contextmanager
    def _inference(self) -> Iterator[None]:
        """Eval mode without gradients, under the model's lock when it has one; the training mode is restored."""
        with self.model.lock:
            module = self.model.model
            with torch.no_grad(), _eval_mode(module, self.model.backend.hf_model(), self._submodules(module)):
                yield

    def _submodules(self, module: torch.nn.Module) -> list[torch.nn.Module]:
        """Every submodule of ``module``, listed once per structure: the list is made again when the root
        module, the model's groups (adapters inject layers) or its patches change."""
        key = (id(module), tuple(self.model.optimizer_group), len(getattr(self.model, "patches", ())))
        if self._modules is None or self._modules[0] != key:
            self._modules = (key, list(module.modules()))
        return self._modules[1]

    def _check_length(self, tokens: int) -> None:
        limit = getattr(self.model, "max_length", None)
        if limit is not None and tokens > limit:
            raise ValueError(f"Prompt plus max_tokens reach {tokens} tokens but the model was built with "
                             f"max_length={limit}; shorten the prompts or lower max_tokens.")

    def _check_prompts(self, prompts: list[list[int]], max_tokens: int, what: str) -> None:
        """Token ids inside the embedding, and prompt + max_tokens within the model's positions."""
        backend = self.model.backend
        config = backend.hf_model().config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        check_prompt_limits(prompts, vocab_size=backend.vocab_size, max_tokens=max_tokens, what=what,
                            max_positions=getattr(text, "max_position_embeddings", None))

    # ------------------------------------------------------------------ generation
    def _eos_ids(self) -> list[int]:
        hf = self.model.backend.hf_model()
        for source in (hf.generation_config, hf.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            if value is not None:
                return [value] if isinstance(value, int) else [int(v) for v in value]
        return []

    def _generate(self, rows: list[list[int]], groups: list[OptimizerGroup], params: SamplingParams) -> list[Any]:
        model, backend, device = self.model, self.model.backend, self.model.device
        pad = backend.pad_token_id(groups[0])
        width = max(map(len, rows))
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        stop_ids = params.stop_token_ids(self._eos_ids())
        options: dict[str, Any] = dict(max_new_tokens=params.max_tokens, pad_token_id=pad, do_sample=not params.greedy,
                                       eos_token_id=stop_ids or None)
        if not params.greedy:
            options.update(temperature=float(params.temperature), top_p=float(params.top_p),
                           top_k=params.top_k_or_none or 0)
        extra: dict[str, Any] = {}
        if params.stop_strings and self.tokenizer is not None:
            extra = dict(stop_strings=params.stop_strings, tokenizer=self.tokenizer)
        hf = backend.hf_model()
        saved_config = hf.generation_config
        rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else []) \
            if params.seed is not None else nullcontext()
        with ExitStack() as stack:
            stack.enter_context(rng)
            if params.seed is not None:
                torch.manual_seed(params.seed)
            stack.enter_context(self._adapters(groups, reference=False))
            stack.enter_context(backend.precision.autocast())
            steps = stack.enter_context(_sampled_logprobs(hf))
            hf.generation_config = GenerationConfig()  # only the request's parameters shape the sampling
            try:
                out = model.model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                           generation_config=GenerationConfig(**options),
                                           synced_gpus=bool(backend.dist_plan.sharded), **extra)
            finally:
                hf.generation_config = saved_config
        generated = out[:, width:]
        logprobs = steps.result(generated)
        decode = self._decoder()
        return [finish(tokens, values, stop_ids, params.stop_strings, decode)
                for tokens, values in zip(generated.tolist(), logprobs.tolist())]

    def _decoder(self) -> Any:
        tokenizer = self.tokenizer
        if tokenizer is None:
            return None
        return lambda tokens: tokenizer.decode(tokens, skip_special_tokens=False)

    # ------------------------------------------------------------------ scoring
    def _score(self, rows: list[list[int]], groups: list[OptimizerGroup], reference: bool) -> list[list[float | None]]:
        model, backend = self.model, self.model.backend
        pad = backend.pad_token_id(groups[0])
        width = max(map(len, rows))
        batch = {"input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=model.device),
                 "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows],
                                                device=model.device)}
        with self._adapters(groups, reference), backend.precision.autocast():
            logits = backend.run_unwrapped("causal_lm", batch, None).logits
        values = gather_logprobs(logits[:, :-1], batch["input_ids"][:, 1:]).tolist()
        return [[None] + values[k][:len(r) - 1] for k, r in enumerate(rows)]


@contextmanager
def _sampled_logprobs(hf_model: torch.nn.Module) -> Iterator[_StepLogprobs]:
    """Inside the block, the log-probability of every token ``generate`` samples with ``hf_model``, step by step.

    A forward hook reads each forward's last-position logits (what generate samples from) and, at the next
    forward, the token sampled from them (that forward's last input id): only one step's logits are held,
    so nothing grows with the number of steps. (Asking ``generate`` for ``output_logits`` keeps every
    step's logits alive, and with ``return_dict_in_generate`` the KV cache too: about 5% of a call here.)
    """
    record = _StepLogprobs()
    handle = hf_model.register_forward_hook(record, with_kwargs=True)
    try:
        yield record
    finally:
        handle.remove()


class _StepLogprobs:
    """The forward hook of :func:`_sampled_logprobs`."""

    def __init__(self) -> None:
        self.values: list[torch.Tensor] = []
        self.last: torch.Tensor | None = None

    def __call__(self, module: torch.nn.Module, args: Any, kwargs: Mapping[str, Any], output: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if self.last is not None and isinstance(ids, torch.Tensor):
            self.values.append(token_logprobs(self.last, ids[:, -1]))
        logits = output["logits"] if isinstance(output, Mapping) else getattr(output, "logits", output)
        self.last = logits[:, -1]

    def result(self, tokens: torch.Tensor) -> torch.Tensor:
        """(rows, steps) log-probabilities of ``tokens`` (the generated ids); forwards after the last token
        (deferred stop checks, ``synced_gpus`` peers) are ignored."""
        steps = tokens.shape[1]
        if not steps:
            return tokens.new_zeros(tokens.shape, dtype=torch.float32)
        if len(self.values) < steps and self.last is not None:  # the last token: no forward came after it
            self.values.append(token_logprobs(self.last, tokens[:, len(self.values)]))
        return torch.stack(self.values[:steps], dim=1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[token]`` per row: one fused log-softmax of the row, then the token's entry.

    (Half the CPU time of ``logit - logsumexp``, which the losses' ``gather_logprobs`` computes; the two
    agree to float32 rounding.)
    """
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None].long()).squeeze(-1)


def sampled_logprobs(step_logits: Sequence[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """``log p(token)`` of every generated token (rows, steps) from each step's raw logits."""
    if tokens.shape[1] == 0:
        return tokens.new_zeros(tokens.shape, dtype=torch.float32)
    return torch.stack([token_logprobs(step_logits[k], tokens[:, k]) for k in range(tokens.shape[1])], dim=1)


@contextmanager
def _eval_mode(module: torch.nn.Module, hf_model: Any, submodules: Sequence[torch.nn.Module] | None = None
               ) -> Iterator[None]:
    """``module`` in eval mode for the block, then every submodule's flag as it was.

    Setting the flags directly is ``module.train(False)`` without its recursive calls (what it costs
    matters per sample call); a model using hub kernels, whose ``train()`` swaps them, goes through it.
    ``submodules``: ``module.modules()`` listed beforehand.
    """
    if getattr(hf_model, "use_kernels", False):
        training = module.training
        module.train(False)
        try:
            yield
        finally:
            module.train(training)
        return
    switched = [m for m in (submodules if submodules is not None else module.modules()) if m.training]
    for m in switched:
        m.training = False
    try:
        yield
    finally:
        for m in switched:
            m.training = True
