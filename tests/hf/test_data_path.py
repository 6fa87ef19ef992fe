"""The data path into the model: DataLoader rows, collated batches, packed batches, raw conversations."""

from __future__ import annotations

import pytest
import torch
from rounding import tiny_qwen

from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.processor import InputProcessor
from twinkle_hf.model import TransformersModel


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    data = Dataset(DatasetMeta("twinkle://self-cognition", data_slice=range(8)))
    data.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=128)
    data.map(SelfCognitionProcessor("twinkle", "ModelScope"))
    data.encode()
    return data


def _model(seed: int = 0) -> TransformersModel:
    torch.manual_seed(seed)
    return TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")


def test_rows_collated_and_packed_batches_give_the_same_loss(dataset) -> None:
    rows = next(iter(DataLoader(dataset, batch_size=4, shuffle=False)))
    collated = next(iter(DataLoader(dataset, batch_size=4, shuffle=False, processor=InputProcessor())))
    assert isinstance(rows, list) and isinstance(collated, dict)
    model = _model()
    from_rows = model.forward_backward(inputs=rows)
    from_tensors = model.forward_backward(inputs=collated)
    assert from_rows == from_tensors
    model.set_processor("InputProcessor", padding_free=True)
    packed = model.forward_backward(inputs=rows)
    assert model.optimizer_group["default"].last_inputs["input_ids"].shape[0] == 1  # really packed
    # packed rows attend through another kernel (varlen): a forward's float32 bound for the collated rows
    assert packed == pytest.approx(from_rows, rel=tiny_qwen(collated["input_ids"].shape[1], 4).forward_bound())


def test_raw_conversations_are_encoded_with_the_group_template(dataset) -> None:
    conversation = {"messages": [{"role": "user", "content": "Who are you?"},
                                 {"role": "assistant", "content": "I am twinkle."}]}
    model = _model()
    with pytest.raises(ValueError, match="no 'input_ids' and group 'default' has no template"):
        model.forward_backward(inputs=[conversation])
    model.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen")
    template = model.optimizer_group["default"].template
    raw = model.forward_backward(inputs=[conversation])
    encoded = model.forward_backward(inputs=[template.encode(conversation)])
    assert raw == encoded
