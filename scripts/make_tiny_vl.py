"""Write twinkle's tiny vision-language model directories (configs + processors, no weights).

Output: packages/twinkle-core/src/twinkle/assets/tiny-qwen2.5-vl/ and tiny-qwen3-vl/, each with
  config.json            a Qwen2.5-VL / Qwen3-VL config: 2-layer hidden-64 language model, 2-block vision tower
  tokenizer*.json        the embedded tiny-qwen tokenizer plus the Qwen vision special tokens
  processor_config.json  the family's processor with a small image processor (4-16 image tokens per image)
  chat_template.jinja    twinkle.template.chat_templates.QWEN_VL (Qwen-VL's conversation format)

Models are built from these with ``from_config`` (random init): ``TransformersModel(model_id=
'twinkle://tiny-qwen2.5-vl')``; ``AutoProcessor`` (or twinkle's image-only fallback where
torchvision is missing) reads the processor. Run: ``python scripts/make_tiny_vl.py``
"""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2VLImageProcessorPil, Qwen3VLConfig

from twinkle.multimodal.processor import _image_only_class
from twinkle.template.chat_templates import QWEN_VL

ASSETS = Path(__file__).resolve().parents[1] / "packages/twinkle-core/src/twinkle/assets"
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False)
VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, spatial_merge_size=2,
              temporal_patch_size=2)


def tokenizer():
    tok = AutoTokenizer.from_pretrained(ASSETS / "tiny-qwen")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    return tok


def token_ids(tok) -> dict[str, int]:
    ids = dict(zip(VISION_TOKENS, tok.convert_tokens_to_ids(VISION_TOKENS)))
    return {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}


def qwen2_5_vl(tok):
    text = {**TEXT, "vocab_size": len(tok), "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
            "bos_token_id": None, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = Qwen2_5_VLConfig(text_config=text, vision_config={**VISION, "patch_size": 14, "window_size": 56,
                                                               "fullatt_block_indexes": [1]},
                              tie_word_embeddings=False, **token_ids(tok))
    return config, 14, "Qwen2_5_VLProcessor"


def qwen3_vl(tok):
    text = {**TEXT, "vocab_size": len(tok), "bos_token_id": None, "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}}
    config = Qwen3VLConfig(text_config=text, vision_config={**VISION, "patch_size": 16, "num_position_embeddings": 64,
                                                            "deepstack_visual_indexes": [0]},
                           tie_word_embeddings=False, **token_ids(tok))
    return config, 16, "Qwen3VLProcessor"


def write(name: str, build) -> None:
    import transformers

    out = ASSETS / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tok = tokenizer()
    config, patch, processor_name = build(tok)
    factor = patch * 2
    image_processor = Qwen2VLImageProcessorPil(min_pixels=factor * factor * 4, max_pixels=factor * factor * 16,
                                               patch_size=patch, merge_size=2, temporal_patch_size=2)
    processor_cls = _image_only_class(getattr(transformers, processor_name))
    processor = processor_cls(image_processor=image_processor, tokenizer=tok, video_processor=None,
                              chat_template=QWEN_VL)
    config.save_pretrained(out)
    processor.save_pretrained(out)
    print(f"wrote {out}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    write("tiny-qwen2.5-vl", qwen2_5_vl)
    write("tiny-qwen3-vl", qwen3_vl)
