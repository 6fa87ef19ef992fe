"""VLLMSampler: sampling on a vLLM engine, LoRA adapters per request, weights synced from the trainer.

vLLM is an extra (``pip install 'twinkle-hf[vllm]'``, CUDA only) imported on first use, never at
module import. The engine keeps its own copy of the weights, so after each optimizer step the
trainer calls :meth:`VLLMSampler.sync_weights`:

* a LoRA adapter (or multi-LoRA tenant) is written as a PEFT directory (``model.save``) and
  registered under a fresh LoRA id, so vLLM loads the new version on the next request (the old id is
  removed);
* full-model weights go in memory: the HF-named tensors are handed to the engine's ``load_weights``
  (through ``LLM.apply_model``) and the prefix cache is reset. A transformers model's tensors are
  gathered one at a time, cast to the engine's dtype and sent in buckets (``weight_stream.py``), so no
  rank holds a full fp32 copy; other models send ``model.get_state_dict()``. With
  LoRA enabled (the default) vLLM keeps each linear layer it can adapt under ``.base_layer``; the
  names are mapped to those (:func:`lora_base_layer_names`) inside the engine. Under vLLM V1's
  default multiprocess engine ``apply_model`` pickles the callback to the engine process, which
  vLLM allows only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` in its environment: the sampler sets
  it (unless set already) before it builds the engine; for an engine passed in, a full-weight sync
  without it fails with a message saying so.

Requests are built by :func:`sampling_kwargs` (twinkle's :class:`~twinkle.sampler.SamplingParams`
to vLLM's) and read back by :func:`parse_completion`; both are pure, so they are tested without vLLM.
The log-probabilities are those vLLM reports for the sampled tokens (``logprobs=0``); vLLM V1
reports the raw model distribution by default (``logprobs_mode='raw_logprobs'``), what
``compute_logprobs`` and the losses use.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.log import get_logger
from twinkle.sampler import (
    SampledSequence,
    Sampler,
    SampleResult,
    SamplingParams,
    as_prompts,
    check_prompt_limits,
    per_prompt_adapters,
)
from twinkle.sampler.base import Adapters, Prompts
from twinkle_hf.sampler.weight_stream import DEFAULT_BUCKET_BYTES

#: vLLM refuses to pickle anything across its engine-process boundary (``apply_model``'s callback) without it
INSECURE_SERIALIZATION = "VLLM_ALLOW_INSECURE_SERIALIZATION"
#: vLLM V1 runs the engine core in its own process unless this is "0"
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


def import_vllm() -> Any:
    """The vllm module, or an error saying how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("VLLMSampler needs vLLM, a CUDA-only extra: pip install 'twinkle-hf[vllm]'. On a machine "
                          "without a GPU use TorchSampler, which samples on the training model itself.") from exc
    return vllm


class VLLMApi:
    """The few vLLM constructors the sampler uses; tests pass a fake with the same three methods."""

    def llm(self, **kwargs: Any) -> Any:
        return import_vllm().LLM(**kwargs)

    def sampling_params(self, **kwargs: Any) -> Any:
        return import_vllm().SamplingParams(**kwargs)

    def lora_request(self, name: str, lora_id: int, path: str) -> Any:
        import_vllm()
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """vLLM ``SamplingParams`` arguments for twinkle's: same stops, seed and filters; the sampled tokens' logprobs."""
    kwargs: dict[str, Any] = dict(n=params.n, max_tokens=params.max_tokens, temperature=float(params.temperature),
                                  top_p=float(params.top_p), top_k=params.top_k_or_none or -1, seed=params.seed,
                                  logprobs=0)
    if params.stop is not None:  # explicit stops replace the end-of-sequence token (Tinker's meaning)
        kwargs.update(stop=params.stop_strings, stop_token_ids=params.stop_token_ids(()), ignore_eos=True)
    return kwargs


def parse_completion(completion: Any) -> SampledSequence:
    """A vLLM ``CompletionOutput`` as a SampledSequence (the sampled token's logprob at every position)."""
    tokens = [int(t) for t in completion.token_ids]
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise RuntimeError("vLLM returned no per-token logprobs; the request must set logprobs=0 (sampling_kwargs "
                           "does).")
    logprobs = [float(step[token].logprob) for token, step in zip(tokens, completion.logprobs)]
    reason = "stop" if completion.finish_reason == "stop" else "length"
    return SampledSequence(tokens, logprobs, reason, getattr(completion, "text", None))


def prompt_logprobs(output: Any, prompt: Sequence[int]) -> list[float | None]:
    """``log p(token_i | tokens_<i)`` from a vLLM ``RequestOutput.prompt_logprobs`` (None first)."""
    values = output.prompt_logprobs
    if values is None or len(values) != len(prompt):
        raise RuntimeError("vLLM returned no prompt logprobs; the request must set prompt_logprobs=0.")
    return [None] + [float(values[i][token].logprob) for i, token in enumerate(prompt) if i > 0]


@dataclass
class AdapterVersion:
    """The adapter files vLLM serves for one adapter name, and the LoRA id of this version."""

    lora_id: int
    path: str
    written_here: bool = False  # files sync_weights wrote (removed once superseded); a user's directory is kept


class VLLMSampler(Sampler):
    """Samples on a vLLM engine; ``adapter_name`` picks a LoRA adapter synced with :meth:`sync_weights`.

    ``model_id`` is what vLLM loads (a local directory or hub id); ``engine`` an existing ``vllm.LLM``
    (built from ``model_id`` and ``engine_kwargs`` on first use otherwise, with LoRA enabled for
    ``max_loras`` adapters of rank up to ``max_lora_rank``). ``adapter_dir`` holds the synced adapter
    files (a temporary directory by default). A transformers model's full-weight sync goes in buckets of at
    most ``sync_bucket_bytes`` in the engine's dtype (``weight_stream.py``).
    """

    def __init__(self, model_id: str | None = None, *, engine: Any = None, max_loras: int = 4,
                 max_lora_rank: int = 64, adapter_dir: str | None = None, api: Any = None,
                 sync_bucket_bytes: int = DEFAULT_BUCKET_BYTES, **engine_kwargs: Any) -> None:
        if engine is None and model_id is None:
            raise ValueError("VLLMSampler needs model_id= (what vLLM loads) or engine= (a vllm.LLM).")
        self.api = api if api is not None else VLLMApi()
        self.engine_kwargs = {"model": model_id, "enable_lora": True, "max_loras": max_loras,
                              "max_lora_rank": max_lora_rank, **engine_kwargs}
        self._engine = engine
        self.adapter_dir = Path(adapter_dir or tempfile.mkdtemp(prefix="twinkle-vllm-adapters-"))
        self.adapters: dict[str, AdapterVersion] = {}
        self._ids = itertools.count(1)
        self.sync_bucket_bytes = sync_bucket_bytes

    @property
    def engine(self) -> Any:
        if self._engine is None:
            if INSECURE_SERIALIZATION not in os.environ and _engine_in_own_process():
                # inherited by the engine process at its start: needed there for full-weight syncs (apply_model)
                os.environ[INSECURE_SERIALIZATION] = "1"
                get_logger().info("VLLMSampler: set %s=1 so that full-weight syncs can hand the weights to vLLM's "
                                  "engine process (LLM.apply_model pickles them).", INSECURE_SERIALIZATION)
            self._engine = self.api.llm(**self.engine_kwargs)
        return self._engine

    # ------------------------------------------------------------------ sampling
    def sample(self, prompts: Prompts, sampling_params: SamplingParams | None = None, *,
               adapter_name: Adapters = None) -> list[SampleResult]:
        params = sampling_params if sampling_params is not None else SamplingParams()
        prompts = as_prompts(prompts)
        names = per_prompt_adapters(adapter_name, len(prompts))
        self._check_prompts(prompts, params.max_tokens, "prompts")
        outputs = self.engine.generate([{"prompt_token_ids": p} for p in prompts],
                                       sampling_params=self.api.sampling_params(**sampling_kwargs(params)),
                                       lora_request=self._lora_requests(names), use_tqdm=False)
        return [SampleResult(prompt, [parse_completion(c) for c in output.outputs], name)
                for prompt, output, name in zip(prompts, outputs, names)]

    def compute_logprobs(self, sequences: Prompts, *, adapter_name: Adapters = None,
                         reference: bool = False) -> list[list[float | None]]:
        sequences = as_prompts(sequences, "sequences")
        names = [None] * len(sequences) if reference else per_prompt_adapters(adapter_name, len(sequences))
        self._check_prompts(sequences, 0, "sequences")
        outputs = self.engine.generate([{"prompt_token_ids": s} for s in sequences],
                                       sampling_params=self.api.sampling_params(max_tokens=1, prompt_logprobs=0),
                                       lora_request=self._lora_requests(names), use_tqdm=False)
        return [prompt_logprobs(output, seq) for output, seq in zip(outputs, sequences)]

    def _check_prompts(self, prompts: list[list[int]], max_tokens: int, what: str) -> None:
        """The engine's vocabulary and context length (``llm_engine.model_config``), checked before a request
        reaches it, with twinkle's messages (an engine that does not say is left to refuse on its own)."""
        config = getattr(getattr(self.engine, "llm_engine", None), "model_config", None)
        if config is None:
            return
        vocab = config.get_vocab_size() if callable(getattr(config, "get_vocab_size", None)) else None
        check_prompt_limits(prompts, vocab_size=vocab, max_positions=getattr(config, "max_model_len", None),
                            max_tokens=max_tokens, what=what, positions_name="the engine's max_model_len")

    def _lora_requests(self, names: Iterable[str | None]) -> list[Any]:
        requests = []
        for name in names:
            if name is None:
                requests.append(None)
                continue
            version = self.adapters.get(name)
            if version is None:
                raise KeyError(f"VLLMSampler has no adapter {name!r} (it has: {', '.join(self.adapters) or 'none'}); "
                               "call sync_weights(model, adapter_name=...) after the optimizer step first.")
            requests.append(self.api.lora_request(name, version.lora_id, version.path))
        return requests

    # ------------------------------------------------------------------ weight sync
    def sync_weights(self, model: Any = None, *, adapter_name: str | None = None) -> None:
        """Push ``model``'s current weights: the adapter's files, or the full weights in memory."""
        if model is None:
            raise ValueError("VLLMSampler.sync_weights needs the trained model: sync_weights(model, adapter_name=...).")
        group = model._group(adapter_name)
        if group.is_adapter:
            name = adapter_name if adapter_name is not None else group.name
            version = next(self._ids)
            path = model.save(f"{name}-v{version}", output_dir=str(self.adapter_dir), adapter_name=adapter_name)
            self.sync_adapter(name, path, lora_id=version, _written_here=True)
        elif hasattr(getattr(model, "backend", None), "hf_model"):  # a transformers model: streamed in buckets
            from twinkle_hf.sampler.weight_stream import engine_dtype, weight_buckets

            model._require_parallelized("sync_weights")
            for bucket in weight_buckets(model.backend.hf_model(), engine_dtype(self.engine), self.sync_bucket_bytes):
                self.load_weights(bucket, reset_cache=False)
            self._reset_prefix_cache()
        else:
            self.load_weights(model.get_state_dict(adapter_name=adapter_name).items())

    def sync_adapter(self, name: str, path: str | Path, *, lora_id: int | None = None,
                     _written_here: bool = False) -> None:
        """Serve the PEFT adapter in ``path`` as ``name`` from now on (a new LoRA id; the old version is dropped)."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{str(path)!r} is not a PEFT adapter directory (no adapter_config.json).")
        old = self.adapters.get(name)
        self.adapters[name] = AdapterVersion(lora_id if lora_id is not None else next(self._ids), str(path),
                                             _written_here)
        if old is not None:
            remove = getattr(getattr(self.engine, "llm_engine", None), "remove_lora", None)
            if remove is not None:
                remove(old.lora_id)
            if old.written_here:
                shutil.rmtree(old.path, ignore_errors=True)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]], reset_cache: bool = True) -> None:
        """Copy full-model weights (HF names) into the engine in memory, then (``reset_cache``) drop its stale
        prefix cache; a sync in several buckets resets it once, after the last."""
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        if not weights:
            raise ValueError("load_weights got no tensors.")
        engine = self.engine
        if _engine_in_own_process() and not _env_flag(INSECURE_SERIALIZATION):
            raise RuntimeError(
                f"A full-weight sync hands the weights to vLLM's engine process (LLM.apply_model), which vLLM V1 "
                f"refuses unless {INSECURE_SERIALIZATION}=1 was in the environment when the engine was built "
                f"(it is {os.environ.get(INSECURE_SERIALIZATION)!r} here). Set it before building the vllm.LLM, let "
                f"VLLMSampler(model_id) build the engine (it sets it), or run the engine in this process with "
                f"{MULTIPROCESSING}=0.")
        engine.apply_model(_LoadWeights(weights))
        if reset_cache:
            self._reset_prefix_cache()

    def _reset_prefix_cache(self) -> None:
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:
            reset()


def _env_flag(name: str, default: str = "0") -> bool:
    """A vLLM boolean environment variable as vLLM reads it (``bool(int(value))``)."""
    try:
        return bool(int(os.environ.get(name, default) or default))
    except ValueError:
        return False


def _engine_in_own_process() -> bool:
    return _env_flag(MULTIPROCESSING, "1")


class _LoadWeights:
    """A picklable ``apply_model`` callback: the engine's model loads the given (HF name, tensor) pairs."""

    def __init__(self, weights: list[tuple[str, Any]]) -> None:
        self.weights = weights

    def __call__(self, vllm_model: Any) -> None:
        load: Callable[[Any], Any] = vllm_model.load_weights
        load(iter(lora_base_layer_names(vllm_model, self.weights)))  # its result (vLLM's names) stays there


def lora_base_layer_names(vllm_model: Any, weights: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``weights`` with HF names renamed to what a LoRA-enabled vLLM model holds.

    With ``enable_lora`` vLLM replaces every linear layer it can adapt by a wrapper that keeps the
    original module as ``base_layer``, so ``qkv_proj.weight`` is held as ``qkv_proj.base_layer.weight``
    and the model's ``load_weights`` fails with a KeyError on the plain name. A name whose layer is
    wrapped gets ``.base_layer`` before its last part (``q_proj.weight`` -> ``q_proj.base_layer.weight``);
    the layer is found through the model's ``hf_to_vllm_mapper`` and ``packed_modules_mapping`` (q/k/v
    are packed into ``qkv_proj``), and ``load_weights`` still does the renaming and packing itself.
    Without wrapped layers (LoRA off) the names are left as they are.
    """
    wrapped: set[str] = set()  # every wrapped layer's path and its dotted suffixes (loaders strip prefixes)
    for name, _ in vllm_model.named_modules():
        if name.endswith(".base_layer"):
            parts = name[: -len(".base_layer")].split(".")
            wrapped.update(".".join(parts[i:]) for i in range(len(parts)))
    if not wrapped:
        return list(weights)
    packed = {part: whole for whole, parts in (getattr(vllm_model, "packed_modules_mapping", None) or {}).items()
              for part in parts}
    mapper = getattr(vllm_model, "hf_to_vllm_mapper", None)
    renamed = []
    for name, tensor in weights:
        mapped = name
        if mapper is not None:
            mapped = next(iter(mapper.apply([(name, None)])), (name, None))[0]
        layer, _, _ = mapped.rpartition(".")
        head, _, last = layer.rpartition(".")
        target = f"{head}.{packed.get(last, last)}" if head else packed.get(last, last)
        if target in wrapped and ".base_layer." not in name:
            module, _, leaf = name.rpartition(".")
            name = f"{module}.base_layer.{leaf}"
        renamed.append((name, tensor))
    return renamed
