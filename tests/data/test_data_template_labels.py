"""Label masks checked token by token against references assembled here piece by piece."""

from __future__ import annotations

import json
import re

import pytest

from twinkle.template import ChatMLTemplate, Llama3Template, Qwen3Template, Template

IGNORE = -100


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def chatml_reference(tok, messages, trained_turns=None, gen_header="", train_header=False):
    """Expected (input_ids, labels) for ChatML, built from separately tokenized pieces.

    ``trained_turns``: indices (among assistant messages) that are trained; default all.
    ``gen_header``: text the template inserts after the last assistant header (Qwen3 think block),
    trained with the reply when ``train_header``.
    """
    ids, labels = [], []
    assistant_no = -1
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    for i, m in enumerate(messages):
        head = _ids(tok, f"<|im_start|>{m['role']}\n")
        ids += head
        labels += [IGNORE] * len(head)
        if m["role"] == "assistant":
            assistant_no += 1
            if gen_header and i == last:
                extra = _ids(tok, gen_header)
                ids += extra
                labels += extra if train_header else [IGNORE] * len(extra)
            body = _ids(tok, m["content"]) + _ids(tok, "<|im_end|>")
            trained = trained_turns is None or assistant_no in trained_turns
            ids += body
            labels += body if trained else [IGNORE] * len(body)
            nl = _ids(tok, "\n")
        else:
            nl = _ids(tok, m["content"]) + _ids(tok, "<|im_end|>") + _ids(tok, "\n")
        ids += nl
        labels += [IGNORE] * len(nl)
    return ids, labels


def test_embedded_multi_turn_labels_token_by_token(embedded_template, tokenizer, multi_turn):
    out = embedded_template.encode({"messages": multi_turn})
    ids, labels = chatml_reference(tokenizer, multi_turn)
    assert out["input_ids"] == ids
    assert out["labels"] == labels
    assert sum(label != IGNORE for label in labels) > 20
    n = len(ids)
    assert out["attention_mask"] == [1] * n and out["position_ids"] == list(range(n)) and out["length"] == n


def test_train_only_last_turn_and_per_message_loss(tokenizer, multi_turn):
    last_only = Template(tokenizer=tokenizer, train_turns="last").encode({"messages": multi_turn})
    assert (last_only["input_ids"], last_only["labels"]) == chatml_reference(tokenizer, multi_turn, trained_turns={2})

    flagged = [dict(m) for m in multi_turn]
    flagged[2]["loss"] = False  # first assistant turn out
    flagged[4]["loss"] = True  # kept even with train_turns='last'
    out = Template(tokenizer=tokenizer, train_turns="last").encode({"messages": flagged})
    assert out["labels"] == chatml_reference(tokenizer, multi_turn, trained_turns={1, 2})[1]


def test_prefix_render_path_matches_generation_markers(embedded_template, tokenizer, multi_turn):
    plain = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", embedded_template.chat_template)
    assert plain != embedded_template.chat_template
    by_prefix = Template(tokenizer=tokenizer, chat_template=plain).encode({"messages": multi_turn})
    assert by_prefix == embedded_template.encode({"messages": multi_turn})


def test_test_built_tokenizer_llama_style_template(test_tokenizer, multi_turn):
    tok = test_tokenizer
    out = Llama3Template(tokenizer=tok).encode({"messages": multi_turn})
    ids, labels = _ids(tok, "<|begin_of_text|>"), [IGNORE]
    for m in multi_turn:
        head = _ids(tok, f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n")
        body = _ids(tok, m["content"].strip()) + _ids(tok, "<|eot_id|>")
        ids += head + body
        labels += [IGNORE] * len(head) + (body if m["role"] == "assistant" else [IGNORE] * len(body))
    assert out["input_ids"] == ids
    assert out["labels"] == labels


# A template that re-renders history (like Qwen3): only the final assistant turn gets a think block,
# and the generation prompt adds one when enable_thinking is false.
HISTORY_REWRITING = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' and loop.last -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + (message.reasoning_content or '') + '\\n</think>\\n\\n' -}}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


@pytest.mark.parametrize("enable_thinking", [False, True, None])
def test_history_rewriting_template(tokenizer, multi_turn, enable_thinking):
    """Explicit True trains the (empty) think block; False, or deciding per conversation, keeps it prompt."""
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    template = Qwen3Template(tokenizer=tokenizer, chat_template=HISTORY_REWRITING, **kwargs)
    out = template.encode({"messages": multi_turn})
    expected = chatml_reference(tokenizer, multi_turn, gen_header="<think>\n\n</think>\n\n",
                                train_header=bool(enable_thinking))
    assert (out["input_ids"], out["labels"]) == expected


def test_qwen3_trains_reasoning_when_a_conversation_has_it(tokenizer, multi_turn):
    reasoning = [dict(m) for m in multi_turn]
    reasoning[2]["reasoning_content"] = "dropped from history"
    reasoning[6]["reasoning_content"] = "A fox story fits."
    out = Qwen3Template(tokenizer=tokenizer, chat_template=HISTORY_REWRITING).encode({"messages": reasoning})
    expected = chatml_reference(tokenizer, multi_turn, gen_header="<think>\nA fox story fits.\n</think>\n\n",
                                train_header=True)
    assert (out["input_ids"], out["labels"]) == expected


def test_default_system_is_added_only_when_missing(tokenizer, multi_turn):
    template = Template(tokenizer=tokenizer, default_system="Be brief.")
    with_default = template.encode({"messages": multi_turn[1:]})
    explicit = Template(tokenizer=tokenizer).encode(
        {"messages": [{"role": "system", "content": "Be brief."}, *multi_turn[1:]]})
    assert with_default == explicit
    assert template.encode({"messages": multi_turn}) == Template(tokenizer=tokenizer).encode({"messages": multi_turn})


def test_chatml_template_forces_chatml_on_any_tokenizer(test_tokenizer):
    template = ChatMLTemplate(tokenizer=test_tokenizer)
    assert "<|im_start|>" in template.chat_template
    text = test_tokenizer.decode(template.encode({"messages": [{"role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": "yo"}]})["input_ids"])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"


def test_batch_encode_equals_row_by_row(embedded_template, multi_turn):
    rows = [{"messages": multi_turn}, {"messages": multi_turn[:3]}, {"messages": multi_turn[:5]}]
    batch = [encoded for encoded, _ in embedded_template.batch_encode(rows)]
    assert batch == [embedded_template.encode(r) for r in rows]


TOOLS_TEMPLATE = (
    "{%- if tools -%}{{- '<|im_start|>system\\n' + tools | tojson + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def test_tools_reach_the_chat_template_and_stay_untrained(tokenizer):
    tools = [{"type": "function", "function": {"name": "lookup_weather"}}]
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Sunny."}]
    template = Template(tokenizer=tokenizer, chat_template=TOOLS_TEMPLATE)
    with_tools = template.encode({"messages": messages, "tools": json.dumps(tools)})
    assert "lookup_weather" in tokenizer.decode(with_tools["input_ids"])
    trained = tokenizer.decode([t for t in with_tools["labels"] if t != IGNORE])
    assert trained == "Sunny.<|im_end|>"
    assert template.encode(messages) == template.encode({"messages": messages})  # a bare message list works too


STRIPS_OLD_THINKING = (
    "{%- for message in messages -%}"
    "{%- set content = message['content'] if loop.last else message['content'].split('</think>')[-1].lstrip('\\n') -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def test_inline_reasoning_stripped_from_history_is_located(tokenizer, multi_turn):
    inline = [dict(m) for m in multi_turn]
    inline[2]["content"] = "<think>\nadd them\n</think>\n\n" + multi_turn[2]["content"]
    out = Template(tokenizer=tokenizer, chat_template=STRIPS_OLD_THINKING).encode({"messages": inline})
    assert (out["input_ids"], out["labels"]) == chatml_reference(tokenizer, multi_turn)
