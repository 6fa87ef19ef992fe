"""Images through the service: a vision-language base model (twinkle://tiny-qwen2.5-vl) trains on the client's
ImageChunk through the same VL path as a script (the template's processor and media collator), within the
derived bound of its two steps."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import tinker
from server_proc import start_server
from tinker import types

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from golden_bounds import VL  # noqa: E402

VL_MODEL = "twinkle://tiny-qwen2.5-vl"
VL_NAME = "twinkle/tiny-qwen2.5-vl"
#: eps = 1: the update is Lipschitz in the gradient (tests/server/test_ray_mode.py); with 1e-8 the server's and
#: the script's reduction orders flip lr * sign(g) of near-zero gradients, bounded on no CPU
ADAM = types.AdamParams(learning_rate=1e-2, eps=1.0)
#: two steps of the tiny Qwen2.5-VL in another process (another summation order): the second step's loss
#: carries the first step's rounding twice and its own (tests/rounding.py via golden_bounds.VL)
BOUND = (2 * 1 + 1) * VL.step_bound()


@pytest.fixture(scope="module")
def vl_server(server, tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("vl-server"), server.keys_file, server.keys,
                           ["--model.model-id", VL_MODEL, "--server.max-tenants", "2", "--server.max-rank", "8"])
    yield running
    running.stop()


def _png(colour) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _datum(tokenizer, image: bytes, image_tokens: int, expected: int | None = None) -> tuple[types.Datum, dict]:
    """A Tinker datum '<text><|vision_start|>[image]<|vision_end|><answer>' and the same row as a script feeds it."""
    start, end, pad = (tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>",
                                                                   "<|image_pad|>"))
    before = tokenizer.encode("What colour is it? ") + [start]
    after = [end] + tokenizer.encode(" It is red.")
    ids = before + [pad] * image_tokens + after
    targets, weights = ids[1:] + [end], [0.0] * (len(before) + image_tokens) + [1.0] * len(after)
    datum = types.Datum(model_input=types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=before),
        types.ImageChunk(data=image, format="png", expected_tokens=expected or image_tokens),
        types.EncodedTextChunk(tokens=after)]), loss_fn_inputs={"target_tokens": targets, "weights": weights})
    return datum, {"input_ids": ids, "target_tokens": targets, "weights": weights, "images": [image]}


def test_image_chunks_train_through_the_vl_path_like_a_script(vl_server):
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel
    from twinkle.registry import resolve
    from twinkle.runtime import seed_everything
    from twinkle_server.targets import layer_families

    client = vl_server.service_client("alice")
    training = client.create_lora_training_client(base_model=VL_NAME, rank=4, seed=5).result()
    tokenizer = training.get_tokenizer()
    processor = resolve("template", "Qwen2_5VLTemplate")(model_id=VL_MODEL).processor
    grid = processor.image_processor(images=[__import__("PIL.Image").Image.open(io.BytesIO(_png("red")))],
                                     return_tensors="pt")["image_grid_thw"]
    image_tokens = int(grid.prod()) // processor.image_processor.merge_size ** 2
    datum, row = _datum(tokenizer, _png("red"), image_tokens)
    losses = []
    for _ in range(2):
        losses.append(training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"])
        training.optim_step(ADAM).result()

    # the same two steps written against the component API, as a VL training script would
    from twinkle.hub import resolve_path

    targets = layer_families(resolve_path(VL_MODEL))
    modules = [m for names in targets.values() for m in names]
    seed_everything(0)
    model = MultiLoraTransformersModel(model_id=VL_MODEL, mixed_precision="no", max_loras=2, max_r=8,
                                       target_modules=modules)
    model.acquire_lora("ref", LoraConfig(r=4, lora_alpha=32, lora_dropout=0.0, target_modules=modules), seed=5)
    model.set_template("Qwen2_5VLTemplate", adapter_name="ref", model_id=VL_MODEL)
    model.set_optimizer("AdamW", adapter_name="ref", lr=1e-2, betas=(0.9, 0.95), eps=1.0, weight_decay=0.0)
    model.set_loss("cross_entropy", adapter_name="ref")
    expected = []
    for _ in range(2):
        expected.append(model.forward_backward(inputs=[row], adapter_name="ref"))
        model.clip_grad_and_step(max_grad_norm=None, adapter_name="ref")
    assert losses == pytest.approx(expected, rel=BOUND, abs=0)
    assert losses[1] < losses[0]

    wrong, _ = _datum(tokenizer, _png("blue"), image_tokens, expected=image_tokens + 3)
    with pytest.raises(tinker.BadRequestError, match=f"takes {image_tokens} tokens .* not expected_tokens"):
        training.forward_backward([wrong], "cross_entropy").result()
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    smuggled = types.Datum(model_input=types.ModelInput.from_ints([5, pad, 6]),
                           loss_fn_inputs={"target_tokens": [1, 2, 3]})
    with pytest.raises(tinker.BadRequestError, match="as text; send images as image chunks"):
        training.forward_backward([smuggled], "cross_entropy").result()
    # forward gives the logprobs of a prompt with an image; sampling one is refused, saying so
    assert len(training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data) == len(row[
        "input_ids"])
    sampler = training.save_weights_and_get_sampling_client().result()
    with pytest.raises(tinker.BadRequestError, match="image chunks is not supported by this server yet"):
        sampler.sample(datum.model_input, 1, types.SamplingParams(max_tokens=2)).result()
    client.close("success").result()
