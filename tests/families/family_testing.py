"""The language families of seed 001 as tiny models: tokenizer, config, seeded weights, expected renderings.

Every family is written to a model directory the way its hub repository looks (config.json of the
family's transformers class, safetensors, tokenizer files; remote code where the repository ships
code), built here with no network:

- tokenizers: twinkle's embedded byte-level BPE (``twinkle://tiny-qwen``) with the family's special
  tokens added. GLM-4 and InternLM2.5 ship theirs as remote code (a slow tokenizer class named
  like the real one, ``remote/tokenization_slow.py``) loaded with ``trust_remote_code=True``. The
  chat format is not in the tokenizer: the family's twinkle template renders it.
- models: the family's transformers class (hidden 64, 2 layers, experts where the family has
  them); InternLM2 has no transformers class, so ``remote/modeling_internlm2.py`` reproduces it.
- the conversations and their expected renderings are in ``family_cases.py``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REMOTE = Path(__file__).parent / "remote"
HIDDEN = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, tie_word_embeddings=False)


# ------------------------------------------------------------------------------------------- configs
def qwen3_5_config(vocab: int, full_attention_only: bool = False, **overrides: Any) -> Any:
    from transformers import Qwen3_5TextConfig

    layers = ["full_attention", "full_attention"] if full_attention_only else ["linear_attention", "full_attention"]
    kwargs = dict(HIDDEN, vocab_size=vocab, intermediate_size=128, head_dim=16, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, layer_types=layers)
    kwargs.update(overrides)
    return Qwen3_5TextConfig(**kwargs)


def qwen3_5_moe_config(vocab: int, full_attention_only: bool = False, **overrides: Any) -> Any:
    from transformers import Qwen3_5MoeTextConfig

    layers = ["full_attention", "full_attention"] if full_attention_only else ["linear_attention", "full_attention"]
    kwargs = dict(HIDDEN, vocab_size=vocab, head_dim=16, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, layer_types=layers)
    kwargs.update(overrides)
    return Qwen3_5MoeTextConfig(**kwargs)


def deepseek_v3_config(vocab: int, dense_only: bool = False, **overrides: Any) -> Any:
    """DeepSeek-R1's architecture (DeepseekV3): MLA attention, a dense first layer, then MoE layers."""
    from transformers import DeepseekV3Config

    kwargs = dict(HIDDEN, num_key_value_heads=4, vocab_size=vocab, intermediate_size=128, moe_intermediate_size=32,
                  n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                  first_k_dense_replace=2 if dense_only else 1, q_lora_rank=32, kv_lora_rank=16,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, routed_scaling_factor=2.5)
    kwargs.update(overrides)
    return DeepseekV3Config(**kwargs)


def deepseek_v4_config(vocab: int) -> Any:
    from transformers import DeepseekV4Config

    return DeepseekV4Config(**{**HIDDEN, "num_key_value_heads": 1}, vocab_size=vocab, moe_intermediate_size=32,
                            n_routed_experts=4, num_experts_per_tok=2, head_dim=32, q_lora_rank=32, o_groups=2,
                            o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, sliding_window=8,
                            hc_mult=2, hc_sinkhorn_iters=3, num_nextn_predict_layers=0)


def llama3_config(vocab: int, **overrides: Any) -> Any:
    from transformers import LlamaConfig

    kwargs = dict(HIDDEN, vocab_size=vocab, intermediate_size=128,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192})
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def mistral_config(vocab: int, **overrides: Any) -> Any:
    from transformers import MistralConfig

    kwargs = dict(HIDDEN, vocab_size=vocab, intermediate_size=128, head_dim=16, sliding_window=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    kwargs.update(overrides)
    return MistralConfig(**kwargs)


def yi_config(vocab: int, **overrides: Any) -> Any:
    from transformers import LlamaConfig  # Yi-1.5 checkpoints are LlamaForCausalLM

    kwargs = dict(HIDDEN, vocab_size=vocab, intermediate_size=128,
                  rope_parameters={"rope_type": "default", "rope_theta": 5000000.0})
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def qwen2_5_config(vocab: int, **overrides: Any) -> Any:
    from transformers import Qwen2Config

    kwargs = dict(HIDDEN, vocab_size=vocab, intermediate_size=128)
    kwargs.update(overrides)
    return Qwen2Config(**kwargs)


def glm4_config(vocab: int) -> Any:
    from transformers import GlmConfig  # glm-4-9b-chat's architecture in transformers (the "-hf" checkpoints)

    return GlmConfig(**HIDDEN, vocab_size=vocab, intermediate_size=128, head_dim=16)


def internlm2_config(vocab: int) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("configuration_internlm2", REMOTE / "configuration_internlm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.InternLM2Config(**HIDDEN, vocab_size=vocab, intermediate_size=128, bias=False,
                                  rope_theta=1000000.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)


# ------------------------------------------------------------------------------------------- families
@dataclass(frozen=True)
class Family:
    key: str
    row: str  # the seed-001 row
    hub_id: str
    template: str
    bos: str | None
    eos: str
    pad: str
    specials: tuple[str, ...]
    config: Callable[[int], Any]
    unk: str | None = None
    slow_tokenizer: tuple[str, str] | None = None  # (file name, class name) of the remote-code tokenizer
    remote_model: bool = False
    architecture: str = ""
    tools: bool = True
    thinking: bool = False
    notes: str = ""


_DS_TOOL = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>")
_DS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>")

FAMILIES: dict[str, Family] = {f.key: f for f in (
    Family("qwen3_5", "Qwen 3.5", "Qwen/Qwen3.5-0.6B", "Qwen3_5Template", None, "<|im_end|>", "<|endoftext|>",
           ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>"), qwen3_5_config, architecture="Qwen3_5ForCausalLM",
           thinking=True),
    Family("qwen3_5_moe", "Qwen 3.5 (MoE)", "Qwen/Qwen3.5-235B-A22B", "Qwen3_5Template", None, "<|im_end|>",
           "<|endoftext|>", ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                             "</tool_call>", "<tool_response>", "</tool_response>"), qwen3_5_moe_config,
           architecture="Qwen3_5MoeForCausalLM", thinking=True),
    Family("qwen2_5", "Qwen 2.5", "Qwen/Qwen2.5-0.5B", "Qwen2_5Template", None, "<|im_end|>", "<|endoftext|>",
           ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"), qwen2_5_config,
           architecture="Qwen2ForCausalLM"),
    Family("deepseek_v4", "DeepSeek V4", "deepseek-ai/DeepSeek-V4", "DeepSeekV4Template", _DS[0], _DS[1], _DS[1],
           (*_DS, "｜DSML｜", "<｜latest_reminder｜>"), deepseek_v4_config, architecture="DeepseekV4ForCausalLM",
           thinking=True),
    Family("deepseek_r1", "DeepSeek R1", "deepseek-ai/DeepSeek-R1", "DeepSeekR1Template", _DS[0], _DS[1], _DS[1],
           (*_DS, *_DS_TOOL), deepseek_v3_config, architecture="DeepseekV3ForCausalLM"),
    Family("llama3", "LLaMA 3", "meta-llama/Llama-3.3-70B-Instruct", "Llama3Template", "<|begin_of_text|>",
           "<|eot_id|>", "<|end_of_text|>", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                             "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
           llama3_config, architecture="LlamaForCausalLM"),
    Family("mistral", "Mistral", "mistralai/Mistral-7B-v0.3", "MistralTemplate", "<s>", "</s>", "</s>",
           ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), mistral_config, unk="<unk>", architecture="MistralForCausalLM"),
    Family("yi", "Yi", "01-ai/Yi-1.5-34B", "YiTemplate", "<|startoftext|>", "<|im_end|>", "<unk>",
           ("<unk>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_sep|>"), yi_config,
           unk="<unk>", architecture="LlamaForCausalLM", tools=False),
    Family("glm4", "GLM-4", "THUDM/glm-4-9b-chat", "GLM4Template", None, "<|endoftext|>", "<|endoftext|>",
           ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>"), glm4_config,
           slow_tokenizer=("tokenization_chatglm.py", "ChatGLM4Tokenizer"), architecture="GlmForCausalLM"),
    Family("internlm2_5", "InternLM 2.5", "internlm/internlm2_5-7b-chat", "InternLM2Template", "<s>", "</s>", "</s>",
           ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|action_start|>", "<|action_end|>",
            "<|interpreter|>", "<|plugin|>"), internlm2_config, unk="<unk>",
           slow_tokenizer=("tokenization_internlm2.py", "InternLM2Tokenizer"), remote_model=True,
           architecture="InternLM2ForCausalLM"),
)}


# ------------------------------------------------------------------------------------------- tokenizers
def _bpe_with(specials: tuple[str, ...]) -> Any:
    from tokenizers import AddedToken, Tokenizer

    from twinkle.assets import asset_path

    tok = Tokenizer.from_file(str(asset_path("tiny-qwen") / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def write_tokenizer(family: Family, directory: Path) -> tuple[int, dict[str, int | None]]:
    """The family's tokenizer files in ``directory``; returns the vocabulary size (with added tokens) and the
    ids of its bos/eos/pad tokens (config fields ``bos_token_id``...)."""
    directory.mkdir(parents=True, exist_ok=True)
    named = {"bos_token": family.bos, "eos_token": family.eos, "pad_token": family.pad, "unk_token": family.unk}
    named = {k: v for k, v in named.items() if v is not None}
    if family.slow_tokenizer is None:
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast(tokenizer_object=_bpe_with(family.specials), **named,
                                       additional_special_tokens=[t for t in family.specials
                                                                  if t not in named.values()])
        fast.save_pretrained(str(directory))
        return len(fast), {f"{k}_token_id": getattr(fast, f"{k}_token_id") for k in ("bos", "eos", "pad")}
    from tokenizers import Tokenizer

    from twinkle.assets import asset_path

    filename, cls = family.slow_tokenizer
    base = Tokenizer.from_file(str(asset_path("tiny-qwen") / "tokenizer.json"))
    base.save(str(directory / "bpe.json"))
    shutil.copyfile(REMOTE / "tokenization_slow.py", directory / filename)
    module = filename[:-3]
    vocab = base.get_vocab_size()
    added = {str(vocab + i): {"content": t, "special": True, "normalized": False, "lstrip": False, "rstrip": False,
                              "single_word": False} for i, t in enumerate(family.specials)}
    config = {"tokenizer_class": cls, "auto_map": {"AutoTokenizer": [f"{module}.{cls}", None]},
              "added_tokens_decoder": added, **named, "model_max_length": 2048,
              "additional_special_tokens": [t for t in family.specials if t not in named.values()]}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    ids = {t: vocab + i for i, t in enumerate(family.specials)}
    return vocab + len(family.specials), {f"{k}_token_id": ids.get(getattr(family, k)) for k in ("bos", "eos", "pad")}


def load_tokenizer(directory: Path, family: Family) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=family.slow_tokenizer is not None)


# ------------------------------------------------------------------------------------------- models
def seeded_model(config: Any, seed: int = 0, remote: bool = False) -> Any:
    """A seeded fp32 model of ``config``'s class, its norm weights randomised (1/0 would hide a swapped tensor)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if remote:
        import importlib.util
        import sys

        sys.path.insert(0, str(REMOTE))
        try:
            spec = importlib.util.spec_from_file_location("modeling_internlm2", REMOTE / "modeling_internlm2.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(REMOTE))
        model = module.InternLM2ForCausalLM(config)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and param.dim() == 1:
                param.add_(0.2 * torch.randn_like(param))
    return model.float().eval()


def write_model(family: Family, directory: Path, config: Any = None, seed: int = 0) -> Path:
    """A complete model directory: tokenizer, config, seeded weights (remote code copied where the family has it)."""
    vocab, special_ids = write_tokenizer(family, directory)
    config = config if config is not None else family.config(vocab)
    config.vocab_size = vocab
    for name, value in special_ids.items():
        setattr(config, name, value)
    model = seeded_model(config, seed=seed, remote=family.remote_model)
    if family.remote_model:
        for name in ("configuration_internlm2.py", "modeling_internlm2.py"):
            shutil.copyfile(REMOTE / name, directory / name)
        model.config.auto_map = {"AutoConfig": "configuration_internlm2.InternLM2Config",
                                 "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"}
    model.save_pretrained(str(directory))
    return directory


# ------------------------------------------------------------------------------------------- Megatron
#: families megatron-core builds on CPU through the bridge: {name: (family key, config or None = the family's)}
MEGATRON_CPU: dict[str, tuple[str, Callable[[int], Any] | None]] = {
    "qwen3_5": ("qwen3_5", lambda v: qwen3_5_config(v, full_attention_only=True)),
    "qwen2_5": ("qwen2_5", None),
    "llama3": ("llama3", None),
    "mistral": ("mistral", None),
    "yi": ("yi", None),
    "deepseek_r1": ("deepseek_r1", lambda v: deepseek_v3_config(v, dense_only=True)),
    "deepseek_r1_yarn": ("deepseek_r1", lambda v: deepseek_v3_config(
        v, dense_only=True, max_position_embeddings=2560,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 64})),
}


def megatron_dir(name: str, root: Path, family_dirs: dict[str, Path]) -> Path:
    """The model directory of a MEGATRON_CPU entry (the family's own directory when its config is the family's)."""
    key, config = MEGATRON_CPU[name]
    if config is None:
        return family_dirs[key]
    vocab, _ = write_tokenizer(FAMILIES[key], root / name)
    return write_model(FAMILIES[key], root / name, config=config(vocab))


def logits_batch() -> dict[str, torch.Tensor]:
    """Two rows of tokens inside every family's vocabulary, the second right-padded."""
    ids = torch.randint(3, 2500, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def max_logits_diff(model_logits: torch.Tensor, directory: Path, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """The largest difference from plain transformers' logits over the real tokens (``diff``) and the largest of
    those logits (``scale``: a derived tolerance scales with it, tests/rounding.py's ``within``)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    with torch.no_grad():
        reference = hf(**batch).logits
    real = batch["attention_mask"].bool()
    return {"diff": float((model_logits[real] - reference[real]).abs().max()),
            "scale": float(reference[real].abs().max())}


SEED_BATCHES, SEED_ACCUMULATION, SEED_LR = 6, 2, 5e-3
SEED_TOKENS = 128  # the example's max_length
#: The optimizer of the TP=1 / TP=2 comparison: the example's (megatron's default Adam), its eps 1 instead of
#: 1e-8 (Adam's g / (sqrt(v) + eps) turns summation-order noise in near-zero gradients into lr-sized weight
#: differences when eps is tiny; with eps = 1 the update is Lipschitz in the gradient with constant at most
#: 2 lr, as tests/megatron/megatron_testing.ADAM_EPS), lr 0.5 so the steps stay about as large as the example's.
SEED_PARITY_OPTIMIZER = {"lr": 0.5, "adam_eps": 1.0}


def seed_example(model_dir: Path, out_dir: Path, mesh: Any = None, **optimizer: Any) -> dict[str, Any]:
    """Seed 001's MegatronModel example on a Qwen 3.5 model: a DataLoader over self-cognition rows encoded with
    Qwen3_5Template, a LoRA adapter, megatron's optimizer (``optimizer``: set_optimizer's fields, default the
    example's lr), clip_grad_and_step with gradient accumulation.

    Returns the loss of every forward_backward, the saved adapter directory and the adapter saved before
    training (``initial``)."""
    from peft import LoraConfig

    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.model import MegatronModel
    from twinkle.preprocessor import SelfCognitionProcessor

    dataset = Dataset(dataset_meta=DatasetMeta("twinkle://self-cognition", data_slice=range(SEED_BATCHES * 2)))
    dataset.set_template("Qwen3_5Template", model_id=str(model_dir), max_length=SEED_TOKENS,
                         truncation_strategy="delete")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    dataloader = DataLoader(dataset, batch_size=2, device_mesh=mesh, shuffle=False)
    model = MegatronModel(model_id=str(model_dir), device_mesh=mesh, mixed_precision="no", remote_group="actor")
    model.add_adapter_to_model("sft", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
                               gradient_accumulation_steps=SEED_ACCUMULATION)
    model.set_optimizer("default", **{"lr": SEED_LR, **optimizer}, adapter_name="sft")
    initial = model.save("initial", output_dir=str(out_dir), adapter_name="sft")
    losses = []
    for batch in dataloader:
        losses.append(float(model.forward_backward(inputs=batch, adapter_name="sft")))
        model.clip_grad_and_step(1.0, gradient_accumulation_steps=SEED_ACCUMULATION, adapter_name="sft")
    saved = model.save("sft", output_dir=str(out_dir), adapter_name="sft")
    return {"losses": losses, "saved": str(saved), "initial": str(initial),
            "steps": model.optimizer_group["sft"].cur_step}
