"""Write twinkle's tiny vision-language model directories (configs, processors and seeded weights).

Output: packages/twinkle-core/src/twinkle/assets/tiny-qwen2.5-vl/, tiny-qwen3-vl/ and tiny-internvl2.5/, each with
  config.json            a Qwen2.5-VL / Qwen3-VL config: 2-layer hidden-64 language model, 2-block vision tower
  tokenizer*.json        the embedded tiny-qwen tokenizer plus the Qwen vision special tokens
  processor_config.json  the family's processor with a small image processor (4-16 image tokens per image)
  chat_template.jinja    twinkle.template.chat_templates.QWEN_VL (Qwen-VL's conversation format; InternVL 2.5's
                         for tiny-internvl2.5, whose processor tiles images with a GotOcr2 image processor)
  model.safetensors      transformers' own initialisation of the config, drawn from ``torch.manual_seed(SEED)``,
                         float32, written by ``save_pretrained`` (so plain ``from_pretrained`` loads it)

With weights on disk every process and plain transformers (+ peft) load the same model:
``TransformersModel(model_id='twinkle://tiny-qwen2.5-vl')`` or
``AutoModelForImageTextToText.from_pretrained(twinkle.hub.resolve_path('twinkle://tiny-qwen2.5-vl'))``;
``AutoProcessor`` (or twinkle's image-only fallback where torchvision is missing) reads the processor.
Run: ``python scripts/make_tiny_vl.py [ASSET...]`` (``--weights-only`` rewrites only the weights). The weights are
drawn under the golden runs' pinned numerics (one thread, ATen's baseline kernels, libm without FMA: the
script restarts itself with them), so they are the exact model ``vl_lora`` in tests/golden trains.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: tests/golden/make_golden.py's PINNED_ENV entries that decide how random weights are drawn
PINNED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default",
          "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-FMA4", "HF_HUB_OFFLINE": "1"}
if __name__ == "__main__" and any(os.environ.get(k) != v for k, v in PINNED.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **PINNED})

from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2VLImageProcessorPil, Qwen3VLConfig  # noqa: E402

from twinkle.multimodal.processor import _image_only_class  # noqa: E402
from twinkle.template.chat_templates import QWEN_VL  # noqa: E402

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


#: the seed of the embedded VL weights: the one the golden ``vl_lora`` run drew its random init from, so the
#: shipped weights are the model that run always trained (tests/golden/make_golden.py)
SEED = 12


def write_weights(name: str) -> None:
    """``model.safetensors`` of the asset ``name``: its config built by the image-text-to-text auto class,
    seeded, saved by ``save_pretrained`` (in the layout ``from_pretrained`` reads)."""
    import tempfile

    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    out = ASSETS / name
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(SEED)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        shutil.copyfile(Path(tmp) / "model.safetensors", out / "model.safetensors")
    total = sum(p.numel() for p in model.parameters())
    print(f"wrote {out / 'model.safetensors'}: {total} parameters, seed {SEED}")


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


#: InternVL's named image tokens (the tokenizer's model-specific special tokens, as the HF InternVL repos set them)
INTERNVL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                   "video_token": "<video>"}


def write_internvl(name: str) -> None:
    """InternVL 2.5 (the 1B/4B layout: InternViT + 2-layer MLP projector + a Qwen2.5 language model): 56-pixel tiles
    of 4x4 patches, pixel-shuffled by 0.5 into 4 tokens per tile, 1-4 tiles + a thumbnail per image."""
    import transformers
    from transformers import GotOcr2ImageProcessorPil, InternVLConfig

    from twinkle.template.chat_templates import INTERNVL2_5

    out = ASSETS / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(ASSETS / "tiny-qwen", extra_special_tokens=INTERNVL_TOKENS)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    text = {**TEXT, "model_type": "qwen2", "vocab_size": len(tok), "bos_token_id": None,
            "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    text.pop("head_dim")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=[56, 56], patch_size=[14, 14])
    config = InternVLConfig(vision_config=vision, text_config=text, image_token_id=tok.context_image_token_id,
                            image_seq_length=4, downsample_ratio=0.5, tie_word_embeddings=False)
    image_processor = GotOcr2ImageProcessorPil(size={"height": 56, "width": 56}, min_patches=1, max_patches=4)
    processor_cls = _image_only_class(transformers.InternVLProcessor)
    processor = processor_cls(image_processor=image_processor, tokenizer=tok, video_processor=None,
                              image_seq_length=4, chat_template=INTERNVL2_5)
    config.save_pretrained(out)
    processor.save_pretrained(out)
    print(f"wrote {out}: {sorted(p.name for p in out.iterdir())}")


FAMILIES = {"tiny-qwen2.5-vl": lambda name: write(name, qwen2_5_vl),
            "tiny-qwen3-vl": lambda name: write(name, qwen3_vl),
            "tiny-internvl2.5": write_internvl}

if __name__ == "__main__":
    chosen = [a for a in sys.argv[1:] if not a.startswith("--")] or list(FAMILIES)
    for asset in chosen:
        if "--weights-only" not in sys.argv:
            FAMILIES[asset](asset)
        write_weights(asset)
