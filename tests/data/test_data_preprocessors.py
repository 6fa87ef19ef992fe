"""Preprocessors: each raw format to standard messages, and every bad row named with its fix."""

from __future__ import annotations

import json

import pytest

from twinkle.dataset import DataError, Dataset, DatasetMeta
from twinkle.preprocessor import AlpacaProcessor, MessagesProcessor, SelfCognitionProcessor


def _msgs(*pairs):
    return [{"role": r, "content": c, "reasoning_content": None, "loss": None, "tool_calls": None} for r, c in pairs]


def test_self_cognition_fills_names_by_tag():
    proc = SelfCognitionProcessor(("小星", "Twinkle"), ("魔搭", "ModelScope"), system=None)
    zh = proc({"query": "你是谁？", "response": "我是{{NAME}}，来自{{AUTHOR}}。", "tag": "zh"})
    en = proc({"query": "who are you?", "response": "I am {{NAME}} by {{AUTHOR}}.", "tag": "en"})
    untagged = proc({"query": "{{NAME}}是谁开发的？", "response": "{{AUTHOR}}"})
    assert zh == {"messages": _msgs(("user", "你是谁？"), ("assistant", "我是小星，来自魔搭。")), "tools": None}
    assert en["messages"][1]["content"] == "I am Twinkle by ModelScope."
    assert untagged["messages"] == _msgs(("user", "小星是谁开发的？"), ("assistant", "魔搭"))
    same = SelfCognitionProcessor("twinkle大模型", "ModelScope社区")
    row = same({"query": "hi", "response": "{{NAME}}/{{AUTHOR}}", "tag": "en"})
    # upstream Twinkle's default: each conversation starts with its system turn
    assert row["messages"] == _msgs(("system", "You are a helpful assistant."), ("user", "hi"),
                                    ("assistant", "twinkle大模型/ModelScope社区"))
    assert SelfCognitionProcessor(system="Be brief.")({"query": "q", "response": "r"})["messages"][0] == _msgs(
        ("system", "Be brief."))[0]
    with pytest.raises(TypeError, match="system must be a string or None, got 3"):
        SelfCognitionProcessor(system=3)


def test_alpaca_and_messages_formats():
    alpaca = AlpacaProcessor()
    assert alpaca({"instruction": "Add", "input": "2 and 2", "output": "4"})["messages"] == _msgs(
        ("user", "Add\n\n2 and 2"), ("assistant", "4"))
    assert alpaca({"instruction": "Say hi", "input": "", "output": "hi", "system": "Be kind."})["messages"] == _msgs(
        ("system", "Be kind."), ("user", "Say hi"), ("assistant", "hi"))

    proc = MessagesProcessor()
    openai = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "loss": False}]}
    sharegpt = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "system": "S"}
    out = proc(openai)
    assert out["messages"][1] == {"role": "assistant", "content": "a", "reasoning_content": None, "loss": False,
                                  "tool_calls": None}
    assert proc(sharegpt)["messages"] == _msgs(("system", "S"), ("user", "q"), ("assistant", "a"))
    tools = [{"type": "function", "function": {"name": "add"}}]
    assert json.loads(proc({**openai, "tools": json.dumps(tools)})["tools"]) == tools
    assert MessagesProcessor(system="Default")(openai)["messages"][0]["content"] == "Default"


BAD_ROWS = [
    (SelfCognitionProcessor(), {"response": "r"}, r"needs a 'query' field, but the row has no such field"),
    (SelfCognitionProcessor(), {"query": 3, "response": "r"}, r"field 'query' must be a string, got int"),
    (SelfCognitionProcessor(), {"query": "q", "response": "r", "tag": "fr"}, r"'tag' must be 'zh' or 'en'"),
    (AlpacaProcessor(), {"instruction": "i", "output": ""}, r"'output' is empty"),
    (MessagesProcessor(), {"text": "x"}, r"'conversations' field, but the row has no such field; it has 'text'"),
    (MessagesProcessor(), {"messages": []}, r"the conversation is empty"),
    (MessagesProcessor(), {"messages": "hello"}, r"'messages' must be a list of turns"),
    (MessagesProcessor(), {"messages": [{"role": "user", "content": "q"}]}, r"no assistant turn"),
    (MessagesProcessor(), {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]},
     r"message 0 \(user\) has content 5; content must be a string"),
    (MessagesProcessor(), {"messages": [{"role": "bot", "content": "q"}]}, r"message 0 has role 'bot'"),
    (MessagesProcessor(), {"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]},
     r"starts with a assistant turn"),
    (MessagesProcessor(), {"conversations": [{"from": "alien", "value": "q"}]}, r"from='alien'"),
    (MessagesProcessor(), {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                           "tools": "{not json"}, r"'tools' is not valid JSON"),
    (MessagesProcessor(), {"messages": [{"role": "user", "content": "q", "tool_calls": [{"name": "f"}]},
                                        {"role": "assistant", "content": "a"}]},
     r"message 0 is a user turn with tool_calls; only assistant turns call tools"),
    (MessagesProcessor(), {"messages": [{"role": "user", "content": "q"},
                                        {"role": "assistant", "content": None, "tool_calls": [{"arguments": {}}]}]},
     r"message 1 \(assistant\): each tool call needs a 'name'"),
]


def test_tool_calls_are_stored_as_name_and_arguments_json():
    """OpenAI-style calls (arguments as a JSON string, content None) become [{"name", "arguments"}] JSON."""
    openai = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}]}
    out = MessagesProcessor()(openai)["messages"]
    assert out[1]["content"] == "" and json.loads(out[1]["tool_calls"]) == [{"name": "get",
                                                                              "arguments": {"city": "Paris"}}]
    assert out[3]["tool_calls"] is None


@pytest.mark.parametrize(("proc", "row", "message"), BAD_ROWS)
def test_bad_rows_raise_naming_the_problem(proc, row, message):
    with pytest.raises(DataError, match=message):
        proc(row)


def test_map_names_the_bad_row_and_keeps_the_dataset():
    rows = [{"query": "q", "response": "r"}] * 4 + [{"query": None, "response": "r"}]
    ds = Dataset(DatasetMeta(data=rows))
    with pytest.raises(DataError, match=r"SelfCognitionProcessor failed on row 4: .*needs a 'query'.*strict=False"):
        ds.map(SelfCognitionProcessor())
    assert ds.column_names == ["query", "response"] and len(ds) == 5


def test_strict_false_skips_and_counts_bad_rows(twinkle_log):
    rows = [{"instruction": "i", "output": "o"}, {"instruction": "i", "output": ""},
            {"instruction": "j", "output": "p"}, {"instruction": "k", "output": ""}]
    ds = Dataset(DatasetMeta(data=rows)).map("AlpacaProcessor", strict=False)
    assert [r["messages"][0]["content"] for r in ds] == ["i", "j"]
    assert "dropped 2 of 4 rows (2 invalid (first: row 1: AlpacaProcessor: 'output' is empty" in twinkle_log.text


def test_plain_function_map_and_filter_update_rows():
    ds = Dataset(DatasetMeta(data=[{"q": "a", "n": 1}, {"q": "b", "n": 2}, {"q": "c", "n": 3}]))
    ds.map(lambda row: {"q": row["q"].upper()}).filter(lambda row: row["n"] != 2)
    assert list(ds) == [{"q": "A", "n": 1}, {"q": "C", "n": 3}]
    with pytest.raises(DataError, match=r"filter\(<lambda>\) failed on row 1: KeyError"):
        ds.filter(lambda row: row["n"] == 1 or row["missing"])
    assert len(ds) == 2


def test_competition_math_sft_and_grpo_rows():
    rows = [{"problem": "1+1?", "solution": "\\boxed{2}"}, {"problem": "2+2?", "solution": "\\boxed{4}"}]
    sft = Dataset(DatasetMeta(data=rows)).map("CompetitionMathProcessor")
    assert sft[1]["messages"] == _msgs(("user", "2+2?"), ("assistant", "\\boxed{4}"))
    grpo = Dataset(DatasetMeta(data=rows)).map("CompetitionMathGRPOProcessor")
    first = grpo[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert "\\boxed{...}" in first["messages"][0]["content"] and first["messages"][2]["content"] == ""
    assert first["user_data"] == [["solution", "\\boxed{2}"]]


def test_a_batched_call_override_maps_each_row():
    """A subclass written in upstream Twinkle's form (``__call__`` over columns) is applied row by row."""

    class Shout(AlpacaProcessor):
        def __call__(self, rows):
            rows = [self.preprocess(row) for row in self.map_col_to_row(rows)]
            for row in rows:
                row["messages"][-1]["content"] = row["messages"][-1]["content"].upper()
            return self.map_row_to_col(rows)

    ds = Dataset(DatasetMeta(data=[{"instruction": "i", "output": "o"}, {"instruction": "j", "output": "p"}]))
    ds.map(Shout())
    assert [r["messages"][1]["content"] for r in ds] == ["O", "P"]

    class Twice(AlpacaProcessor):
        def __call__(self, rows):
            return self.map_row_to_col([self.preprocess(r) for r in self.map_col_to_row(rows)] * 2)

    with pytest.raises(DataError, match="returned 2 rows for one"):
        Dataset(DatasetMeta(data=[{"instruction": "i", "output": "o"}])).map(Twice())
