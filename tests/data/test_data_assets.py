"""The embedded assets: self-cognition rows, the tokenizer, the tiny model config — and that they agree."""

from __future__ import annotations

import json
import re

from twinkle.assets import ASSETS_DIR, asset_path


def test_self_cognition_rows_follow_the_public_format():
    rows = [json.loads(line) for line in asset_path("self-cognition").read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 1000  # seed 003 slices range(1000) by default
    assert all(set(r) == {"query", "response", "tag"} and r["tag"] in ("zh", "en") for r in rows)
    tags = [r["tag"] for r in rows]
    assert 0.4 < tags.count("zh") / len(tags) < 0.6 and {"zh", "en"} <= set(tags[:10])
    assert all("{{NAME}}" in r["response"] or "{{AUTHOR}}" in r["response"] for r in rows)
    cjk = re.compile(r"[\u4e00-\u9fff]")
    assert all(bool(cjk.search(r["query"] + r["response"])) == (r["tag"] == "zh") for r in rows)
    assert len({(r["query"], r["response"]) for r in rows}) == len(rows)


def test_tokenizer_loads_offline_with_chatml_specials(tokenizer):
    assert 2000 <= len(tokenizer) <= 4096
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_end|>")
    text = "Hello, twinkle! 你好，世界。 x = [1, 2]"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_raw_tokenizer_file_and_transformers_agree(tokenizer):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(asset_path("tiny-qwen") / "tokenizer.json"))
    rows = asset_path("self-cognition").read_text(encoding="utf-8").splitlines()[:200]
    for line in rows + ["  indented\n\ncode()  ", "<|im_start|>assistant\nok<|im_end|>"]:
        assert raw.encode(line, add_special_tokens=False).ids == tokenizer(line, add_special_tokens=False)["input_ids"]


def test_tiny_model_config_matches_the_tokenizer(tokenizer):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(asset_path("tiny-qwen"))
    assert config.model_type == "qwen2" and config.vocab_size == len(tokenizer)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads) == (64, 2, 4, 2)
    assert (config.eos_token_id, config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    model = AutoModelForCausalLM.from_config(config)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    ids = torch.tensor([tokenizer("hello world")["input_ids"]])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_assets_are_small():
    total = sum(p.stat().st_size for p in ASSETS_DIR.rglob("*") if p.is_file() and p.suffix != ".pyc")
    # fp32 weights: tiny-qwen ~0.96 MB, each of the three tiny VL models ~1.8-2.1 MB (shipped so that an
    # adapter trained on them loads in plain transformers + peft); tokenizers ~0.16 MB each
    assert total < 8_500_000


def test_tiny_model_weights_are_the_seeded_file_in_every_process():
    """Two loads under different seeds give the shipped weights: a fresh process starts where any other did."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    stored = load_file(str(asset_path("tiny-qwen") / "model.safetensors"))
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(AutoModelForCausalLM.from_pretrained(asset_path("tiny-qwen")))
    for model in models:
        state = model.state_dict()
        assert model.dtype == torch.float32 and set(stored) <= set(state)
        assert all(torch.equal(state[k], v) for k, v in stored.items())
        assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()  # tied
    assert stored["model.layers.0.mlp.up_proj.weight"].std() > 0.01  # initialised, not zeros


def test_wheel_ships_the_assets(tmp_path):
    import subprocess
    import sys
    import zipfile

    package = ASSETS_DIR.parents[2]  # packages/twinkle-core
    subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)], cwd=package,
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"twinkle/assets/self_cognition.jsonl", "twinkle/assets/tiny-qwen/config.json",
            "twinkle/assets/tiny-qwen/tokenizer.json", "twinkle/assets/tiny-qwen/tokenizer_config.json",
            "twinkle/assets/tiny-qwen/model.safetensors"} <= names
