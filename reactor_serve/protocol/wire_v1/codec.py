"""Wire v1 (docs/protocol.md "Wire v1"): binary protobuf frames on `"control"` and `"data"`.

Decoding is total, like the v0 codec's: whatever the bytes, `decode_control` and
`decode_data` return a request or raise `WireError` (a `ProtocolError`) saying why,
with the frame's `request_id` when it could be read, so that even a frame that does
not parse can be answered with a correlated error instead of leaving its sender
waiting. Command arguments go through the same checks as v0's (`check_arguments`):
a NaN, an infinity, a value nested past MAX_DEPTH is named in a `BAD_REQUEST` error.

Encoding turns the runtime's messages (the v0 envelopes the model session emits) into
v1 frames: `from_envelope` says which channel each goes on, and drops what v1 has no
message for (stats, recording notices, input-latency reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError, Message

from reactor_serve.protocol.channel_codec import (
    MAX_MESSAGE_BYTES,
    ProtocolError,
    brief,
    check_arguments,
)
from reactor_serve.protocol.wire_v1 import (
    common_pb2,
    control_pb2,
    data_pb2,
    model_pb2,
    platform_pb2,
    step_pb2,
    track_pb2,
)
from reactor_serve.runtime.field_errors import (
    RULE_FINITE,
    RULE_SESSION_ENDING,
    Unrepresentable,
    has_lone_surrogate,
)
from reactor_serve.runtime.input_latency import MAX_COMMAND_ID_LENGTH

__all__ = [
    "BAD_REQUEST",
    "CONTROL",
    "DATA",
    "RATE_LIMITED",
    "SESSION_TERMINAL",
    "STEP_FAILURES",
    "STEP_MAX_MESSAGE_BYTES",
    "ControlRequest",
    "DataRequest",
    "WireError",
    "clip_failed",
    "clip_ready",
    "command_accepted",
    "command_arguments",
    "control_error",
    "data_error",
    "decode_control",
    "decode_data",
    "error_code",
    "from_envelope",
    "model_message",
    "model_schema",
    "publish_track_reply",
    "scan_request_id",
    "session_ended",
    "step_arguments",
    "step_failed",
    "step_refused",
    "step_result",
]

CONTROL = "control"
DATA = "data"

# Error codes the official SDK maps to its exception classes (BadRequestError,
# RateLimitedError, ...); any other code reaches the caller as its base ReactorError.
BAD_REQUEST = "BAD_REQUEST"
RATE_LIMITED = "RATE_LIMITED"
SESSION_TERMINAL = "SESSION_TERMINAL"

_REQUEST = common_pb2.MESSAGE_KIND_REQUEST
_RESPONSE = common_pb2.MESSAGE_KIND_RESPONSE
_NOTIFICATION = common_pb2.MESSAGE_KIND_NOTIFICATION

# commandError rules that mean "too much, slow down" rather than "wrong".
_RATE_RULES = frozenset({"rate_limited", "queue_full"})


class WireError(ProtocolError):
    """A v1 frame that cannot be taken: `request_id` is its id when one could be read
    (answer it), None when not (drop it)."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


@dataclass(frozen=True)
class ControlRequest:
    """One decoded `"control"` frame: `method` names its payload (`"ping"`,
    `"request_schema"`, `"publish_track"`, ...); `request_id` is "" on a notification."""

    request_id: str
    method: str
    payload: Message


@dataclass(frozen=True)
class DataRequest:
    """One decoded `"data"` frame: `method` is `"command"`, `"request_step"` or `"error"`."""

    request_id: str
    method: str
    payload: Message


def decode_control(raw: Any) -> ControlRequest:
    message = _parse(raw, control_pb2.ControlClientMessage(), "ControlClientMessage")
    return ControlRequest(*_route(message, "ControlClientMessage"))


def decode_data(raw: Any, step_bytes: int = 0) -> DataRequest:
    """`step_bytes`: how big a `request_step` (whose frames make it big) may be, past
    the MAX_MESSAGE_BYTES every other message keeps to."""
    limit = max(MAX_MESSAGE_BYTES, step_bytes)
    message = _parse(raw, data_pb2.DataClientMessage(), "DataClientMessage", limit)
    request = DataRequest(*_route(message, "DataClientMessage"))
    size = len(raw)
    if size > MAX_MESSAGE_BYTES and request.method != "request_step":
        raise WireError(f"DataClientMessage of {size} bytes exceeds {MAX_MESSAGE_BYTES} bytes",
                        request.request_id or None)
    return request


def _parse(raw: Any, message: Message, what: str, limit: int = MAX_MESSAGE_BYTES) -> Message:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise WireError(f"expected a binary {what}, got {type(raw).__name__}")
    data = bytes(raw)
    if len(data) > limit:
        raise WireError(
            f"{what} of {len(data)} bytes exceeds {limit} bytes",
            scan_request_id(data[:MAX_MESSAGE_BYTES]),
        )
    try:
        message.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError) as exc:
        # Truncated, not protobuf, nested past the parser's limit, or a string that
        # is not UTF-8: the id may still be readable, ahead of the broken part.
        raise WireError(f"not a valid {what}: {exc or type(exc).__name__}", scan_request_id(data)) from None
    return message


def _route(message: Any, what: str) -> tuple[str, str, Message]:
    request_id = message.request_id
    if len(request_id) > MAX_COMMAND_ID_LENGTH:
        raise WireError(
            f"{what}: request_id of {len(request_id)} characters exceeds {MAX_COMMAND_ID_LENGTH}",
            request_id[:MAX_COMMAND_ID_LENGTH],
        )
    method = message.WhichOneof("payload")
    if method is None:
        raise WireError(f"{what} carries no payload this server knows", request_id or None)
    return request_id, method, getattr(message, method)


def scan_request_id(data: bytes) -> str | None:
    """Field 1 (`request_id`) of a top-level message read without parsing the rest,
    for answering a frame that does not parse; None when it cannot be found intact."""
    position, end = 0, len(data)
    try:
        while position < end:
            key, position = _varint(data, position)
            field, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, position = _varint(data, position)
            elif wire_type == 1:
                position += 8
            elif wire_type == 5:
                position += 4
            elif wire_type == 2:
                length, position = _varint(data, position)
                if position + length > end:
                    return None
                if field == 1:
                    text = data[position:position + length].decode("utf-8")
                    if 0 < len(text) <= MAX_COMMAND_ID_LENGTH:
                        return text
                    return None
                position += length
            else:
                return None
    except (IndexError, UnicodeDecodeError):
        return None
    return None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]  # IndexError on a truncated varint
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise IndexError("varint longer than 10 bytes")


# ---- command arguments ------------------------------------------------------------


def command_arguments(command: model_pb2.Command) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of a v1 command, as v0 would have decoded them: raises
    `BadCommand` naming the field for what JSON cannot carry (a NaN, an infinity), or
    nests too deep; `ProtocolError` when it has no name."""
    name = command.type
    if not name:
        raise ProtocolError("command has no type")
    if has_lone_surrogate(name):  # pragma: no cover - protobuf refuses such UTF-8
        raise ProtocolError("command type is not valid Unicode")
    args = _struct_value(command.data) if command.HasField("data") else {}
    for field, upload in command.uploads.items():
        args[field] = {
            "upload_id": upload.upload_id,
            "name": upload.name,
            "mime_type": upload.mime_type,
            "size": upload.size,
        }
    check_arguments(name, args, f"command {brief(name)}")
    return name, args


def _struct_value(struct: struct_pb2.Struct) -> dict[str, Any]:
    return {key: _value(value) for key, value in struct.fields.items()}


def _value(value: struct_pb2.Value) -> Any:
    # Recursive: the protobuf parser has already refused nesting past its own limit,
    # so the depth here is bounded.
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            return Unrepresentable(f"<{number}>", RULE_FINITE)
        return number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return _struct_value(value.struct_value)
    if kind == "list_value":
        return [_value(item) for item in value.list_value.values]
    return None  # null_value, or a Value with no kind set


def _to_struct(data: Any, what: str) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    if data is None:
        return struct
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} must be an object, got {type(data).__name__}")
    try:
        struct.update(data)
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise ProtocolError(f"{what} cannot travel as a protobuf Struct: {exc}") from None
    return struct


# ---- encoding ---------------------------------------------------------------------


def error_code(errors: Any) -> str:
    """The v1 code for a `commandError`'s `errors`: RATE_LIMITED when it was refused
    for coming too fast, SESSION_TERMINAL when its session was ending, BAD_REQUEST
    otherwise."""
    if isinstance(errors, list):
        for error in errors:
            if isinstance(error, dict) and error.get("rule") in _RATE_RULES:
                return RATE_LIMITED
            if isinstance(error, dict) and error.get("rule") == RULE_SESSION_ENDING:
                return SESSION_TERMINAL
    return BAD_REQUEST


def data_error(request_id: str, code: str, message: str) -> bytes:
    return data_pb2.DataServerMessage(
        request_id=request_id, kind=_RESPONSE,
        error=common_pb2.Error(code=code, message=_text(message)),
    ).SerializeToString()


def control_error(request_id: str, code: str, message: str) -> bytes:
    return control_pb2.ControlServerMessage(
        request_id=request_id, kind=_RESPONSE,
        error=common_pb2.Error(code=code, message=_text(message)),
    ).SerializeToString()


def command_accepted(request_id: str) -> bytes:
    """The bodyless answer to a command taken: no payload at all."""
    return data_pb2.DataServerMessage(request_id=request_id, kind=_RESPONSE).SerializeToString()


def model_schema(request_id: str, document: dict[str, Any]) -> bytes:
    message = control_pb2.ControlServerMessage(request_id=request_id, kind=_RESPONSE)
    message.model_schema.openapi.CopyFrom(_to_struct(document, "the model schema"))
    return message.SerializeToString()


def publish_track_reply(request_id: str, name: str) -> bytes:
    return control_pb2.ControlServerMessage(
        request_id=request_id, kind=_RESPONSE,
        publish_track=track_pb2.PublishTrackResponse(name=name),
    ).SerializeToString()


def clip_ready(
    request_id: str, *, session_id: str, kind: str, start_marker: float, end_marker: float,
    now_marker: float, predicted_ready_at_ms: int, playlist_url: str,
) -> bytes:
    return control_pb2.ControlServerMessage(
        request_id=request_id, kind=_RESPONSE,
        clip_ready=platform_pb2.ClipReady(
            session_id=session_id, kind=kind, start_marker=start_marker, end_marker=end_marker,
            now_marker=now_marker, predicted_ready_at_ms=predicted_ready_at_ms,
            playlist_url=playlist_url,
        ),
    ).SerializeToString()


def clip_failed(request_id: str, reason: str) -> bytes:
    return control_pb2.ControlServerMessage(
        request_id=request_id, kind=_RESPONSE,
        clip_failed=platform_pb2.ClipFailed(reason=_text(reason)),
    ).SerializeToString()


# A step's failure (runtime/stepping.py StepFailure) as the wire's code.
STEP_FAILURES = {
    "refused": step_pb2.STEP_FAILURE_CODE_REFUSED,
    "not_ready": step_pb2.STEP_FAILURE_CODE_NOT_READY,
    "failed": step_pb2.STEP_FAILURE_CODE_FAILED,
    "result_too_large": step_pb2.STEP_FAILURE_CODE_RESULT_TOO_LARGE,
    "command_failed": step_pb2.STEP_FAILURE_CODE_COMMAND_FAILED,
    "session_ended": step_pb2.STEP_FAILURE_CODE_SESSION_ENDED,
}


# The most a step request may weigh on a chunked connection: its input frames.
STEP_MAX_MESSAGE_BYTES = 32 * 1024 * 1024


def step_arguments(request: step_pb2.RequestStep) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """(state, [(command, arguments)]) of a step, decoded as commands are: raises
    `BadCommand` naming the field for what JSON cannot carry, `ProtocolError` for a
    command with no name."""
    state = _struct_value(request.state) if request.HasField("state") else {}
    check_arguments("step", state, "the step's state")
    return state, [command_arguments(command) for command in request.commands]


def step_failed(
    request_id: str, failure: str, message: str, entry: str | None = None, step: int = 0
) -> bytes:
    """A `step_result` saying why the step did not produce."""
    result = step_pb2.StepResult(
        step=step, error=_text(message), failure_code=STEP_FAILURES[failure],
    )
    if entry:
        result.entry = _text(entry)
    return data_pb2.DataServerMessage(
        request_id=request_id, kind=_RESPONSE, step_result=result,
    ).SerializeToString()


def step_result(
    request_id: str, step: int, tracks: list[step_pb2.TrackFrames], elapsed_s: float
) -> bytes:
    return data_pb2.DataServerMessage(
        request_id=request_id, kind=_RESPONSE,
        step_result=step_pb2.StepResult(step=step, tracks=tracks, elapsed_seconds=elapsed_s),
    ).SerializeToString()


def step_refused(request_id: str, message: str) -> bytes:
    """A `step_result` refusing a step that did not run."""
    return step_failed(request_id, "refused", message)


def session_ended(reason: str) -> bytes:
    return control_pb2.ControlServerMessage(
        kind=_NOTIFICATION, session_ended=platform_pb2.SessionEnded(reason=_text(reason)),
    ).SerializeToString()


def model_message(type_: str, data: Any) -> bytes:
    return data_pb2.DataServerMessage(
        kind=_NOTIFICATION,
        message=model_pb2.ModelMessage(type=_text(type_), data=_to_struct(data, f"message {type_!r}")),
    ).SerializeToString()


def from_envelope(envelope: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The v1 frames, with their channel, for one message the model session emits (a
    v0 envelope): none for what v1 has no message for. Raises ProtocolError for data
    a Struct cannot carry."""
    inner = envelope.get("data")
    if not isinstance(inner, dict):
        raise ProtocolError("envelope without data")
    if envelope.get("scope") != "runtime":
        return [(DATA, model_message(str(inner.get("type", "")), inner.get("data")))]
    type_, data = inner.get("type"), inner.get("data") or {}
    request_id = data.get("id")
    if type_ == "commandError":
        if not isinstance(request_id, str) or not request_id:
            return []  # a command sent without an id: nobody is waiting for the answer
        return [(DATA, data_error(request_id, error_code(data.get("errors")), data.get("message", "")))]
    if type_ == "commandAccepted":
        if not isinstance(request_id, str) or not request_id:
            return []
        return [(DATA, command_accepted(request_id))]
    if type_ == "sessionEnded":
        reason = str(data.get("reason", ""))
        if data.get("message"):
            reason = f"{reason}: {data['message']}"
        return [(CONTROL, session_ended(reason))]
    return []


def _text(value: Any) -> str:
    # A protobuf string must be valid UTF-8: a lone surrogate from a client's own text,
    # echoed in an error, is escaped rather than failing the whole reply.
    text = value if isinstance(value, str) else str(value)
    if has_lone_surrogate(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
