"""Write the seeded weights of twinkle's embedded tiny model (``twinkle://tiny-qwen``).

Output: packages/twinkle-core/src/twinkle/assets/tiny-qwen/model.safetensors — transformers' own
initialisation of the config.json beside it (run scripts/make_tokenizer.py first), drawn from
``torch.manual_seed(SEED)``, stored in float32 (~240k parameters, under 1 MB; the tied lm_head is
not stored twice). With weights on disk every process starts from the same model, so a fresh-process
resume equals an uninterrupted run, and a LoRA checkpoint of the main job loads in plain
transformers + peft (``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), ckpt)``).

Run: ``python scripts/make_tiny_weights.py``
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

OUT = Path(__file__).resolve().parents[1] / "packages/twinkle-core/src/twinkle/assets/tiny-qwen"
SEED = 20241130


def main() -> None:
    config = AutoConfig.from_pretrained(OUT)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # transformers re-ties it to embed_tokens on load
    save_file(state, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    total = sum(v.numel() for v in state.values())
    print(f"wrote {OUT / 'model.safetensors'}: {total} parameters, seed {SEED}")


if __name__ == "__main__":
    main()
