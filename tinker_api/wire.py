"""The SDK's protobuf bodies: a forward_backward request in, its output and a sample response out.

The SDK sends `forward_backward` as `application/x-protobuf` and reads `ForwardBackwardOutput` and
`SampleResponse` only as protobuf; these are the inverses of its `tinker/proto/*_conv.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

_NP = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class WireError(ValueError):
    """A request body the server cannot read (the SDK shows the message)."""


@dataclass
class Datum:
    """One example: the input tokens and its named per-token loss inputs (flat arrays)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class FwdBwd:
    model_id: str
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def _tensor(msg: pb.Tensor, name: str) -> np.ndarray:
    dtype = _NP.get(msg.dtype)
    if dtype is None or msg.HasField("sparse_csr"):
        raise WireError(f"loss_fn_inputs[{name!r}]: only dense float32/int64 tensors are supported")
    return np.frombuffer(msg.dense, dtype=dtype).copy()


def parse_forward_backward(body: bytes) -> FwdBwd:
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # noqa: BLE001 - any decode failure is the client's
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest ({exc})") from exc
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise WireError(f"datum {i}: only encoded text chunks are supported (no images or audio)")
            tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
        data.append(Datum(tokens, {k: _tensor(v, k) for k, v in d.loss_fn_inputs.items()}))
    return FwdBwd(msg.model_id, msg.loss_fn, config, bool(msg.forward_only), data)


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """One ArrayRecord holding every datum's float32 per-token arrays, and the metrics."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    msg.metrics.update({k: float(v) for k, v in metrics.items()})
    record = msg.loss_fn_outputs.add(num_datums=len(outputs))
    for name in outputs[0] if outputs else ():
        arrays = [np.asarray(o[name], dtype=np.float32).reshape(-1) for o in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        bt = record.fields[name]
        bt.dtype = pb.DTYPE_FLOAT32
        bt.data = b"".join(a.tobytes() for a in arrays)
        bt.offsets = offsets.tobytes()
    return msg.SerializeToString()


def sample_response(sequences: list[tuple[list[int], list[float], str]]) -> bytes:
    """`(tokens, logprobs, stop_reason)` per sample; stop_reason is "stop" or "length"."""
    msg = pb.SampleResponse()
    for tokens, logprobs, reason in sequences:
        seq = msg.sequences.add()
        seq.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
        seq.stop_reason = pb.STOP_REASON_STOP if reason == "stop" else pb.STOP_REASON_LENGTH
    return msg.SerializeToString()
