"""MultiLoraTransformersModel counts as a TransformersModel, as the Megatron pair does (a virtual subclass)."""

from twinkle.model import MultiLoraTransformersModel, TransformersModel


def test_multi_lora_transformers_model_is_a_transformers_model():
    assert issubclass(MultiLoraTransformersModel, TransformersModel)
    assert not issubclass(TransformersModel, MultiLoraTransformersModel)
