"""The bodies that travel as protobuf (tinker's published ``tinker_public.proto``) and their plain forms.

In: ``ForwardBackwardRequest`` (the client always sends forward/forward_backward as protobuf) becomes
:class:`StepRequest` -- rows of ``input_ids`` with their per-token ``loss_fn_inputs``, the layout
twinkle's InputProcessor pads and the Tinker-defined losses read. Out: ``ForwardBackwardOutput`` and
``SampleResponse`` as protobuf (what the client asks for with ``Accept: application/x-protobuf``)
or as JSON. Nothing here is unpickled: protobuf and numpy buffers only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

PROTO = "application/x-protobuf"
#: Per-token loss inputs the server passes to the losses, with their dtype; others are refused.
LOSS_INPUTS = {"target_tokens": np.int64, "weights": np.float32, "logprobs": np.float32, "advantages": np.float32}


#: Per-token float inputs must be finite and at most this large in magnitude (weights, advantages, logprobs):
#: a larger one only turns the loss into inf.
VALUE_LIMIT = 1e6
_NUMPY = {pb.DTYPE_FLOAT32: np.dtype("<f4"), pb.DTYPE_INT64: np.dtype("<i8"), pb.DTYPE_INT32: np.dtype("<i4"),
          pb.DTYPE_BFLOAT16: np.dtype("<u2")}


class WireError(ValueError):
    """A request body that cannot be decoded or does not make sense; the message says what is wrong.

    ``model_id`` / ``seq_id``: the request's, when it was read that far (None otherwise).
    """

    model_id: str | None = None
    seq_id: int | None = None


@dataclass
class Limits:
    """What one forward/forward_backward request may hold, checked before anything is expanded."""

    max_length: int  # tokens per datum
    max_tokens: int  # tokens per request
    vocab_size: int | None = None  # token ids must be below it
    images: Any = None  # a twinkle_server.images.ImageInputs for a vision-language model, else None


@dataclass
class StepRequest:
    """One forward / forward_backward request, decoded."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    rows: list[dict[str, list[int] | list[float]]] = field(default_factory=list)
    metric: str = "loss:sum"  # the loss metric's name (``loss:mean`` for a loss averaged over sequences)

    @property
    def num_tokens(self) -> int:
        return sum(len(row["input_ids"]) for row in self.rows)


def decode_step_request(body: bytes, limits: Limits | int) -> StepRequest:
    """Parse and check a protobuf ``ForwardBackwardRequest``; every problem is a :class:`WireError`.

    Sizes are checked from the message's byte fields before any array is built: the token count of
    every datum and of the request, and each loss input's declared shape against its datum's tokens
    (a sparse tensor declaring a huge shape is refused, never expanded).
    """
    if isinstance(limits, int):
        limits = Limits(max_length=limits, max_tokens=1 << 62)
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"The body is not a valid protobuf ForwardBackwardRequest ({exc}).") from None
    if not message.model_id:
        raise WireError("ForwardBackwardRequest.model_id is empty.")
    try:
        return _decode_checked(message, limits)
    except WireError as exc:  # the service tells the scheduler this seq_id will not come
        exc.model_id, exc.seq_id = message.model_id, int(message.seq_id)
        raise


def _decode_checked(message: Any, limits: Limits) -> StepRequest:
    """The StepRequest of a parsed message that names its model; a WireError for data that does not fit."""
    if not message.data:
        raise WireError("ForwardBackwardRequest has no data (send at least one Datum).")
    counts = [_token_count(i, datum, limits) for i, datum in enumerate(message.data)]
    if sum(counts) > limits.max_tokens:
        raise WireError(f"this request holds {sum(counts)} tokens; this server takes at most {limits.max_tokens} per "
                        "forward/forward_backward request (server.max_tokens_per_request): send fewer datums per "
                        "call.")
    config: dict[str, float | str] = dict(message.loss_fn_config)
    for key, value in message.loss_fn_config_v2.items():  # v2 wins, as the client's dual-write expects
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    rows = [_decode_datum(i, datum, limits) for i, datum in enumerate(message.data)]
    return StepRequest(message.model_id, int(message.seq_id), message.loss_fn or "cross_entropy", config,
                       bool(message.forward_only), rows)


def _token_count(index: int, datum: Any, limits: Limits) -> int:
    """The datum's input length from its chunks' byte sizes and image headers (no token list built yet)."""
    count = 0
    for k, chunk in enumerate(datum.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind == "image" and limits.images is not None:
            count += _image_tokens(index, k, chunk.image, limits.images)
            continue
        if kind != "encoded_text":
            what = "image chunks need a vision-language base model" if kind == "image" else \
                f"{kind or 'empty'} chunks are not supported by this server"
            raise WireError(f"data[{index}]: {what} (this one takes text tokens: ModelInput.from_ints(...)).")
        size = len(chunk.encoded_text.tokens)
        if size % 4:
            raise WireError(f"data[{index}]: an encoded_text chunk has {size} bytes, not a whole number of int32 "
                            "tokens.")
        count += size // 4
    if not count:
        raise WireError(f"data[{index}] has no input tokens.")
    if count > limits.max_length:
        raise WireError(f"data[{index}] has {count} tokens; this server takes at most {limits.max_length} per datum "
                        "(server.max_length).")
    return count


def _image_tokens(index: int, k: int, image: Any, images: Any) -> int:
    from twinkle_server.images import ImageError

    where = f"data[{index}].model_input.chunks[{k}]"
    try:
        count = images.tokens(image.data, image.format, where)
    except ImageError as exc:
        raise WireError(str(exc)) from None
    if image.expected_tokens and image.expected_tokens != count:
        raise WireError(f"{where}: this image takes {count} tokens for this model (its processor), not "
                        f"expected_tokens={image.expected_tokens}; compute it for this model or leave it unset.")
    return count


def check_token_ids(tokens: np.ndarray, vocab_size: int | None, where: str) -> None:
    """Every id in ``[0, vocab_size)``, else a :class:`WireError` naming ``where`` and the first bad position."""
    if not tokens.size:
        return
    bad = (tokens < 0) if vocab_size is None else ((tokens < 0) | (tokens >= vocab_size))
    if bad.any():
        position = int(np.argmax(bad))
        allowed = "non-negative" if vocab_size is None else f"in 0..{vocab_size - 1} (this model's vocabulary)"
        raise WireError(f"{where}: token {int(tokens[position])} at position {position} is out of range; token ids "
                        f"must be {allowed}.")


def _decode_datum(index: int, datum: Any, limits: Limits) -> dict[str, Any]:
    vocab_size = limits.vocab_size
    pieces, images = [], []
    for k, chunk in enumerate(datum.model_input):
        if chunk.WhichOneof("chunk") == "image":
            count = _image_tokens(index, k, chunk.image, limits.images)
            start = limits.images.vision_start_id
            if start is not None and (not pieces or not pieces[-1].size or int(pieces[-1][-1]) != start):
                raise WireError(f"data[{index}].model_input.chunks[{k}]: an image must follow the vision-start token "
                                f"({start}) in the text before it, as the model's chat template writes it.")
            pieces.append(np.full(count, limits.images.image_token_id, dtype="<i4"))
            images.append(bytes(chunk.image.data))
        else:
            text = np.frombuffer(chunk.encoded_text.tokens, dtype="<i4")
            if limits.images is not None and (text == limits.images.image_token_id).any():
                raise WireError(f"data[{index}].model_input.chunks[{k}] holds the image token "
                                f"({limits.images.image_token_id}) as text; send images as image chunks "
                                "(types.ImageChunk).")
            pieces.append(text)
    tokens = np.concatenate(pieces)
    check_token_ids(tokens, vocab_size, f"data[{index}].model_input")
    length = int(tokens.size)
    row: dict[str, Any] = {"input_ids": tokens.astype(np.int64).tolist()}
    if images:
        row["images"] = images
    for name, tensor in datum.loss_fn_inputs.items():
        if name not in LOSS_INPUTS:
            raise WireError(f"data[{index}].loss_fn_inputs has {name!r}; the built-in losses read "
                            f"{', '.join(LOSS_INPUTS)}.")
        where = f"data[{index}].loss_fn_inputs[{name!r}]"
        values = _tensor_values(tensor, length, where)
        if name == "target_tokens":
            if values.dtype.kind == "f":
                if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
                    raise WireError(f"{where} holds values that are not whole token ids.")
            values = values.astype(np.int64)
            check_token_ids(values, vocab_size, where)
        else:
            values = values.astype(np.float64)
            if not np.all(np.isfinite(values)):
                raise WireError(f"{where} holds NaN or infinite values.")
            if np.abs(values).max(initial=0.0) > VALUE_LIMIT:
                position = int(np.argmax(np.abs(values) > VALUE_LIMIT))
                raise WireError(f"{where}: {values[position]:g} at position {position} is out of range; values must "
                                f"lie in [-{VALUE_LIMIT:g}, {VALUE_LIMIT:g}].")
        row[name] = values.astype(LOSS_INPUTS[name]).tolist()
    return row


def _tensor_values(tensor: Any, length: int, where: str) -> np.ndarray:
    """A client tensor as a flat array of ``length`` values; its declared size is checked before it is built."""
    dtype = _NUMPY.get(tensor.dtype)
    if dtype is None:
        raise WireError(f"{where} has an unsupported dtype ({tensor.dtype}); send float32 or int64.")
    shape = list(tensor.shape)
    if any(d < 0 for d in shape):
        raise WireError(f"{where} declares a negative shape {shape}.")
    declared = int(np.prod(shape, dtype=object)) if shape else None
    if declared is not None and declared != length:
        raise WireError(f"{where} has shape {shape} ({declared} values) for {length} input tokens (one per input "
                        "position).")
    if tensor.HasField("sparse_csr"):
        values = _sparse_values(tensor.sparse_csr, shape, length, dtype, where)
    else:
        data = tensor.dense
        if len(data) % dtype.itemsize or len(data) // dtype.itemsize != length:
            raise WireError(f"{where} has {len(data) // dtype.itemsize} values for {length} input tokens (one per "
                            "input position).")
        values = np.frombuffer(data, dtype=dtype)
    if dtype == np.dtype("<u2"):  # bfloat16: the upper half of a float32
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values


def _sparse_values(csr: Any, shape: list[int], length: int, dtype: np.dtype, where: str) -> np.ndarray:
    rows = shape[0] if len(shape) == 2 else 1
    if len(shape) not in (1, 2) or (len(shape) == 2 and rows != 1):
        raise WireError(f"{where}: a sparse tensor must have shape [{length}] or [1, {length}], not {shape}.")
    if len(csr.values) % dtype.itemsize or len(csr.crow_indices) % 8 or len(csr.col_indices) % 8:
        raise WireError(f"{where}: the sparse tensor's buffers are not whole numbers of values.")
    values = np.frombuffer(csr.values, dtype=dtype)
    crow = np.frombuffer(csr.crow_indices, dtype="<i8")
    cols = np.frombuffer(csr.col_indices, dtype="<i8")
    if (values.size != cols.size or values.size > length or crow.size != rows + 1 or int(crow[0]) != 0
            or int(crow[-1]) != values.size or (cols.size and (cols.min() < 0 or cols.max() >= length))):
        raise WireError(f"{where}: the sparse tensor's indices do not describe {values.size} values in {length} "
                        "positions.")
    dense = np.zeros(length, dtype=dtype)
    dense[cols] = values
    return dense


# --------------------------------------------------------------------------- responses
def forward_backward_output(outputs: Sequence[Mapping[str, Any]], metrics: Mapping[str, float]) -> bytes:
    """``ForwardBackwardOutput`` protobuf: one ArrayRecord holding every datum's 1-D float32 fields."""
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        message.metrics[key] = float(value)
    if outputs:
        record = message.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
        for name in outputs[0]:
            arrays = [np.asarray(out[name], dtype=np.float32).reshape(-1) for out in outputs]
            offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
            record.fields[name].CopyFrom(pb.BatchedTensor(
                data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    return message.SerializeToString()


def forward_backward_json(outputs: Sequence[Mapping[str, Any]], metrics: Mapping[str, float]) -> dict[str, Any]:
    """The same result as JSON (for clients that do not ask for protobuf, e.g. curl)."""
    return {"loss_fn_output_type": "ArrayRecord", "metrics": {k: float(v) for k, v in metrics.items()},
            "loss_fn_outputs": [{name: {"data": np.asarray(v, dtype=np.float32).reshape(-1).tolist(),
                                        "dtype": "float32", "shape": [int(np.asarray(v).size)]}
                                 for name, v in out.items()} for out in outputs]}


@dataclass
class Sampled:
    """One sampled sequence: generated tokens, their logprobs and why generation stopped."""

    tokens: list[int]
    logprobs: list[float] | None
    stop_reason: str  # "stop" | "length"


def sample_response(sequences: Sequence[Sampled], prompt_logprobs: Sequence[float | None] | None) -> bytes:
    """``SampleResponse`` protobuf; missing prompt logprobs (the first token) travel as NaN."""
    message = pb.SampleResponse()
    for seq in sequences:
        item = message.sequences.add(
            stop_reason=pb.STOP_REASON_LENGTH if seq.stop_reason == "length" else pb.STOP_REASON_STOP,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes())
        if seq.logprobs is not None:
            item.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in prompt_logprobs]
        message.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return message.SerializeToString()


def sample_json(sequences: Sequence[Sampled], prompt_logprobs: Sequence[float | None] | None) -> dict[str, Any]:
    return {"type": "sample", "prompt_logprobs": None if prompt_logprobs is None else list(prompt_logprobs),
            "sequences": [{"tokens": s.tokens, "logprobs": s.logprobs, "stop_reason": s.stop_reason}
                          for s in sequences]}
