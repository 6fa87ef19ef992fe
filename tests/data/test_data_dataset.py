"""Dataset: every source kind, slicing, mixing, name resolution, num_proc, and errors that keep state."""

from __future__ import annotations

import json

import datasets
import pytest

from twinkle.dataset import DataError, Dataset, DatasetMeta, IterableDataset
from twinkle.errors import ComponentNotFoundError
from twinkle.preprocessor import AlpacaProcessor, MessagesProcessor, SelfCognitionProcessor
from twinkle.template import Template

ROWS = [{"instruction": f"say {i}", "input": "", "output": f"number {i}"} for i in range(12)]


def _write(tmp_path, name: str) -> str:
    path = tmp_path / name
    if name.endswith((".jsonl", ".json")):
        path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    else:
        getattr(datasets.Dataset.from_list(ROWS), {".csv": "to_csv", ".parquet": "to_parquet"}[path.suffix])(str(path))
    return str(path)


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json", "rows.csv", "rows.parquet"])
def test_local_files_load_the_same_rows(tmp_path, name):
    ds = Dataset(DatasetMeta(_write(tmp_path, name)))
    assert [dict(r) for r in ds] == ROWS


def test_directory_text_and_saved_datasets(tmp_path):
    (tmp_path / "dir").mkdir()
    _write(tmp_path / "dir", "part.jsonl")
    assert len(Dataset(DatasetMeta(str(tmp_path / "dir")))) == 12
    (tmp_path / "notes.txt").write_text("line one\nline two\n")
    assert list(Dataset(DatasetMeta(str(tmp_path / "notes.txt")))) == [{"text": "line one"}, {"text": "line two"}]
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert list(Dataset(DatasetMeta(str(tmp_path / "saved"), data_slice=[3, 1]))) == [ROWS[3], ROWS[1]]


def test_data_slice_and_in_memory_rows():
    ds = Dataset(DatasetMeta(data=ROWS, data_slice=(i for i in (5, 0, 5))))
    assert ds[[0, 1, 2]] == [ROWS[5], ROWS[0], ROWS[5]]
    assert ds[-1] == ROWS[5] and ds[1:] == [ROWS[0], ROWS[5]]
    assert len(Dataset(DatasetMeta(data={"a": [1, 2, 3]}, data_slice=range(2)))) == 2


SOURCE_ERRORS = [
    (lambda tmp: DatasetMeta(str(tmp / "nope.jsonl")), FileNotFoundError,
     r"nope.jsonl': no such local file or directory"),
    (lambda tmp: DatasetMeta(data=ROWS, data_slice=range(13)), DataError,
     r"asks for row 12, but it has 12 rows.*range\(12\)"),
    (lambda tmp: DatasetMeta(data=ROWS, data_slice=[1, "x"]), DataError, r"holds 'x' at position 1"),
    (lambda tmp: DatasetMeta(data=ROWS, data_slice=5), DataError, r"data_slice must be an iterable"),
    (lambda tmp: DatasetMeta(), DataError, r"needs exactly one source"),
    (lambda tmp: DatasetMeta(data=[{"q": "a"}, "b"]), DataError, r"row 1 is a str, not a dict"),
    (lambda tmp: DatasetMeta(data=[{"q": "a"}, {"q": 1}]), DataError, r"same type for a given field"),
    (lambda tmp: DatasetMeta(str(tmp)), DataError, r"Could not load"),
    (lambda tmp: DatasetMeta("twinkle://nothing"), FileNotFoundError, r"no embedded asset 'nothing'; known:"),
]


@pytest.mark.parametrize(("make", "exc", "message"), SOURCE_ERRORS)
def test_bad_sources_raise_clear_errors(tmp_path, make, exc, message):
    with pytest.raises(exc, match=message):
        Dataset(make(tmp_path))


def test_bad_file_content_and_type(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{broken\n')
    with pytest.raises(DataError, match=r"Could not read '.*bad.jsonl' as json"):
        Dataset(DatasetMeta(str(tmp_path / "bad.jsonl")))
    (tmp_path / "x.xml").write_text("<a/>")
    with pytest.raises(DataError, match=r"unsupported file type '.xml'"):
        Dataset(DatasetMeta(str(tmp_path / "x.xml")))


def test_unknown_names_list_the_known_ones():
    ds = Dataset(DatasetMeta(data=ROWS))
    with pytest.raises(ComponentNotFoundError, match=r"Unknown preprocessor 'AlpacaProcesor'.*Did you mean "
                                                     r"'AlpacaProcessor'"):
        ds.map("AlpacaProcesor")
    with pytest.raises(ComponentNotFoundError, match=r"Unknown template 'Qwen9Template'.*Qwen3_5Template"):
        ds.set_template("Qwen9Template")
    assert ds.template is None and ds.column_names == list(ROWS[0])


def test_encode_needs_messages_and_a_template(tokenizer):
    ds = Dataset(DatasetMeta(data=ROWS))
    with pytest.raises(DataError, match=r"call dataset.set_template"):
        ds.encode()
    ds.set_template(Template(tokenizer=tokenizer))
    with pytest.raises(DataError, match=r"not 'messages'.*dataset.map\(AlpacaProcessor\(\)\)"):
        ds.encode()


def test_set_template_by_name_builds_it_with_the_arguments():
    ds = Dataset(DatasetMeta(data=ROWS))
    template = ds.set_template("Qwen3_5Template", model_id="twinkle://tiny-qwen", max_length=64,
                               truncation_strategy="left")
    assert type(template).__name__ == "Qwen3_5Template" and ds.template is template
    assert (template.model_id, template.max_length, template.truncation_strategy) == ("twinkle://tiny-qwen", 64, "left")
    assert template.template_kwargs == {"enable_thinking": False}


def test_mixing_concatenate_and_interleave_match_datasets():
    a = DatasetMeta(data=[{"instruction": f"a{i}", "output": "x"} for i in range(6)])
    b = DatasetMeta(data=[{"conversations": [{"from": "human", "value": f"b{i}"}, {"from": "gpt", "value": "y"}]}
                          for i in range(4)])
    ds = Dataset(a).add_dataset(b)
    # raw sources combine over the union of their columns, a column a source lacks read as None
    raw = datasets.concatenate_datasets([Dataset(a).hf_dataset, Dataset(b).hf_dataset])
    assert list(ds) == list(raw) and ds[0]["conversations"] is None and ds[6]["instruction"] is None
    with pytest.raises(DataError, match="not 'messages'"):  # but encoding still needs every source mapped
        ds.set_template("Template", model_id="twinkle://tiny-qwen", max_length=64)
        ds.encode()
    ds.template = None
    ds.map(AlpacaProcessor(), dataset_meta=a).map(MessagesProcessor(), dataset_meta=b)
    firsts = [r["messages"][0]["content"] for r in ds]
    assert firsts == [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)]

    ds.mix_dataset()  # upstream Twinkle's default: round robin until the shorter source runs out
    assert [r["messages"][0]["content"] for r in ds] == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]
    ds.mix_dataset(interleave=True, weights=[3, 1], seed=7)
    parts = [Dataset(a).map(AlpacaProcessor()).hf_dataset, Dataset(b).map(MessagesProcessor()).hf_dataset]
    expected = datasets.interleave_datasets(parts, probabilities=[0.75, 0.25], seed=7)
    assert [r["messages"][0]["content"] for r in ds] == [r["messages"][0]["content"] for r in expected]
    with pytest.raises(DataError, match="got 3 weights for 2 sources"):
        ds.mix_dataset(interleave=True, weights=[1, 2, 3])


def test_self_cognition_asset_through_the_seed_flow(tokenizer):
    ds = Dataset(dataset_meta=DatasetMeta("twinkle://self-cognition", data_slice=range(50)))
    ds.set_template("Template", max_length=128, truncation_strategy="raise")
    ds.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    ds.encode()
    assert len(ds) == 50 and ds.column_names == ["input_ids", "labels", "attention_mask", "position_ids", "length"]
    text = tokenizer.decode([t for t in ds[0]["labels"] if t != -100])
    assert text.endswith("<|im_end|>") and "{{" not in tokenizer.decode(ds[0]["input_ids"])


def test_encode_with_two_processes_equals_one(embedded_template, multi_turn):
    rows = [{"messages": multi_turn[: 3 + 2 * (i % 3)]} for i in range(40)]
    single = Dataset(DatasetMeta(data=rows)).map(MessagesProcessor())
    single.set_template(embedded_template)
    double = Dataset(DatasetMeta(data=rows)).map(MessagesProcessor(), num_proc=2)
    double.set_template(embedded_template)
    assert list(single.encode()) == list(double.encode(num_proc=2, batch_size=8))
    assert list(single) == [embedded_template.encode(r) for r in rows]


def test_upstream_attribute_names():
    a = DatasetMeta(data=[{"x": i} for i in range(3)])
    ds = Dataset(a).add_dataset(DatasetMeta(data=[{"x": 10}]))
    assert ds.dataset is ds.hf_dataset and len(ds.dataset) == 4
    assert [len(part) for part in ds.datasets.values()] == [3, 1]


def test_data_from_a_function_and_upstream_ids():
    def rows():
        yield from ({"x": i} for i in range(3))

    meta = DatasetMeta(data=rows)
    assert [r["x"] for r in Dataset(meta)] == [0, 1, 2]
    assert [r["x"] for r in IterableDataset(meta)] == [0, 1, 2]  # called again for the stream
    assert DatasetMeta("org/name", subset_name="s1").get_id() == "org_name:s1:train"
    with pytest.raises(DataError, match="a function returning them, got int"):
        DatasetMeta(data=3)
