"""Helpers for the twinkle-megatron tests: tiny HF models of every mapped family, saved checkpoints, batches.

Norm weights and biases are randomised (HF initialises them to 1 and 0, which would hide a
swapped or dropped tensor); the vocabulary size is odd so tensor-parallel vocabulary padding is
exercised.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

VOCAB = 125
VOCAB_LARGE = 4001  # the vocabulary-parallel loss checks: logits dominate the loss's memory
FAMILIES = ("qwen2", "qwen3", "llama", "mistral")


def tiny_config(family: str = "qwen2", vocab_size: int = VOCAB, **overrides: Any) -> Any:
    """A 2-layer, hidden-64 transformers config (qwen2, qwen3, llama, mistral, qwen3_moe)."""
    import transformers

    classes = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "llama": "LlamaConfig", "mistral": "MistralConfig",
               "qwen3_moe": "Qwen3MoeConfig"}
    kwargs: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=256,
                                  tie_word_embeddings=False, pad_token_id=0)
    if family in ("qwen3", "qwen3_moe"):
        kwargs["head_dim"] = 16
    if family == "mistral":
        kwargs["sliding_window"] = 5  # shorter than the test sequences: the window matters
    if family == "llama":
        kwargs["attention_bias"] = kwargs["mlp_bias"] = True
    if family == "qwen3_moe":
        kwargs.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    kwargs.update(overrides)
    return getattr(transformers, classes[family])(**kwargs)


def hf_model(family: str = "qwen2", seed: int = 0, **overrides: Any) -> Any:
    """A seeded tiny HF causal LM in fp32 eval mode, with non-trivial norms and biases."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(0.2 * torch.randn_like(param))
    return model.eval()


def save_hf(model: Any, directory: Path) -> Path:
    model.save_pretrained(str(directory))
    return directory


def make_batch(seed: int, rows: int = 4, length: int = 12, vocab: int = VOCAB, prompt: int = 3,
               ragged: bool = True) -> dict[str, torch.Tensor]:
    """Right-padded random rows (ragged lengths unless ``ragged=False``); the first ``prompt`` labels are -100."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.zeros(rows, length, dtype=torch.long)
    attention_mask = torch.zeros(rows, length, dtype=torch.long)
    labels = torch.full((rows, length), -100, dtype=torch.long)
    for r in range(rows):
        n = int(torch.randint(prompt + 2, length + 1, (1,), generator=gen)) if ragged else length
        ids = torch.randint(1, vocab, (n,), generator=gen)
        input_ids[r, :n] = ids
        attention_mask[r, :n] = 1
        labels[r, prompt:n] = ids[prompt:]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def hf_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """twinkle's CrossEntropyLoss (token mean) on an HF model's logits: the independent reference."""
    from twinkle.loss import CrossEntropyLoss

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return CrossEntropyLoss()(batch, {"logits": logits})["loss"]


@contextlib.contextmanager
def scheduled_on_cpu() -> Iterator[None]:
    """``forward_backward`` through megatron-core's forward-backward schedule on the CPU (the CUDA path's
    :meth:`run_schedule`), with the CPU optimizer stand-in: the schedule's ``device='cuda'`` allocations go to
    the CPU. Everything is restored afterwards."""
    from twinkle_megatron.model.backend import MegatronBackend

    def on_cpu(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)

        return wrapper

    names = ("tensor", "zeros", "empty", "ones", "full")
    saved = {name: getattr(torch, name) for name in names}
    schedules = MegatronBackend.__dict__["schedules"]
    try:
        for name in names:
            setattr(torch, name, on_cpu(saved[name]))
        MegatronBackend.schedules = True
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)
        MegatronBackend.schedules = schedules


def megatron_model(directory: Path | str, **kwargs: Any) -> Any:
    from twinkle.model import MegatronModel

    kwargs.setdefault("mixed_precision", "no")
    return MegatronModel(model_id=str(directory), **kwargs)


ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def shared_a_adapter(directory: Path, family: str = "qwen2", lm_head: bool = False, **overrides: Any) -> Path:
    """A peft adapter on ``hf_model(family, **overrides)`` with random B and q/k/v (gate/up) sharing A, as megatron
    fuses them; ``lm_head``: the output layer too (peft's save_pretrained then adds a copy of its base weight)."""
    import warnings

    from peft import LoraConfig, get_peft_model

    targets = ALL_LINEAR + ["lm_head"] if lm_head else "all-linear"
    with warnings.catch_warnings():  # peft: a tied lm_head without ensure_weight_tying; embedding layers saved
        warnings.simplefilter("ignore", UserWarning)
        peft_model = get_peft_model(hf_model(family, **overrides),
                                    LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        with torch.no_grad():
            for layer in peft_model.base_model.model.model.layers:
                for shared, others in ((layer.self_attn.q_proj, (layer.self_attn.k_proj, layer.self_attn.v_proj)),
                                       (layer.mlp.gate_proj, (layer.mlp.up_proj,))):
                    for other in others:
                        other.lora_A["default"].weight.copy_(shared.lora_A["default"].weight)
                for name, param in layer.named_parameters():
                    if "lora_B" in name:
                        param.normal_(std=0.1)
            if lm_head:
                peft_model.base_model.model.lm_head.lora_B["default"].weight.normal_(std=0.1)
        peft_model.save_pretrained(str(directory))
    return directory


# ------------------------------------------------------------------ gradients against peft's
#: megatron's fused layers share one LoRA A: its gradient is the sum of those of peft's separate A matrices
_SHARED_A = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def next_token_loss_sum(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of per-token cross-entropies of the next tokens: what megatron's backward runs on (before the division by
    the window's token count at the step)."""
    labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")


def peft_grads(peft_model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's LoRA gradients of :func:`next_token_loss_sum`, under PEFT file keys."""
    peft_model.zero_grad(set_to_none=True)
    logits = peft_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    next_token_loss_sum(logits, batch).backward()
    return {n.replace(".default", ""): p.grad.detach().clone() for n, p in peft_model.named_parameters()
            if "lora_" in n}


def adapter_grads(model: Any, adapter: str | None = None) -> dict[str, torch.Tensor]:
    """The LoRA gradients of a megatron model's adapter under PEFT file keys (full across TP; collective under TP):
    each LoRA tensor swapped with its gradient for one ``get_state_dict``."""
    params = [p for _, p in model.backend.adapters.named_parameters(model._group(adapter))]
    saved = [p.data for p in params]
    try:
        for p in params:
            p.data = p.grad if p.grad is not None else torch.zeros_like(p)
        return {k: v.clone() for k, v in model.get_state_dict(adapter_name=adapter).items()}
    finally:
        for p, data in zip(params, saved, strict=True):
            p.data = data


def _parent(key: str) -> str:
    """``...layers.0.self_attn.q_proj.lora_A.weight`` -> ``...layers.0.self_attn``."""
    return key.rsplit(".", 4)[0]


def grad_diffs(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """Max abs difference per PEFT key relative to the reference's largest entry (a fused layer's shared A against
    the sum of peft's A gradients of its projections)."""
    out = {}
    for key, grad in ours.items():
        fused = _SHARED_A.get(key.split(".")[-3])
        if ".lora_A." in key and fused is not None:
            want = sum(g for k, g in ref.items() if ".lora_A." in k and _parent(k) == _parent(key)
                       and _SHARED_A.get(k.split(".")[-3]) == fused)
        else:
            want = ref[key]
        out[key] = float((grad - want).abs().max() / want.abs().max())
    return out


# ------------------------------------------------------------------ multi-process training scenarios
TRAIN_STEPS = 5
TRAIN_LR = 5e-3
#: Adam's update g/(sqrt(v)+eps) turns summation-order noise in near-zero gradients into lr-sized weight
#: differences when eps is tiny (1e-6: a Lipschitz constant of 2 lr / eps = 1e4, bounded on no CPU); with eps = 1
#: the update is Lipschitz in the gradient with constant at most 2 lr (tests/server/test_ray_mode.py), so the
#: float32 bound of tests/rounding.py carries over to "same weights after 5 steps" at TP=2 and DP=2.
ADAM_EPS = 1.0


def train_batches() -> list[dict[str, torch.Tensor]]:
    """The batches of the TP/DP training comparisons (ragged rows: data-parallel halves hold unequal tokens)."""
    return [make_batch(seed=300 + step, rows=4, length=12) for step in range(TRAIN_STEPS)]


def rows(batch: dict[str, torch.Tensor], part: int, parts: int) -> dict[str, torch.Tensor]:
    """Data-parallel rank ``part``'s consecutive share of the rows."""
    size = batch["input_ids"].shape[0] // parts
    return {k: v[part * size:(part + 1) * size] for k, v in batch.items()}


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")


def train(model: Any, batches: list[dict[str, torch.Tensor]], adapter: str | None = None) -> list[dict[str, float]]:
    """One optimizer step per batch (clip 1.0); the metrics of each step (loss and accuracy over all ranks)."""
    if model.optimizer_group[adapter or "default"].optimizer is None:
        model.set_optimizer("default", lr=TRAIN_LR, weight_decay=0.01, adam_eps=ADAM_EPS, adapter_name=adapter)
    out = []
    for batch in batches:
        model.forward_backward(inputs=batch, adapter_name=adapter)
        model.clip_grad_and_step(1.0, adapter_name=adapter)
        metrics = model.calculate_metric(True, adapter_name=adapter)
        out.append({k: metrics[k] for k in ("loss", "grad_norm", "token_accuracy")})
    return out


class PeakBytes:
    """Peak bytes of tensor storage allocated while counting is on; frees are seen through weak references.

    A ``TorchDispatchMode`` sees every allocation (forward and, on CPU, backward run in this thread);
    views share their storage and are counted once.
    """

    def __init__(self) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.counting = False
        self.live = 0
        self.peak = 0
        self._seen = WeakIdKeyDictionary()

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def track(self, value: Any) -> None:
        import weakref

        from torch.utils._pytree import tree_leaves

        for t in tree_leaves(value):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            if storage in self._seen:
                continue
            self._seen[storage] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, storage.nbytes())

    def mode(self) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if tracker.counting:
                    tracker.track(out)
                return out

        return _Mode()


def loss_peak_bytes(model: Any, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
    """(loss, peak bytes) of the loss: from the output layer's forward to its backward (logits, loss, their grads)."""
    tracker = PeakBytes()

    def start(module: Any, args: tuple) -> None:
        tracker.counting = True
        hidden = args[0]
        if hidden.requires_grad:
            hidden.register_hook(stop)

    def stop(grad: torch.Tensor) -> None:
        tracker.counting = False

    handle = model.gpt.output_layer.register_forward_pre_hook(start)
    try:
        with tracker.mode():
            loss = model.forward_backward(inputs=batch)
    finally:
        handle.remove()
    return float(loss), tracker.peak
