"""Issue 13 weak cases in the data path: each bad file is one clear error naming the file, the line or row,
the field, and the fix -- at load time, not on first access."""

from __future__ import annotations

import pytest

from twinkle.dataset import Dataset, DatasetMeta
from twinkle.dataset.errors import DataError

GOOD = '{"query": "hi", "response": "hello"}\n'


def _load(path):
    dataset = Dataset(DatasetMeta(str(path)))
    return [dataset[i] for i in range(len(dataset))]  # touch every row: a lazy failure counts too


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_an_empty_jsonl_says_it_is_empty(tmp_path, content) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"empty\.jsonl' as json: the file is empty: it holds no rows"):
        _load(path)


def test_a_bad_json_line_is_named_by_its_line_number(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + GOOD + '{"query": "c", "response": \n' + GOOD)
    with pytest.raises(DataError, match=r"bad\.jsonl' as json: line 3 is not valid JSON .*\"query\": \"c\""):
        _load(path)


def test_a_line_that_is_not_an_object_is_named(tmp_path) -> None:
    path = tmp_path / "list.jsonl"
    path.write_text(GOOD + '["query", "response"]\n')
    with pytest.raises(DataError, match=r"list\.jsonl' as json: line 2 is a JSON list, not an object"):
        _load(path)


@pytest.mark.parametrize("suffix,head,line", [(".jsonl", GOOD.encode(), 2), (".csv", b"query,response\nhi,hello\n", 3)])
def test_non_utf8_bytes_name_the_file_and_line(tmp_path, suffix, head, line) -> None:
    path = tmp_path / f"latin1{suffix}"
    row = b'{"query": "caf\xe9", "response": "x"}\n' if suffix == ".jsonl" else b"caf\xe9,x\n"
    path.write_bytes(head + row)
    with pytest.raises(DataError, match=rf"latin1\{suffix}' as \w+: line {line} is not valid UTF-8 .*iconv"):
        _load(path)


@pytest.mark.parametrize("value,kind", [("3", "a number"), ('["a"]', "a list"), ("true", "a boolean")])
def test_a_wrong_typed_field_names_the_row_and_field(tmp_path, value, kind) -> None:
    path = tmp_path / "typed.jsonl"
    path.write_text(GOOD + GOOD + f'{{"query": {value}, "response": "x"}}\n')
    match = rf"typed\.jsonl' as json: line 3: field 'query' is {kind} .* line 1's 'query' is a string"
    with pytest.raises(DataError, match=match):
        _load(path)


def test_in_memory_rows_with_a_wrong_typed_field_name_the_row() -> None:
    rows = [{"query": "a", "response": "b"}, {"query": "c", "response": "d"}, {"query": 3, "response": "e"}]
    with pytest.raises(DataError, match=r"DatasetMeta\.data row 2: field 'query' is a number"):
        Dataset(DatasetMeta(data=rows))


@pytest.mark.parametrize("rows,where,field,kind,first", [
    ([{"messages": [{"role": "user", "content": "hi"}]}, {"messages": [{"role": "user", "content": 3}]}],
     "row 1", r"messages\[0\]\.content", "a number", r"row 0's 'messages\[0\]\.content' is a string"),
    ([{"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "a"}]}],
     "row 0", r"messages\[1\]\.content", "a string", r"row 0's 'messages\[0\]\.content' is a number \(7\)"),
])
def test_in_memory_messages_with_a_wrong_typed_content_name_the_row_and_message(rows, where, field, kind,
                                                                                 first) -> None:
    """A message's content of another type than the other messages' names both (Arrow's own error names
    neither the row nor the field)."""
    with pytest.raises(DataError, match=rf"DatasetMeta\.data {where}: field '{field}' is {kind} .* but {first}"):
        Dataset(DatasetMeta(data=rows))


def test_a_clean_file_still_loads(tmp_path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(GOOD * 3)
    assert [r["query"] for r in _load(path)] == ["hi"] * 3
