"""A row that lacks a field is told so: a JSON Lines key missing from one row reads as null, not as present."""

from __future__ import annotations

import json

import pytest

from twinkle.dataset import DataError, Dataset, DatasetMeta
from twinkle.preprocessor import AlpacaProcessor, MessagesProcessor


def test_a_jsonl_row_without_output_is_named_as_null(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"instruction": "a", "input": "", "output": "b"}, {"instruction": "c", "input": "d"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = Dataset(DatasetMeta(str(path)))
    with pytest.raises(DataError) as info:
        ds.map(AlpacaProcessor())
    message = str(info.value)
    # the loaded row has every column ('output' = None): the message must not list 'output' as present
    assert "needs a 'output' field, but the row's 'output' is null; it has 'instruction', 'input'" in message


@pytest.mark.parametrize("row, message", [
    ({"instruction": "i", "output": None}, "the row's 'output' is null; it has 'instruction'"),
    ({"instruction": "i"}, "the row has no such field; it has 'instruction'"),
    ({"output": None, "instruction": None}, "the row's 'instruction' is null; it has no non-null field"),
])
def test_alpaca_names_the_missing_field(row, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(")):
        AlpacaProcessor()(row)


def test_messages_processor_names_both_null_fields():
    with pytest.raises(DataError, match="the row's 'messages' and 'conversations' are null; it has 'text'"):
        MessagesProcessor()({"messages": None, "conversations": None, "text": "x"})
