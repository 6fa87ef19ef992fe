"""Each family's chat format, token by token: the rendering written here from the family's documentation,
the trained tokens exactly those of the reply spans (content, reasoning where the family trains it, tool
calls, the end-of-turn token), and the thinking switch of Qwen 3.5 and DeepSeek V4."""

from __future__ import annotations

import pytest
from family_cases import cases
from family_testing import FAMILIES, load_tokenizer

import twinkle.template as templates

IGNORE = -100
CASES = [(key, i) for key in FAMILIES for i in range(len(cases(key)))]


def reference(tok, segments):
    """(input_ids, labels) from the segments tokenized one by one: trained segments keep their ids."""
    ids, labels = [], []
    for text, trained in segments:
        piece = tok.encode(text, add_special_tokens=False)
        ids += piece
        labels += piece if trained else [IGNORE] * len(piece)
    return ids, labels


@pytest.mark.parametrize(("key", "index"), CASES, ids=[f"{k}-{i}" for k, i in CASES])
def test_family_template_renders_and_labels_token_by_token(family_dirs, key, index):
    family, case = FAMILIES[key], cases(key)[index]
    template = getattr(templates, family.template)(model_id=str(family_dirs[key]), **case.kwargs)
    out = template.encode(case.row)
    tok = load_tokenizer(family_dirs[key], family)
    assert tok.decode(out["input_ids"], skip_special_tokens=False) == case.text
    ids, labels = reference(tok, case.segments)
    assert out["input_ids"] == ids
    assert out["labels"] == labels
    assert sum(label != IGNORE for label in labels) >= 5
    assert tok.is_fast == (family.slow_tokenizer is None)


def test_thinking_switch_is_per_conversation_unless_fixed(family_dirs):
    """Qwen 3.5: reasoning in the rows -> thinking mode (reasoning trained); none -> closed think block as
    prompt; enable_thinking= fixes the mode for every row."""
    path = str(family_dirs["qwen3_5"])
    thinking, plain = cases("qwen3_5")
    auto = templates.Qwen3_5Template(model_id=path)
    assert auto.conversation_kwargs(auto._conversation(thinking.row, 0))["enable_thinking"] is True
    assert auto.conversation_kwargs(auto._conversation(plain.row, 0))["enable_thinking"] is False
    forced = templates.Qwen3_5Template(model_id=path, enable_thinking=False).encode(thinking.row)
    assert forced == auto.encode(plain.row)  # reasoning dropped, the closed block is prompt
    prompt = auto.encode_prompt({"messages": thinking.row["messages"][:2], "tools": thinking.row["tools"]})
    tok = auto.tokenizer
    assert tok.decode(prompt["input_ids"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    think_prompt = templates.Qwen3_5Template(model_id=path, enable_thinking=True).encode_prompt(
        {"messages": thinking.row["messages"][:2]})
    assert tok.decode(think_prompt["input_ids"]).endswith("<|im_start|>assistant\n<think>\n")


def test_remote_code_tokenizers_need_consent(family_dirs):
    """GLM-4 / InternLM2 ship their tokenizer as code: refused without trust_remote_code, named with the fix."""
    from twinkle.dataset import DataError

    for key, name in (("glm4", "GLM4Template"), ("internlm2_5", "InternLM2Template")):
        with pytest.raises(DataError, match="trust_remote_code=True"):
            _ = getattr(templates, name)(model_id=str(family_dirs[key])).tokenizer


def test_slow_tokenizer_refuses_a_span_edge_inside_a_token(family_dirs):
    """The slow path places labels by tokenizing prefixes; an edge inside a merged token is refused, not guessed."""
    from twinkle.dataset import DataError

    chat = ("{%- for m in messages -%}{%- if m.role == 'assistant' -%}{%- generation -%}{{- m.content -}}"
            "{%- endgeneration -%}{%- else -%}{{- m.content -}}{%- endif -%}{%- endfor -%}")
    template = templates.GLM4Template(model_id=str(family_dirs["glm4"]), trust_remote_code=True, chat_template=chat)
    with pytest.raises(DataError, match="merges characters across the trained span edge"):
        template.encode({"messages": [{"role": "user", "content": "hel"}, {"role": "assistant", "content": "lo"}]})


def test_families_without_a_tool_format_refuse_tools(family_dirs):
    from family_cases import tool_conversation

    from twinkle.dataset import DataError

    with pytest.raises(DataError, match="Yi has no documented tool"):
        templates.YiTemplate(model_id=str(family_dirs["yi"])).encode(tool_conversation())
