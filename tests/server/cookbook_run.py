"""Run a tinker-cookbook recipe (or its weights.download) against `twinkle serve`, in the cookbook's environment.

The only adaptations are local data and a local tokenizer: the hub datasets the recipes load are
replaced by a few rows of the same shape, the served model's tokenizer is registered under its
name (``tokenizer_utils.register_tokenizer``, the cookbook's own hook) and, as the cookbook knows
no renderer for a model it has never heard of, the generic ``role_colon`` renderer is recommended
for it. The recipes' own code runs unchanged.

    python cookbook_run.py MODULE [key=value ...]       a recipe module, e.g. tinker_cookbook.recipes.sl_loop
    python cookbook_run.py weights.download TINKER_PATH OUTPUT_DIR

Environment: TINKER_BASE_URL, TINKER_API_KEY, TWINKLE_MODEL_NAME (the served name), TWINKLE_TOKENIZER (a directory).
"""

from __future__ import annotations

import os
import runpy
import sys

MODEL = os.environ["TWINKLE_MODEL_NAME"]
TOKENIZER = os.environ["TWINKLE_TOKENIZER"]

NO_ROBOTS = [{"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
             for question, answer in [("Who are you?", "I am twinkle, a training workbench."),
                                      ("What do you do?", "I train language models on one CPU or many GPUs."),
                                      ("Who made you?", "The twinkle developers made me."),
                                      ("What is LoRA?", "A low-rank adapter trained on a frozen base model.")] * 32]
# 128 rows: one batch of sl_basic's fixed batch size (chz cannot override a field of its dataset builder)
GSM8K = [{"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
         for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (4, 4), (6, 1), (9, 0)]]
LOCAL = {"HuggingFaceH4/no_robots": NO_ROBOTS, "openai/gsm8k": GSM8K}


def _patch() -> None:
    import datasets
    from tinker_cookbook import model_info, tokenizer_utils
    from transformers import AutoTokenizer

    tokenizer_utils.register_tokenizer(MODEL, lambda: AutoTokenizer.from_pretrained(TOKENIZER))
    recommended = model_info.get_recommended_renderer_names
    model_info.get_recommended_renderer_names = lambda name: ["role_colon"] if name == MODEL else recommended(name)

    def load_dataset(name, *args, **kwargs):
        if name not in LOCAL:
            raise RuntimeError(f"{name} is not available offline")
        rows = datasets.Dataset.from_list(LOCAL[name])
        return datasets.DatasetDict({"train": rows, "test": rows})

    datasets.load_dataset = load_dataset


def main(argv: list[str]) -> None:
    _patch()
    if argv[0] == "weights.download":
        from tinker_cookbook import weights

        weights.download(tinker_path=argv[1], output_dir=argv[2])
        return
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
