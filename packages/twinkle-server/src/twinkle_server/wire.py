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
from tinker.proto.response_conv import _tensor_data_from_proto

PROTO = "application/x-protobuf"
#: Per-token loss inputs the server passes to the losses, with their dtype; others are refused.
LOSS_INPUTS = {"target_tokens": np.int64, "weights": np.float32, "logprobs": np.float32, "advantages": np.float32}


class WireError(ValueError):
    """A request body that cannot be decoded or does not make sense; the message says what is wrong."""


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


def decode_step_request(body: bytes, max_length: int) -> StepRequest:
    """Parse and check a protobuf ``ForwardBackwardRequest``; every problem is a :class:`WireError`."""
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"The body is not a valid protobuf ForwardBackwardRequest ({exc}).") from None
    if not message.model_id:
        raise WireError("ForwardBackwardRequest.model_id is empty.")
    if not message.data:
        raise WireError("ForwardBackwardRequest has no data (send at least one Datum).")
    config: dict[str, float | str] = dict(message.loss_fn_config)
    for key, value in message.loss_fn_config_v2.items():  # v2 wins, as the client's dual-write expects
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    rows = [_decode_datum(i, datum, max_length) for i, datum in enumerate(message.data)]
    return StepRequest(message.model_id, int(message.seq_id), message.loss_fn or "cross_entropy", config,
                       bool(message.forward_only), rows)


def _decode_datum(index: int, datum: Any, max_length: int) -> dict[str, Any]:
    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"data[{index}]: {kind or 'empty'} chunks are not supported by this server (text "
                            "tokens only: ModelInput.from_ints(...)).")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    if not tokens:
        raise WireError(f"data[{index}] has no input tokens.")
    if len(tokens) > max_length:
        raise WireError(f"data[{index}] has {len(tokens)} tokens; this server takes at most {max_length} per datum "
                        "(server.max_length).")
    row: dict[str, Any] = {"input_ids": tokens}
    for name, tensor in datum.loss_fn_inputs.items():
        if name not in LOSS_INPUTS:
            raise WireError(f"data[{index}].loss_fn_inputs has {name!r}; the built-in losses read "
                            f"{', '.join(LOSS_INPUTS)}.")
        try:
            values = _tensor_data_from_proto(tensor).to_numpy()
        except Exception as exc:  # malformed bytes/shape/dtype in a client tensor
            raise WireError(f"data[{index}].loss_fn_inputs[{name!r}] is not a valid tensor ({exc}).") from None
        values = np.asarray(values).reshape(-1)
        if values.shape[0] != len(tokens):
            raise WireError(f"data[{index}].loss_fn_inputs[{name!r}] has {values.shape[0]} values for "
                            f"{len(tokens)} input tokens (one per input position).")
        if not np.all(np.isfinite(values)):
            raise WireError(f"data[{index}].loss_fn_inputs[{name!r}] holds NaN or infinite values.")
        row[name] = values.astype(LOSS_INPUTS[name]).tolist()
    return row


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
