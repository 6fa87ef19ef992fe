"""The data components are registered through core's plugin hooks and importing them stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from twinkle.preprocessor import AlpacaProcessor, MessagesProcessor, SelfCognitionProcessor
from twinkle.processor import InputProcessor
from twinkle.registry import get_registry, resolve
from twinkle.template import ChatMLTemplate, Llama3Template, Qwen2_5Template, Qwen3_5Template, Qwen3Template, Template

EXPECTED = {
    "template": {"Template": Template, "ChatMLTemplate": ChatMLTemplate, "Qwen2_5Template": Qwen2_5Template,
                 "Qwen3Template": Qwen3Template, "Qwen3_5Template": Qwen3_5Template, "Llama3Template": Llama3Template},
    "preprocessor": {"SelfCognitionProcessor": SelfCognitionProcessor, "AlpacaProcessor": AlpacaProcessor,
                     "MessagesProcessor": MessagesProcessor},
    "processor": {"InputProcessor": InputProcessor},
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_names_resolve_to_the_classes(kind):
    registry = get_registry()
    for name, cls in EXPECTED[kind].items():
        component = registry.get(kind, name)
        assert component.distribution == "twinkle-core"
        assert resolve(kind, name) is cls
    instance = next(iter(EXPECTED[kind].values()))
    assert resolve(kind, instance) is instance


def test_importing_the_data_path_imports_nothing_heavy():
    code = (
        "import sys, json\n"
        "import twinkle, twinkle.dataset, twinkle.dataloader, twinkle.template, twinkle.preprocessor\n"
        "import twinkle.processor, twinkle.hub, twinkle.assets\n"
        "from twinkle.registry import list_components\n"
        "names = [c.name for c in list_components('template')]\n"
        "heavy = ('transformers', 'datasets', 'torch', 'peft', 'accelerate', 'megatron', 'tokenizers')\n"
        "print(json.dumps({'names': names, 'loaded': sorted({m.split('.')[0] for m in sys.modules} & set(heavy))}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    assert out["loaded"] == [] and "Qwen3_5Template" in out["names"]
